#!/usr/bin/env bash
# Repeated MPI jobs (issue 20): an MPI hello (tests/mpi/wireup.c: Init, Allreduce, Barrier,
# Finalize; 1 rank per host) on the emulated cluster with a per-hop delay, timed launch to
# finish, interleaved in one sitting:
#   hydra       PyPI MPICH 5.0.2 `mpiexec.hydra -launcher ssh` (a fresh launch, as users do)
#   gr-fresh    greedyrun (a fresh launch over ssh along the greedy tree)
#   gr-session  greedyrun with GREEDY_SESSION set: the job on a session's agents, started once
#               before the runs (`--start-session`), so no remote shell per job
# Not here: jobs onto a PRRTE DVM. The Open MPI 5.0.11 wheel's `prterun --dvm file:URI` (and
# `pid:`, `search`) segfaults in prte_ess_base_setup_signals before it contacts the DVM.
# Prints one markdown row per (hosts, runner): median wall of R runs, CPU seconds per run (all
# emulated hosts share this machine's 2 cores), and the ratio to Hydra.
# usage: tests/launcher/session-bench.sh [--sizes "16 64"] [--delay MS] [--reps R]
# Waits for another engineer's cluster to go down (never tears it down). ≈ 5 min.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Hydra sends its own hostname to the remote daemons for call-backs, and this
# machine's name resolves to 127.0.0.1 (tests/launcher/bench.sh does the same).
if [[ ${GREEDY_BENCH_UTS:-} != 1 ]]; then
  exec env GREEDY_BENCH_UTS=1 unshare --uts bash -c 'hostname login && exec "$0" "$@"' "$0" "$@"
fi
sizes="16 64" delay=10 reps=5
while (($#)); do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--sizes \"16 64\"] [--delay MS] [--reps R]" >&2; exit 2 ;;
  esac
done
fail() { echo "session-bench: FAIL: $*" >&2; exit 1; }
TC="$ROOT/slurm-conf/testcluster"
export GREEDY_TC_QUIET=1
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build -q --release --locked -p greedy-launcher -p greedy-netdelay
BIN=$CARGO_TARGET_DIR/release
export GREEDY_NETDELAY=${GREEDY_NETDELAY:-$BIN/greedy-netdelay}
. "$ROOT/tests/mpi/mpich5.sh"

max=0
for n in $sizes; do ((n > max)) && max=$n; done
# shellcheck source=../cluster/claim.sh
. "$ROOT/tests/cluster/claim.sh"
cluster_up --nodes "$max" --delay "$delay"
eval "$("$TC" env)"
wait_sshd "$max"
W=$GREEDY_TC_SCRATCH/session-bench
mkdir -p "$W"
cd "$W"
"$MPICH5/bin/mpicc" -O1 -o hello_mpich5 "$ROOT/tests/mpi/wireup.c"

busy_jiffies() { awk '/^cpu / {print $2+$3+$4+$7+$8}' /proc/stat; }
ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
settle() { # until < 20 % of the 2 cores are busy, at most 15 s
  local a b _i
  for _i in $(seq 30); do
    a=$(busy_jiffies)
    sleep 0.5
    b=$(busy_jiffies)
    ((b - a < 20)) && return 0
  done
}
CSV=$W/results.csv
echo "hosts,runner,run,wall_ms,cpu_s,ok" >"$CSV"
# measure N RUNNER RUN CMD...: one timed run; a run without N "ok" lines fails the bench.
measure() {
  local n=$1 runner=$2 run=$3 t0 j0 rc wall cpu ok
  shift 3
  settle
  j0=$(busy_jiffies)
  t0=$(ms)
  set +e
  timeout 120 "$@" >"$W/$runner-$n-$run.out" 2>"$W/$runner-$n-$run.err" </dev/null
  rc=$?
  set -e
  wall=$(($(ms) - t0))
  cpu=$(awk -v a="$j0" -v b="$(busy_jiffies)" 'BEGIN {printf "%.2f", (b - a) / 100}')
  ok=$(grep -c "of $n: ok" "$W/$runner-$n-$run.out" || true)
  ((rc == 0 && ok == n)) || fail "$runner on $n hosts, run $run: exit $rc, $ok ok: $(tail -3 "$W/$runner-$n-$run.err")"
  echo "$n,$runner,$run,$wall,$cpu,$ok" >>"$CSV"
  echo "session-bench: n=$n $runner run $run: ${wall} ms cpu=${cpu}s" >&2
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
  for run in $(seq "$reps"); do
    measure "$n" hydra "$run" "$MPICH5/bin/mpiexec.hydra" -launcher ssh -f "hosts$n" -n "$n" -ppn 1 \
      env EXPECT_SIZE="$n" ./hello_mpich5
    measure "$n" gr-fresh "$run" env -u GREEDY_SESSION "$BIN/greedyrun" --progress 0 --hostfile "hosts$n" \
      -- env EXPECT_SIZE="$n" ./hello_mpich5
    measure "$n" gr-session "$run" env GREEDY_SESSION="$session" "$BIN/greedyrun" --progress 0 -n "$n" --ppn 1 \
      -- env EXPECT_SIZE="$n" ./hello_mpich5
  done
  GREEDY_SESSION=$session "$BIN/greedyrun" --end-session
  session=""
done
cp "$CSV" "${BENCH_OUT:-$CARGO_TARGET_DIR}/session-bench.csv"

echo "| hosts | runner | median ms | CPU s per run | vs Hydra |"
echo "|---|---|---|---|---|"
awk -F, 'NR > 1 { key = $1 "," $2; walls[key] = walls[key] " " $4; cpus[key] = cpus[key] " " $5
                  if (!(key in seen)) { seen[key] = 1; order[++k] = key } }
  function median(list,   a, m, i, j, t) {
    m = split(list, a, " ")
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    for (i = 1; i <= k; i++) { split(order[i], p, ","); med[order[i]] = median(walls[order[i]]) }
    for (i = 1; i <= k; i++) {
      split(order[i], p, ","); h = med[p[1] ",hydra"]
      printf "| %s | %s | %d | %.2f | %.2fx |\n", p[1], p[2], med[order[i]], median(cpus[order[i]]), med[order[i]] / h
    }
  }' "$CSV"
