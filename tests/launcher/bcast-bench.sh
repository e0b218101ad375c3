#!/usr/bin/env bash
# One file of SIZE MB onto H loopback pseudo-hosts before a one-rank-per-host job reads it,
# one sitting, the runners interleaved per rep:
#   bcast   greedyrun --bcast=FILE: read once, down the launch tree in 1 MiB chunks that each
#           agent forwards as they arrive, SHA-256 checked on every host
#   fetch   every host copies it from the front end itself through the remote shell
#           (`RSH login cat FILE > local`, as `scp login:FILE` would), then the job reads it
#   none    the same job with no file (the launch alone)
# Each rank checks its copy's size (a short copy fails the run); every copy is removed. Prints
# the median wall time, its ratio to bcast's, and the MB that left the front end (bcast: one
# copy per tree edge from greedyrun; fetch: one per host). On loopback a copy is a pipe on this
# machine's 2 cores: the CPU and memory bandwidth decide, not a network's links.
# usage: tests/launcher/bcast-bench.sh [--hosts H] [--mb SIZE] [--reps K]
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
hosts=16 mb=50 reps=3
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --mb) mb=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--hosts H] [--mb SIZE] [--reps K]" >&2; exit 2 ;;
  esac
done
. "$ROOT/tests/launcher/loopback.sh"
loopback_bench bcast-bench
head -c "$((mb << 20))" /dev/urandom >"$work/big.bin"
list=$(loopback_hosts "$hosts" 1)
want=$((mb << 20))
mkdir -p "$work/tmp"
check="test \$(wc -c < \"\$GREEDY_BCAST/big.bin\") = $want"
fetch="f=\$TMPDIR/big.\$GREEDY_RANK; $work/localsh login cat $work/big.bin > \$f && test \$(wc -c < \$f) = $want; rc=\$?; rm -f \$f; exit \$rc"
run() {
  local -a extra=()
  local script=true
  case $1 in
    bcast) extra=(--bcast=big.bin) script=$check ;;
    fetch) script=$fetch ;;
  esac
  (cd "$work" && TMPDIR=$work/tmp "$BIN" --rsh "$work/localsh" -H "$list" --progress 0 \
    "${extra[@]}" sh -c "$script" 2>"$1.err" >/dev/null) || fail "$1: $(tail -3 "$work/$1.err")"
}
declare -A walls=()
for ((k = 0; k < reps; k++)); do
  for runner in bcast fetch none; do
    t0=$(ms)
    run "$runner"
    t1=$(ms)
    walls[$runner]+="$((t1 - t0)) "
    echo "bcast-bench: rep $k $runner $((t1 - t0)) ms" >&2
  done
done
[[ -z $(ls -A "$work/tmp") ]] || fail "the hosts left files: $(ls "$work/tmp")"
b=$(echo "${walls[bcast]}" | median)
echo "| ${mb} MB to $hosts hosts, then a job reads it | median wall s | vs bcast | MB from the front end |"
echo "|---|---|---|---|"
for runner in bcast fetch none; do
  m=$(echo "${walls[$runner]}" | median)
  case $runner in
    bcast) label="greedyrun --bcast (down the tree)" moved="$mb per tree child of greedyrun" ;;
    fetch) label="every host copies it from the front end" moved=$((mb * hosts)) ;;
    none) label="the job alone, no file" moved=0 ;;
  esac
  awk -v m="$m" -v b="$b" -v l="$label" -v x="$moved" \
    'BEGIN { printf "| %s | %.2f | %.2fx | %s |\n", l, m / 1000, m / b, x }'
done
