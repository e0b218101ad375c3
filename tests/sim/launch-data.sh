#!/usr/bin/env bash
# Measured launch times for greedy-sim's validation, in the format of docs/data/launch.csv:
#   shell,topology,hosts,delay_ms,rep,seconds
# seconds = greedyrun -v's "agents up after" (launch start → last agent's hello), `--pmi none
# -- true`, over rsh and ssh, topologies flat binomial kary:4 kary:8 greedy.
#
#   tests/sim/launch-data.sh [OUT]     # SIZES="8 16 32" DELAYS=10 RUNS=2, ≈ 3 min
# GREEDY_BIN: a directory with greedyrun and greedyd (default: builds the release launcher).
# Waits for another engineer's cluster to go down (never tears it down).
set -euo pipefail
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
OUT=${1:-$ROOT/docs/data/launch.csv}
export GREEDY_TC_QUIET=1
SIZES=${SIZES:-8 16 32}
DELAYS=${DELAYS:-10}
RUNS=${RUNS:-2}
if [[ -z ${GREEDY_BIN:-} ]]; then
  build --release -p greedy-launcher -p greedy-netdelay
  GREEDY_BIN=$BIN
fi
export GREEDY_NETDELAY=${GREEDY_NETDELAY:-$GREEDY_BIN/greedy-netdelay}
MAXN=0
for n in $SIZES; do ((n > MAXN)) && MAXN=$n; done
TMP=$(mktemp)
echo "shell,topology,hosts,delay_ms,rep,seconds" >"$TMP"
for delay in $DELAYS; do
  cluster_up --nodes "$MAXN" --delay "$delay"
  for rep in $(seq "$RUNS"); do
    for n in $SIZES; do
      for shell in rsh ssh; do
        for topo in flat binomial kary:4 kary:8 greedy; do
          err=$(timeout 120 "$GREEDY_BIN/greedyrun" -v --progress 0 --hosts "n[1-$n]" --rsh "$shell" \
            --pmi none --topology "$topo" -- true 2>&1 >/dev/null) || fail "$shell $topo $n: $err"
          s=$(sed -n 's/.*agents up after \([0-9.]*\) s.*/\1/p' <<<"$err" | head -1)
          [[ -n $s ]] || fail "$shell $topo $n: no 'agents up after' in: $err"
          echo "$shell,$topo,$n,$delay,$rep,$s" | tee -a "$TMP"
        done
      done
    done
  done
  "$TC" down >/dev/null
  trap - EXIT
done
mkdir -p "$(dirname "$OUT")"
mv "$TMP" "$OUT"
