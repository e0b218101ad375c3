#!/usr/bin/env bash
# Benchmark for docs/benchmarks.md: greedyrun inside a Slurm allocation of N emulated hosts,
# `--rsh srun` (one step starts every agent, which connects back) vs `--rsh ssh` (the greedy
# tree of ssh sessions) vs Slurm's own `srun hostname`, alternating, REPS runs each; with
# --old DIR, also the greedyrun/greedyd of DIR (an earlier build) with `--rsh srun`.
# Each run is `hostname` on every host (every wire-up family served, as by default); prints
# medians (min-max) in ms from start to exit.
#
# usage: tests/launcher/srun-bench.sh [--nodes N] [--reps R] [--old DIR]
# Needs root; about 1 min at 16 hosts. Leaves nothing behind.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
N=16 REPS=9 OLD=""
while (($#)); do
  case $1 in
    --nodes) N=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --old) OLD=$(realpath "$2"); shift 2 ;;
    *) echo "usage: $0 [--nodes N] [--reps R] [--old DIR]" >&2; exit 2 ;;
  esac
done
need_root
build --release -p greedy-launcher
cluster_up --nodes "$N" --slurm
eval "$("$TC" env)"
work=$GREEDY_TC_SCRATCH/srun-bench
mkdir -p "$work/new"
cp "$BIN"/{greedyrun,greedyd} "$work/new/"
variants=(srun ssh slurm)
if [[ -n $OLD ]]; then
  mkdir -p "$work/old"
  cp "$OLD"/{greedyrun,greedyd} "$work/old/"
  variants+=(old)
fi
cd "$work"
# One allocation for every run: the timed part is the launch, not the allocation.
salloc -Q -N"$N" bash -c '
n=$1 reps=$2
shift 2
for ((r = 0; r < reps; r++)); do
  for v in "$@"; do
    case $v in
      srun) cmd=(./new/greedyrun --rsh srun --timeout 60 -- hostname) ;;
      ssh) cmd=(./new/greedyrun --timeout 60 -- hostname) ;;
      slurm) cmd=(srun --overlap --mpi=none --ntasks-per-node=1 hostname) ;;
      old) cmd=(./old/greedyrun --rsh srun --timeout 60 -- hostname) ;;
    esac
    t0=${EPOCHREALTIME/./}
    "${cmd[@]}" >out 2>err || echo "$v failed: $(tail -2 err)" >&2
    t1=${EPOCHREALTIME/./}
    [[ $(wc -l <out) == "$n" ]] || echo "$v: $(wc -l <out) of $n hosts answered" >&2
    echo "$v $(((t1 - t0) / 1000))" >>times
  done
done' sh "$N" "$REPS" "${variants[@]}"
echo "| launch ($N hosts, inside salloc) | median ms (min-max) |"
echo "|---|---|"
for v in "${variants[@]}"; do
  awk -v v="$v" '$1 == v { print $2 }' times | sort -n |
    awk -v v="$v" '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "| %s | %.0f (%d-%d) |\n", v, m, a[1], a[NR] }'
done
