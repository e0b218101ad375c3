#!/usr/bin/env bash
# The README's main job: bring up the emulated Slurm cluster (8 hosts) with mpi_greedy.so
# freshly built and installed on its PluginDir, and run an MPI job with srun --mpi=greedy, with
# Open MPI (served PMIx) and with MPICH (served PMI-1); each rank checks size and an allreduce.
# Run as root (the cluster is network namespaces); about 30 s after the first build. Waits
# for a cluster another test has up, and takes down only its own.
set -euo pipefail
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
need_root

build --release -p greedy-slurm-mpi
PLUGDIR=$CARGO_TARGET_DIR/mpi-plugindir
BINDIR=$CARGO_TARGET_DIR/mpi-test
mkdir -p "$PLUGDIR" "$BINDIR"
cp "$BIN/libmpi_greedy.so" "$PLUGDIR/mpi_greedy.so.new"
mv "$PLUGDIR/mpi_greedy.so.new" "$PLUGDIR/mpi_greedy.so"
. "$ROOT/tests/mpi/mpich5.sh"
mpicc.openmpi -O1 -o "$BINDIR/wireup-ompi" "$ROOT/tests/mpi/wireup.c"
"$MPICH5/bin/mpicc" -O1 -o "$BINDIR/wireup-mpich" "$ROOT/tests/mpi/wireup.c"

cluster_up --nodes 8 --slurm --plugindir "$PLUGDIR" --mpi-default greedy
eval "$("$TC" env)"
cd "$GREEDY_TC_SCRATCH"
set -x
srun --mpi=list
time srun -N8 -n16 --ntasks-per-node=2 --mpi=greedy env EXPECT_SIZE=16 "$BINDIR/wireup-ompi"
time srun -N8 -n16 --ntasks-per-node=2 --mpi=greedy env EXPECT_SIZE=16 "$BINDIR/wireup-mpich"
