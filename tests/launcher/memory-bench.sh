#!/usr/bin/env bash
# greedyrun's own memory against the number of hosts (issue 19: flat beyond the plan): peak
# resident set (VmHWM, polled every 50 ms) of greedyrun launching `--pmi none sleep 2`, one
# agent per host, every agent on this machine at a loopback address of its own (a fake remote
# shell ignores the host name). With --against BIN, that greedyrun (an older build, with its
# greedyd beside it) runs interleaved with this one, in the same sitting. With --srun, the
# emulated cluster with Slurm instead (as many nodes as the largest size), each launch
# `greedyrun --rsh srun` inside `salloc -N hosts`: one srun step starts every agent, so every
# host is greedyrun's child.
# Prints CSV: hosts, run, kB of this build[, kB of BIN].
# usage: tests/launcher/memory-bench.sh [--hosts "16 100 300 600 1000"] [--runs 3] [--against BIN]
#        [--srun]   (root)
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
sizes="16 100 300 600 1000" runs=3 against="" srun=0
while (($#)); do
  case $1 in
    --hosts) sizes=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --against) against=$2; shift 2 ;;
    --srun) srun=1; shift ;;
    *) echo "usage: $0 [--hosts LIST] [--runs N] [--against BIN] [--srun]" >&2; exit 2 ;;
  esac
done
. "$ROOT/tests/launcher/loopback.sh"
build --release -p greedy-launcher
work=$(mktemp -d /var/tmp/greedy-memory.XXXXXX)
trap 'rm -rf "$work"' EXIT
loopback_rsh "$work"
if ((srun)); then
  export GREEDY_TC_QUIET=1
  cluster_up --nodes "$(tr ' ' '\n' <<<"$sizes" | sort -n | tail -1)" --slurm
  trap '"$TC" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
  eval "$("$TC" env)"
fi

# launch BIN HOSTS: one launch of `sleep 2` on HOSTS hosts, in the background.
launch() {
  if ((srun)); then
    salloc -Q -N "$2" -- "$1" --rsh srun --progress 0 --pmi none sleep 2 >/dev/null 2>"$work/err" &
  else
    "$1" --rsh "$work/localsh" --progress 0 --hostfile "$work/hosts$2" -n "$2" --pmi none sleep 2 \
      >/dev/null 2>"$work/err" &
  fi
}

# peak_kb BIN HOSTS: greedyrun's VmHWM over one launch, in kB; fails if greedyrun does.
peak_kb() {
  local job pid hwm=0 v _
  launch "$1" "$2"
  job=$! pid=$!
  if ((srun)); then # greedyrun is salloc's child
    for _ in $(seq 200); do
      v=$(pgrep -P "$job" -x greedyrun || true)
      [[ -z $v ]] || { pid=$v; break; }
      sleep 0.05
    done
    [[ $pid != "$job" ]] || { echo "memory-bench: no greedyrun under salloc in 10 s" >&2; return 1; }
  fi
  while kill -0 "$pid" 2>/dev/null; do
    v=$(awk '/^VmHWM/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
    [[ -z $v ]] || hwm=$v
    sleep 0.05
  done
  wait "$job" || { echo "memory-bench: $1 on $2 hosts failed: $(head -3 "$work/err")" >&2; return 1; }
  echo "$hwm"
}

echo "hosts,run,kB${against:+,kB_against}"
for n in $sizes; do
  loopback_hosts "$n" | tr ',' '\n' >"$work/hosts$n"
  for ((r = 1; r <= runs; r++)); do
    line="$n,$r,$(peak_kb "$CARGO_TARGET_DIR/release/greedyrun" "$n")"
    [[ -z $against ]] || line+=",$(peak_kb "$against" "$n")"
    echo "$line"
  done
done
