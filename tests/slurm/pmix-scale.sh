#!/usr/bin/env bash
# A PMIx job on N Slurm nodes (default 600) under `srun --mpi=greedy` (issue 19): the emulated
# cluster with N slurmd, and one rank per node of tests/mpi/pmix_maps, the libpmix client that
# checks the node and process maps mpi_greedy.so registered (PMIx_Resolve_nodes/_peers against
# PMIX_LOCAL_SIZE; past ~500 hosts the maps are PMIX_REGEX blobs on PMIx 7), fences with data
# and reads the key of the rank farthest from it. Passes when every rank reports once, srun
# exits 0 and no step is left. First an `srun -NN hostname`, so a cluster that cannot run a
# plain step is told apart from a failing plugin.
#
# All N hosts share this machine's 2 cores: the times printed are the CPU's (about 0.2 CPU-s
# per node for the PMIx job), not the tree's. About 3 min at 600 nodes, most of it `up`.
# usage: tests/slurm/pmix-scale.sh [--nodes N]   (root)
set -euo pipefail

TAG=slurm-pmix-scale
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
nodes=600
while (($#)); do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    *) echo "usage: $0 [--nodes N]" >&2; exit 2 ;;
  esac
done
need_root

cd "$ROOT"
# shellcheck source=mpi-build.sh
. "$ROOT/tests/slurm/mpi-build.sh"
. "$ROOT/tests/mpi/pmix_maps.sh"
cluster_up --nodes "$nodes" --slurm --plugindir "$PLUGDIR"
eval "$("$TC" env)"
W=$GREEDY_TC_SCRATCH/pmix-scale
mkdir -p "$W"
cd "$W"
# shellcheck disable=SC2046 # pkg-config's words are separate flags
gcc -O1 -o pmix_maps "$ROOT/tests/mpi/pmix_maps.c" $(pkg-config --cflags --libs pmix) ||
  fail "building pmix_maps"

t0=$(ms)
timeout 300 srun -N"$nodes" hostname >hostname.out 2>hostname.err ||
  fail "srun -N$nodes hostname: $(tail -3 hostname.err)"
got=$(sort -u hostname.out | wc -l)
((got == nodes)) || fail "srun -N$nodes hostname: $got distinct hosts answered"
echo "slurm-pmix-scale: srun -N$nodes hostname in $(($(ms) - t0)) ms"

wait_idle
t0=$(ms)
rc=0
timeout 600 srun -N"$nodes" --mpi=greedy ./pmix_maps "$nodes" >out 2>err || rc=$?
t1=$(ms)
((rc == 0)) || fail "srun --mpi=greedy exited $rc: $(grep -v '^maps ' out err | head -5)"
bad=$(pmix_maps_verdict out "$nodes" "$nodes")
[[ -z $bad ]] || fail "$bad"
[[ ! -s err ]] || fail "srun's stderr is not empty: $(head -3 err)"
# srun returns once its tasks ended; slurmctld drops the step when its 600 nodes have each
# reported the step complete, which takes seconds on these 2 cores.
for ((i = 0; i < 600; i++)); do
  left=$(squeue -h -s | grep -v '\.extern' || true)
  [[ -z $left ]] && break
  sleep 0.1
done
[[ -z $left ]] || fail "steps left 60 s after srun ended: $left"
echo "slurm-pmix-scale: PASS: $nodes nodes x 1 rank under srun --mpi=greedy in $((t1 - t0)) ms"
