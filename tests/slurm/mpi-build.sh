# Sourced by the Slurm MPI tests (mpi.sh, soak.sh): builds mpi_greedy.so (release) into
# $PLUGDIR, and tests/mpi/wireup.c for both MPIs: $WIREUP (PyPI MPICH 5, PMI-1) and $OMPI
# (Debian Open MPI 4.1, PMIx), in $BINDIR. Needs $ROOT, $CARGO_TARGET_DIR and a fail function.
cargo build -q --release -p greedy-slurm-mpi
PLUGDIR=$CARGO_TARGET_DIR/mpi-plugindir
mkdir -p "$PLUGDIR"
cp "$CARGO_TARGET_DIR/release/libmpi_greedy.so" "$PLUGDIR/mpi_greedy.so.new"
mv "$PLUGDIR/mpi_greedy.so.new" "$PLUGDIR/mpi_greedy.so"
. "$ROOT/tests/mpi/mpich5.sh"
BINDIR=$CARGO_TARGET_DIR/mpi-test
mkdir -p "$BINDIR"
"$MPICH5/bin/mpicc" -O1 -o "$BINDIR/wireup" "$ROOT/tests/mpi/wireup.c"
mpicc.openmpi -O1 -o "$BINDIR/wireup-ompi" "$ROOT/tests/mpi/wireup.c"
WIREUP=$BINDIR/wireup
OMPI=$BINDIR/wireup-ompi
