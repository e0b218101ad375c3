#!/usr/bin/env bash
# MPI_Comm_spawn's latency under greedyrun against each library's own launcher, in one sitting:
# Open MPI 5 (PyPI wheel) under greedyrun vs its prterun, MPICH 5 (PyPI wheel) under greedyrun vs
# its Hydra mpiexec; and the persistent runners: greedyrun on a session (started once, with
# 65 slots on the pseudo-host) for both, vs PRRTE's DVM (`prte` started once, each job
# `prterun --dvm`, tests/launcher/prrte-dvm-fix.c preloaded as session-bench.sh does) for Open
# MPI (whose prterun, on a DVM, spells --map-by as --mapby). One parent rank on one loopback
# pseudo-host spawns N children
# (tests/mpi/spawn_latency.c: from the call to its return, which waits until every child has
# finished MPI_Init and connected back), 4 spawns per job, the launchers alternating job by job;
# both may oversubscribe (a round's children may still be ending when the next spawns). Prints
# one row per (library, N, persistent or not): the median spawn of greedy's and the other
# launcher over all rounds after each job's first, and their ratio.
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
cc -shared -fPIC -O2 -o "$work/prrte-dvm-fix.so" "$ROOT/tests/launcher/prrte-dvm-fix.c" -ldl
export PRTE_ALLOW_RUN_AS_ROOT=1 PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The persistent runners, started once: a session of greedy's, PRRTE's DVM.
session=$("$G" --rsh "$work/localsh" -H "$(loopback_hosts 1 65)" --start-session | sed -n 's/^export GREEDY_SESSION=//p')
[[ -S $session ]] || fail "no session"
PRTE_PREFIX=$OMPI5 OPAL_PREFIX=$OMPI5 "$OMPI5/bin/prte" --allow-run-as-root --report-uri "$work/dvm.uri" \
  </dev/null >"$work/dvm.log" 2>&1 &
dvm_pid=$!
# loopback_cleanup ends $session.
trap 'kill $dvm_pid 2>/dev/null || true; loopback_cleanup' EXIT
for ((t = 0; t < 600; t++)); do
  grep -q "DVM ready" "$work/dvm.log" && break
  kill -0 "$dvm_pid" 2>/dev/null || fail "prte exited: $(tail -3 "$work/dvm.log")"
  sleep 0.1
done
[[ -s $work/dvm.uri ]] || fail "prte not ready after 60 s: $(tail -3 "$work/dvm.log")"

# job LAUNCHER LIB N: one job of ROUNDS spawns; appends its rounds after the first to $work/LAUNCHER-LIB-N.
job() {
  local launcher=$1 lib=$2 n=$3 exe=$work/sl-$2 out
  local -a cmd
  case $launcher-$lib in
    greedy-ompi5) cmd=(env "${ompi[@]}" "$G" --rsh "$work/localsh" -H "$(loopback_hosts 1 $((n + 1)))" --progress 0 --pmi pmix --oversubscribe -n 1 "$exe") ;;
    greedy-mpich5) cmd=("$G" --rsh "$work/localsh" -H "$(loopback_hosts 1 $((n + 1)))" --progress 0 --oversubscribe -n 1 "$exe") ;;
    native-ompi5) cmd=(env "${ompi[@]}" "$OMPI5/bin/prterun" --allow-run-as-root --map-by :oversubscribe -n 1 "$exe") ;;
    native-mpich5) cmd=("$MPICH5/bin/mpiexec" -n 1 "$exe") ;;
    session-ompi5) cmd=(env "${ompi[@]}" GREEDY_SESSION="$session" "$G" --progress 0 --pmi pmix --oversubscribe -n 1 "$exe") ;;
    session-mpich5) cmd=(env GREEDY_SESSION="$session" "$G" --progress 0 --oversubscribe -n 1 "$exe") ;;
    dvm-ompi5) cmd=(env "${ompi[@]}" LD_PRELOAD="$work/prrte-dvm-fix.so" PRTE_PREFIX="$OMPI5" "$OMPI5/bin/prterun" --dvm "file:$work/dvm.uri" --mapby :oversubscribe -n 1 "$exe") ;;
  esac
  out=$(timeout 300 "${cmd[@]}" "$n" 4 </dev/null) || fail "$launcher $lib N=$n: exit $? ($out)"
  awk '/round [2-9] took/ {print $(NF-1)}' <<<"$out" >>"$work/$launcher-$lib-$n"
}

# The pairs compared: greedy's runner and the other, per library.
pairs() {
  echo "greedy native"
  echo "session $([[ $1 == ompi5 ]] && echo dvm || echo native)"
}
for lib in ompi5 mpich5; do
  for n in "${sizes[@]}"; do
    for ((j = 0; j < jobs; j++)); do
      while read -r ours theirs; do
        if ((j % 2)); then job "$theirs" "$lib" "$n"; job "$ours" "$lib" "$n"; else job "$ours" "$lib" "$n"; job "$theirs" "$lib" "$n"; fi
      done < <(pairs "$lib")
    done
  done
done
name_of() {
  case $1-$2 in
    greedy-*) echo "greedyrun" ;; session-*) echo "greedyrun on a session" ;;
    native-ompi5) echo prterun ;; native-mpich5) echo "Hydra mpiexec" ;; dvm-*) echo "PRRTE's DVM" ;;
  esac
}
echo "| library | children | greedy's runner | median s (rounds) | other launcher | its median s | greedy / it |"
echo "|---|---|---|---|---|---|---|"
for lib in ompi5 mpich5; do
  for n in "${sizes[@]}"; do
    while read -r ours theirs; do
      g=$(median <"$work/$ours-$lib-$n") o=$(median <"$work/$theirs-$lib-$n")
      printf '| %s | %s | %s | %.3f (%s) | %s | %.3f | %.2f |\n' "$lib" "$n" "$(name_of "$ours" "$lib")" "$g" \
        "$(wc -l <"$work/$ours-$lib-$n")" "$(name_of "$theirs" "$lib")" "$o" "$(awk -v a="$g" -v b="$o" 'BEGIN {print a / b}')"
    done < <(pairs "$lib")
  done
done
