# Sourced by the tests and benchmarks that run MPICH across the emulated hosts: sets MPICH5 to
# a venv holding PyPI's mpich 5.0.2 (Debian's 4.0.2 hangs in MPI_Finalize between namespaces,
# research/slurm-testcluster.md), default /var/tmp/greedy-mpich5 (/var/tmp is visible to every
# emulated host, /tmp is not), and installs it on first use.
MPICH5=${GREEDY_MPICH5:-/var/tmp/greedy-mpich5}
if [[ ! -x $MPICH5/bin/mpicc ]]; then
  echo "${0##*/}: installing PyPI mpich 5.0.2 into $MPICH5"
  python3 -m venv "$MPICH5"
  "$MPICH5/bin/pip" install -q mpich==5.0.2
fi
