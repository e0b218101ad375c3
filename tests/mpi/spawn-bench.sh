#!/usr/bin/env bash
# MPI_Comm_spawn's latency under greedyrun against each library's own launcher, in one sitting:
# Open MPI 5 (PyPI wheel) under greedyrun vs its prterun, MPICH 5 (PyPI wheel) under greedyrun vs
# its Hydra mpiexec. One parent rank on one loopback pseudo-host spawns N children
# (tests/mpi/spawn_latency.c: from the call to its return, which waits until every child has
# finished MPI_Init and connected back), 4 spawns per job, the launchers alternating job by job;
# both may oversubscribe (a round's children may still be ending when the next spawns). Prints
# one row per (library, N): the median spawn of each launcher over all rounds after
# each job's first, and their ratio.
# usage: tests/mpi/spawn-bench.sh [JOBS] [N...]   (default 3 jobs, N = 1 16 64)
set -euo pipefail

TAG="spawn-bench"
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$ROOT/tests/mpi/clients.sh"
. "$ROOT/tests/launcher/loopback.sh"

jobs=${1:-3}
shift || true
sizes=("${@:-1 16 64}")
read -r -a sizes <<<"${sizes[*]}"
loopback_bench spawn-bench
G=$BIN
MPICH5=${GREEDY_MPICH5:-/var/tmp/greedy-mpich5}
"$MPICH5/bin/mpicc" -O1 -o "$work/sl-mpich5" "$ROOT/tests/mpi/spawn_latency.c"
OPAL_PREFIX=$OMPI5 "$OMPI5/bin/mpicc" -O1 -o "$work/sl-ompi5" "$ROOT/tests/mpi/spawn_latency.c"
ompi=(OPAL_PREFIX="$OMPI5" OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo)

# job LAUNCHER LIB N: one job of ROUNDS spawns; appends its rounds after the first to $work/LAUNCHER-LIB-N.
job() {
  local launcher=$1 lib=$2 n=$3 exe=$work/sl-$2 out
  local -a cmd
  case $launcher-$lib in
    greedy-ompi5) cmd=(env "${ompi[@]}" "$G" --rsh "$work/localsh" -H "$(loopback_hosts 1 $((n + 1)))" --progress 0 --pmi pmix --oversubscribe -n 1 "$exe") ;;
    greedy-mpich5) cmd=("$G" --rsh "$work/localsh" -H "$(loopback_hosts 1 $((n + 1)))" --progress 0 --oversubscribe -n 1 "$exe") ;;
    native-ompi5) cmd=(env "${ompi[@]}" "$OMPI5/bin/prterun" --allow-run-as-root --map-by :oversubscribe -n 1 "$exe") ;;
    native-mpich5) cmd=("$MPICH5/bin/mpiexec" -n 1 "$exe") ;;
  esac
  out=$(timeout 300 "${cmd[@]}" "$n" 4) || fail "$launcher $lib N=$n: exit $? ($out)"
  awk '/round [2-9] took/ {print $(NF-1)}' <<<"$out" >>"$work/$launcher-$lib-$n"
}
median() { sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

for lib in ompi5 mpich5; do
  for n in "${sizes[@]}"; do
    for ((j = 0; j < jobs; j++)); do
      if ((j % 2)); then job native "$lib" "$n"; job greedy "$lib" "$n"; else job greedy "$lib" "$n"; job native "$lib" "$n"; fi
    done
  done
done
native_name() { [[ $1 == ompi5 ]] && echo prterun || echo "Hydra mpiexec"; }
echo "| library | children | greedyrun: median s (rounds) | own launcher | its median s | greedy / it |"
echo "|---|---|---|---|---|---|"
for lib in ompi5 mpich5; do
  for n in "${sizes[@]}"; do
    g=$(median "$work/greedy-$lib-$n") o=$(median "$work/native-$lib-$n")
    printf '| %s | %s | %.3f (%s) | %s | %.3f | %.2f |\n' "$lib" "$n" "$g" "$(wc -l <"$work/greedy-$lib-$n")" \
      "$(native_name "$lib")" "$o" "$(awk -v a="$g" -v b="$o" 'BEGIN {print a / b}')"
  done
done
