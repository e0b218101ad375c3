#!/usr/bin/env bash
# Calibrates route/greedy's model (RouteSeq, RouteRem) on the emulated cluster: times
# `srun -N N true` under route/default with TreeWidth 50 (every host contacted by srun directly:
# one SEQ per extra host) and TreeWidth 1 (a chain: one REM per extra host) for N = 2, 4, 8, 16,
# and fits overhead + T(tree; SEQ, REM) with `greedy-route calibrate` (plugin/route/src/calibrate.rs).
#
# usage: tests/slurm/route-calibrate.sh [--delay MS] [--reps R] [--out FILE]
#   --delay MS  testcluster packet delay (default 10: login<->host RTT 10 ms, host<->host 20 ms)
#   --reps R    timed runs per (TreeWidth, N); the median is used (default 7)
#   --out FILE  keep the launches file (TREEWIDTH HOSTS SECONDS lines)
# Needs root; about 1-2 min. Leaves no cluster behind.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
delay=10 reps=7 out=""
while (($#)); do
  case $1 in
    --delay) delay=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--delay MS] [--reps R] [--out FILE]" >&2; exit 2 ;;
  esac
done
need_root
build -p greedy-slurm-route
work=$(mktemp -d /var/tmp/route-calibrate.XXXXXX)
# Only a cluster this script brought up is taken down: another test's must survive our failure.
ours=0
trap '((ours)) && "$TC" down >/dev/null 2>&1; rm -rf "$work"' EXIT

# time_srun N: wall seconds of one `srun -N N true`, started on an idle cluster (wait_idle: a
# job started while the last one's nodes are still completing waits in the queue, and that
# wait is not the launch).
time_srun() {
  wait_idle
  local t0=$EPOCHREALTIME
  timeout 120 srun -N"$1" true || fail "srun -N$1 true"
  echo "$EPOCHREALTIME - $t0" | bc -l
}

echo "# srun -N N true under route/default; delay $delay ms; median of $reps; $(date -u +%FT%TZ)" >"$work/launches"
echo "# TREEWIDTH HOSTS SECONDS" >>"$work/launches"
for tw in 50 1; do
  # Waits for a free cluster; one retry: a transient failure of `up` should not cost the whole
  # calibration.
  cluster_claim --nodes 16 --delay "$delay" --slurm --treewidth "$tw"
  ours=1
  eval "$("$TC" env)"
  time_srun 16 >/dev/null # warm-up: first job pays for slurmctld's and slurmd's caches
  for n in 2 4 8 16; do
    m=$(for ((r = 0; r < reps; r++)); do time_srun "$n"; done | median)
    echo "$tw $n $m" | tee -a "$work/launches"
  done
  "$TC" down >/dev/null || fail "down"; ours=0
done
[[ -z $out ]] || cp "$work/launches" "$out"
"$BIN/greedy-route" calibrate --launches "$work/launches"
