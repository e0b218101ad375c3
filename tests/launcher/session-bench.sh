#!/usr/bin/env bash
# Repeated jobs (issue 20) on the emulated cluster with a per-hop delay, 1 rank per host, timed
# launch to finish, interleaved in one sitting: `hostname` (the launch alone) at every size, and
# an MPI hello (tests/mpi/wireup.c: Init, Allreduce, Barrier, Finalize) up to --mpi-max hosts
# (MPICH at 64 ranks on these 2 cores fails under every launcher, docs/benchmarks.md):
#   hydra       PyPI MPICH 5.0.2 `mpiexec.hydra -launcher ssh` (a fresh launch, as users do)
#   gr-fresh    greedyrun (a fresh launch over ssh along the greedy tree)
#   gr-session  greedyrun with GREEDY_SESSION set: the job on a session's agents, started once
#               before the runs (`--start-session`), so no remote shell per job
# Not here: jobs onto a PRRTE DVM. The Open MPI 5.0.11 wheel's `prterun --dvm file:URI` (and
# `pid:`, `search`) segfaults in prte_ess_base_setup_signals before it contacts the DVM.
# Prints one markdown row per (hosts, runner): median wall of R runs, CPU seconds per run (all
# emulated hosts share this machine's 2 cores), and the ratio to Hydra.
# usage: tests/launcher/session-bench.sh [--sizes "16 64"] [--mpi-max N] [--delay MS] [--reps R]
# Waits for another engineer's cluster to go down (never tears it down). ≈ 5 min.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Hydra sends its own hostname to the remote daemons for call-backs, and this
# machine's name resolves to 127.0.0.1 (tests/launcher/bench.sh does the same).
if [[ ${GREEDY_BENCH_UTS:-} != 1 ]]; then
  exec env GREEDY_BENCH_UTS=1 unshare --uts bash -c 'hostname login && exec "$0" "$@"' "$0" "$@"
fi
sizes="16 64" delay=10 reps=5 mpimax=16
while (($#)); do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --mpi-max) mpimax=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--sizes \"16 64\"] [--delay MS] [--reps R]" >&2; exit 2 ;;
  esac
done
fail() { echo "session-bench: FAIL: $*" >&2; exit 1; }
. "$ROOT/tests/launcher/cluster-bench.sh"
. "$ROOT/tests/mpi/mpich5.sh"

max=0
for n in $sizes; do ((n > max)) && max=$n; done
cluster_up --nodes "$max" --delay "$delay"
eval "$("$TC" env)"
wait_sshd "$max"
W=$GREEDY_TC_SCRATCH/session-bench
mkdir -p "$W"
cd "$W"
"$MPICH5/bin/mpicc" -O1 -o hello_mpich5 "$ROOT/tests/mpi/wireup.c"

CSV=$W/results.csv
echo "workload,hosts,runner,run,wall_ms,cpu_s,ok" >"$CSV"
# measure WORKLOAD N RUNNER RUN EXPECT CMD...: one timed run; a run without N lines matching
# EXPECT fails the bench.
measure() {
  local work=$1 n=$2 runner=$3 run=$4 expect=$5 t0 j0 rc wall cpu ok
  shift 5
  settle
  j0=$(busy_jiffies)
  t0=$(ms)
  set +e
  local log=$W/$work-$runner-$n-$run
  timeout 120 "$@" >"$log.out" 2>"$log.err" </dev/null
  rc=$?
  set -e
  wall=$(($(ms) - t0))
  cpu=$(awk -v a="$j0" -v b="$(busy_jiffies)" 'BEGIN {printf "%.2f", (b - a) / 100}')
  ok=$(grep -c "$expect" "$log.out" || true)
  ((rc == 0 && ok == n)) || fail "$work: $runner on $n hosts, run $run: exit $rc, $ok ok: $(tail -3 "$log.err")"
  echo "$work,$n,$runner,$run,$wall,$cpu,$ok" >>"$CSV"
  echo "session-bench: $work n=$n $runner run $run: ${wall} ms cpu=${cpu}s" >&2
}

session=""
cleanup() {
  [[ -z $session ]] || GREEDY_SESSION=$session "$BIN/greedyrun" --end-session >/dev/null 2>&1 || true
}
trap 'cleanup; "$TC" down >/dev/null 2>&1 || true' EXIT
for n in $sizes; do
  for i in $(seq "$n"); do echo "n$i"; done >"hosts$n"
  session=$("$BIN/greedyrun" --hostfile "hosts$n" --start-session | sed -n 's/^export GREEDY_SESSION=//p')
  [[ -S $session ]] || fail "no session on $n hosts"
  fresh=(env -u GREEDY_SESSION "$BIN/greedyrun" --progress 0 --hostfile "hosts$n")
  attached=(env GREEDY_SESSION="$session" "$BIN/greedyrun" --progress 0 -n "$n" --ppn 1)
  hydra=("$MPICH5/bin/mpiexec.hydra" -launcher ssh -f "hosts$n" -n "$n" -ppn 1)
  for run in $(seq "$reps"); do
    measure hostname "$n" hydra "$run" "^n[0-9]" "${hydra[@]}" hostname
    measure hostname "$n" gr-fresh "$run" "^n[0-9]" "${fresh[@]}" hostname
    measure hostname "$n" gr-session "$run" "^n[0-9]" "${attached[@]}" hostname
    ((n <= mpimax)) || continue
    measure hello "$n" hydra "$run" "of $n: ok" "${hydra[@]}" env EXPECT_SIZE="$n" ./hello_mpich5
    measure hello "$n" gr-fresh "$run" "of $n: ok" "${fresh[@]}" -- env EXPECT_SIZE="$n" ./hello_mpich5
    measure hello "$n" gr-session "$run" "of $n: ok" "${attached[@]}" -- env EXPECT_SIZE="$n" ./hello_mpich5
  done
  GREEDY_SESSION=$session "$BIN/greedyrun" --end-session
  session=""
done
cp "$CSV" "${BENCH_OUT:-$CARGO_TARGET_DIR}/session-bench.csv"

echo "| workload | hosts | runner | median ms | CPU s per run | vs Hydra |"
echo "|---|---|---|---|---|---|"
awk -F, 'NR > 1 { key = $1 "," $2 "," $3; walls[key] = walls[key] " " $5; cpus[key] = cpus[key] " " $6
                  if (!(key in seen)) { seen[key] = 1; order[++k] = key } }
  function median(list,   a, m, i, j, t) {
    m = split(list, a, " ")
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    for (i = 1; i <= k; i++) med[order[i]] = median(walls[order[i]])
    for (i = 1; i <= k; i++) {
      split(order[i], p, ","); h = med[p[1] "," p[2] ",hydra"]
      printf "| %s | %s | %s | %d | %.2f | %.2fx |\n", p[1], p[2], p[3], med[order[i]], median(cpus[order[i]]), med[order[i]] / h
    }
  }' "$CSV"
