#!/usr/bin/env bash
# Benchmark for docs/benchmarks.md: `srun -NN true` (N = 16 unless --nodes) wall time under
# route/greedy vs route/default at TreeWidth 50, 16 and 4 (or --treewidths) on the emulated
# cluster with a packet delay.
# route/greedy runs with its built-in defaults (the calibrated RouteSeq/RouteRem, no
# greedy.conf). Each (route, TreeWidth) cluster is brought up fresh, ROUNDS times in
# alternation so that drift of the machine's load hits both routes alike; every timed srun
# starts on an idle cluster. Prints one markdown table row per TreeWidth: medians, min-max,
# and the ratio greedy/default.
#
# usage: tests/slurm/route-bench.sh [--nodes N] [--treewidths "50 16 4"] [--command CMD]
#          [--delay MS] [--reps R] [--rounds K] [--csv FILE]
# --csv FILE: also append every timed srun to FILE (delay_ms,treewidth,route,round,rep,ms; a
#   header if FILE is new; greedy-bench reads it).
# Needs root; about 2 min with the defaults (delay 10, 8 reps, 2 rounds). Leaves nothing behind.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
delay=10 reps=8 rounds=2 csv=/dev/null nodes=16 treewidths="50 16 4" command=true
while (($#)); do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --treewidths) treewidths=$2; shift 2 ;;
    --command) command=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --csv) csv=$(realpath "$2"); shift 2 ;;
    *) echo "usage: $0 [--nodes N] [--treewidths LIST] [--command CMD] [--delay MS] [--reps R] [--rounds K] [--csv FILE]" >&2; exit 2 ;;
  esac
done
need_root
[[ $csv == /dev/null || -s $csv ]] || echo "delay_ms,treewidth,route,round,rep,ms" >"$csv"
build -p greedy-slurm-route
work=$(mktemp -d /var/tmp/route-bench.XXXXXX)
chmod 755 "$work"
# Only a cluster this script brought up is taken down: another test's must survive our failure.
ours=0
trap '((ours)) && "$TC" down >/dev/null 2>&1; rm -rf "$work"' EXIT
cp "$BIN/libroute_greedy.so" "$work/route_greedy.so"

time_srun() {
  wait_idle
  local t0=$EPOCHREALTIME
  timeout 120 srun -N"$nodes" "$command" >/dev/null 2>>"$work/srun.err" ||
    fail "srun -N$nodes $command: $(tail -3 "$work/srun.err")"
  echo "$EPOCHREALTIME - $t0" | bc -l
}
stats() { # stdin: seconds; prints "median min max" in ms
  sort -g | awk '{a[NR]=$1*1000} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f %.0f %.0f\n", m, a[1], a[NR]}'
}

for ((k = 0; k < rounds; k++)); do
  for tw in $treewidths; do
    for route in default greedy; do
      args=(--nodes "$nodes" --delay "$delay" --slurm --treewidth "$tw")
      [[ $route == greedy ]] && args+=(--plugindir "$work" --route greedy)
      # Waits while another test holds the machine: it may slip in between our clusters.
      cluster_claim "${args[@]}"
      ours=1
      eval "$("$TC" env)"
      time_srun >/dev/null # warm-up
      for ((r = 0; r < reps; r++)); do
        s=$(time_srun)
        echo "$s" >>"$work/$route-$tw"
        awk -v s="$s" -v d="$delay" -v tw="$tw" -v rt="$route" -v k="$k" -v r="$r" \
          'BEGIN { printf "%s,%s,%s,%s,%s,%.0f\n", d, tw, rt, k, r, s * 1000 }' >>"$csv"
      done
      "$TC" down >/dev/null || fail "down"; ours=0
    done
  done
done

echo "| TreeWidth | route/default median (min–max) ms | route/greedy median (min–max) ms | greedy / default |"
echo "|---|---|---|---|"
for tw in $treewidths; do
  read -r dm dlo dhi < <(stats <"$work/default-$tw")
  read -r gm glo ghi < <(stats <"$work/greedy-$tw")
  echo "| $tw | $dm ($dlo–$dhi) | $gm ($glo–$ghi) | $(echo "scale=2; $gm / $dm" | bc -l) |"
done
echo "($((reps * rounds)) runs each of srun -N$nodes $command, --delay $delay, $(date -u +%FT%TZ))"
