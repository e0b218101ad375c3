#!/bin/bash
# MPI_Comm_spawn's latency under srun, mpi/greedy against Slurm's own mpi/pmi2, in one sitting,
# on the emulated cluster of the machine's release (22.05). Both start the children as a nested
# srun of the job (pmi2: src/plugins/mpi/pmi2/spawn.c; greedy: plugin/mpi/src/nested.rs). One
# parent rank (PyPI MPICH 5.0.2, PMI-1, which Slurm's pmi2 plugin serves too; its step takes
# one CPU, --exact) in a 5-node allocation of 20 CPUs spawns N children from MPI_COMM_SELF
# (tests/mpi/spawn_latency.c: from the call to its return, which waits until every child has
# finished MPI_Init and connected back), 4 spawns per job of which the last 3 count, the
# plugins alternating job by job. Prints one row per N: each plugin's median spawn and the
# ratio. A pmi2 job that does not end within 60 s is shown as "no spawn": pmi2's nested srun
# has no --overlap and asks for every node of the job (SLURM_JOB_NUM_NODES) with its memory,
# the parent's node included, so with more children than free nodes it waits forever
# ("Requested nodes are busy").
# Then Open MPI (Debian's 4.1, PMIx, over ob1 with self,vader,tcp as tests/mpi/spawn-bench.sh;
# left to choose, each child probes UCX first, 200 ms a spawn), the same program and jobs: mpi/greedy against Slurm's own
# mpi/pmix, which serves no spawn (its jobs are shown as "refused" when the program's spawn
# fails): greedy's children run on the parent step's node, served by its stepd
# (plugin/mpi/src/attach.rs), so more children than that node's CPUs do not fit (the program
# gets MPI_ERR_SPAWN; shown as "no room").
# usage: tests/slurm/spawn-bench.sh [JOBS] [N...]   (default 3 jobs, N = 1 4 16)
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
TAG=spawn-bench-srun
jobs=${1:-3}
shift || true
sizes=("${@:-1 4 16}")
read -r -a sizes <<<"${sizes[*]}"
need_shared_target
need_root
RELEASE="" RELEASE_ROOT=""
. "$ROOT/tests/slurm/mpi-build.sh"
. "$ROOT/tests/mpi/mpich5.sh"
EXE=$BINDIR/spawn-latency-mpich5
"$MPICH5/bin/mpicc" -O1 -o "$EXE" "$ROOT/tests/mpi/spawn_latency.c" || fail "PyPI MPICH's mpicc"
build_mpi_prog "$ROOT/tests/mpi/spawn_latency.c" spawn-latency

cluster_up --nodes 5 --slurm --plugindir "$PLUGDIR"
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/spawn-bench
mkdir -p "$WORK"
cd "$WORK"

# job PLUGIN N [EXE]: one job of 4 spawns; appends its rounds after the first to
# $WORK/PLUGIN-N. A pmi2 job that does not end within 60 s is left out (above), as is a pmix job
# whose spawn fails; greedy's must end.
job() {
  local plugin=$1 n=$2 exe=${3:-$EXE} out rc=0
  out=$(timeout 60 salloc -Q -N5 -n20 srun --exact -n1 --mpi="$plugin" "$exe" "$n" 4 2>&1) || rc=$?
  if { ((rc == 124)) && [[ $plugin == pmi2 ]]; } ||
    { [[ $plugin == pmix ]] && grep -q "^spawn $n round 1 failed" <<<"$out"; } ||
    { [[ $exe != "$EXE" ]] && grep -q "More processors requested than permitted" <<<"$out"; }; then
    return
  fi
  ((rc == 0)) || fail "$plugin N=$n: exit $rc ($out)"
  grep -E "^spawn $n round [2-4] took" <<<"$out" | awk '{print $6}' >>"$WORK/$plugin-$n"
  [[ $(grep -c "^spawn $n round [1-4] took" <<<"$out") == 4 ]] || fail "$plugin N=$n: $out"
}
median_ms() {
  [[ -s $1 ]] || { echo "no spawn"; return; }
  sort -g "$1" | awk '{v[NR] = $1} END { printf "%.1f", v[int((NR + 1) / 2)] * 1000 }'
}

echo "| N | mpi/greedy (ms) | mpi/pmi2 (ms) | greedy / pmi2 |"
echo "|---|---|---|---|"
for n in "${sizes[@]}"; do
  rm -f "$WORK/greedy-$n" "$WORK/pmi2-$n"
  for _ in $(seq "$jobs"); do
    job greedy "$n"
    job pmi2 "$n"
  done
  g=$(median_ms "$WORK/greedy-$n") p=$(median_ms "$WORK/pmi2-$n")
  echo "| $n | $g | $p | $(awk -v g="$g" -v p="$p" 'BEGIN { if (p + 0 > 0) printf "%.2fx", g / p; else print "—" }') |"
done

export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
echo
echo "| N | Open MPI, mpi/greedy (ms) | Open MPI, mpi/pmix (ms) |"
echo "|---|---|---|"
for n in "${sizes[@]}"; do
  rm -f "$WORK/greedy-$n" "$WORK/pmix-$n"
  for _ in $(seq "$jobs"); do
    job greedy "$n" "$BINDIR/spawn-latency-ompi"
    job pmix "$n" "$BINDIR/spawn-latency-ompi"
  done
  g=$(median_ms "$WORK/greedy-$n") p=$(median_ms "$WORK/pmix-$n")
  echo "| $n | ${g/no spawn/no room} | ${p/no spawn/refused} |"
done
