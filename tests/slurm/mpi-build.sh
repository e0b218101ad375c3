# Sourced by the Slurm MPI tests (mpi.sh, soak.sh, mpi-bench.sh, pmix-scale.sh, packaging/deb.sh,
# launcher/ompi-scale.sh): builds mpi_greedy.so (release) into $PLUGDIR, and
# tests/mpi/wireup.c for both MPIs: $WIREUP (PMI-1) and $OMPI (PMIx), and the PMIx locality
# client $LOCALITY, in $BINDIR; build_mpi_prog builds another program the same way.
# Needs tests/lib.sh.
#
# The machine's Slurm: the plugin from the workspace build, PyPI MPICH 5 and Debian's Open MPI
# 4.1. With $RELEASE_ROOT (a Slurm root of slurm-conf/release-root, release $RELEASE): the
# plugin built against that root's Slurm and libpmix (in $CARGO_TARGET_DIR/slurm-$RELEASE),
# and the program built with that root's own MPICH and Open MPI, as a site on it would.
if [[ -n ${RELEASE_ROOT:-} ]]; then
  build --slurm "$RELEASE" --release -p greedy-slurm-mpi
  PLUGDIR=$CARGO_TARGET_DIR/mpi-plugindir-$RELEASE
  BINDIR=$CARGO_TARGET_DIR/mpi-test-$RELEASE
else
  build --release -p greedy-slurm-mpi
  PLUGDIR=$CARGO_TARGET_DIR/mpi-plugindir
  BINDIR=$CARGO_TARGET_DIR/mpi-test
fi
PLUGIN=$BIN/libmpi_greedy.so
mkdir -p "$PLUGDIR" "$BINDIR"
cp "$PLUGIN" "$PLUGDIR/mpi_greedy.so.new"
mv "$PLUGDIR/mpi_greedy.so.new" "$PLUGDIR/mpi_greedy.so"
# build_mpi_prog SRC NAME: $BINDIR/NAME with MPICH, $BINDIR/NAME-ompi with Open MPI.
if [[ -n ${RELEASE_ROOT:-} ]]; then
  in_root() { "$ROOT/slurm-conf/release-chroot" "$RELEASE_ROOT" "$ROOT" "$BINDIR" -- "$@"; }
  build_mpi_prog() {
    in_root mpicc.mpich -O1 -o "$BINDIR/$2" "$1" || fail "mpicc.mpich in the $RELEASE root"
    in_root mpicc.openmpi -O1 -o "$BINDIR/$2-ompi" "$1" || fail "mpicc.openmpi in the $RELEASE root"
  }
else
  . "$ROOT/tests/mpi/mpich5.sh"
  build_mpi_prog() {
    "$MPICH5/bin/mpicc" -O1 -o "$BINDIR/$2" "$1" || fail "PyPI MPICH's mpicc"
    mpicc.openmpi -O1 -o "$BINDIR/$2-ompi" "$1" || fail "mpicc.openmpi"
  }
fi
build_mpi_prog "$ROOT/tests/mpi/wireup.c" wireup
WIREUP=$BINDIR/wireup
OMPI=$BINDIR/wireup-ompi
# libpmix's own client printing the locality it was told (tests/mpi/locality.c), built against
# the release's libpmix (Debian's private copy in the roots, which have no pkg-config).
LOCALITY=$BINDIR/locality
if [[ -n ${RELEASE_ROOT:-} ]]; then
  pmix2=/usr/lib/x86_64-linux-gnu/pmix2
  in_root gcc -O1 -I"$pmix2/include" -o "$LOCALITY" "$ROOT/tests/mpi/locality.c" \
    -L"$pmix2/lib" -Wl,-rpath,"$pmix2/lib" -lpmix || fail "gcc in the $RELEASE root (locality.c)"
else
  # shellcheck disable=SC2046 # pkg-config's words are separate flags
  gcc -O1 -o "$LOCALITY" "$ROOT/tests/mpi/locality.c" $(pkg-config --cflags --libs pmix) ||
    fail "gcc (locality.c)"
fi
