#!/usr/bin/env bash
# Benchmark for docs/benchmarks.md (issue 17): `srun -N16` and `srun -N64` of `hostname` and
# `/bin/true` on an emulated cluster of Slurm 24.11 or 26.05 with a packet delay, under
# TopologyPlugin=topology/greedy (built-in RouteSeq/RouteRem, delegating to the default
# topology) against that default topology alone, at TreeWidth 16 (the default) and 50.
#
# One 64-host cluster per run; the plugin is swapped by editing slurm.conf and restarting the
# daemons on the same state (testcluster restart-slurm), TreeWidth by `scontrol reconfigure`
# (srun reads it from slurm.conf, each hop from the message). Rounds alternate the plugins so
# that drift of the machine's load hits both alike; every timed srun starts on an idle cluster.
# Prints one markdown table row per (N, command, TreeWidth): medians, min–max, the ratio
# greedy/delegate, and the launch-tree time the model predicts for each tree
# (`greedy-tree plan --slurm-release R --topology greedy|treewidth`, SEQ/REM as the plugin's
# defaults), then the model's projection to 10^4 and 10^5 nodes.
#
# usage: tests/slurm/topology-bench.sh --release 24.11|26.05 [--delay MS] [--reps R]
#        [--rounds K] [--csv FILE]
# Also prints, per N, the machine's busy cores during the sruns (CPU seconds / wall seconds, all
# processes): near 2, the 2 shared cores and not the tree decide the time.
# --csv FILE: also append every timed srun to FILE
#   (release,delay_ms,nodes,command,treewidth,topology,round,rep,ms,last_launch_ms; a header
#   if FILE is new).
# Needs root; about 8 min with the defaults (delay 10, 5 reps, 2 rounds). Leaves nothing behind.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
release="" delay=10 reps=5 rounds=2 csv=/dev/null
while (($#)); do
  case $1 in
    --release) release=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --csv) csv=$(realpath "$2"); shift 2 ;;
    *) echo "usage: $0 --release 24.11|26.05 [--delay MS] [--reps R] [--rounds K] [--csv FILE]" >&2; exit 2 ;;
  esac
done
release_select "$release"
TAG="topology-bench $RELEASE"
need_root
[[ $RELEASE =~ ^(24\.11|26\.05)$ ]] || fail "topology/greedy is for 24.11 and 26.05"
[[ $csv == /dev/null || -s $csv ]] || echo "release,delay_ms,nodes,command,treewidth,topology,round,rep,ms,last_launch_ms" >"$csv"
delegate=default
[[ $RELEASE == 26.05 ]] && delegate=flat

build --slurm "$RELEASE" --release -p greedy-slurm-topology
work=$(mktemp -d /var/tmp/topology-bench.XXXXXX)
chmod 755 "$work"
cp "$BIN/libtopology_greedy.so" "$work/topology_greedy.so"
# greedy-tree gives the model's prediction of each tree.
build -p greedy-tree
cluster_up --nodes 64 --delay "$delay" --slurm --release "$RELEASE" --plugindir "$work"
trap 'cd "$ROOT"; "$TC" down >/dev/null 2>&1; rm -rf "$work"' EXIT
eval "$("$TC" env)"
LOGDIR=$(dirname "$(dirname "$SLURM_CONF")")/log

use_topology() { # greedy | the delegate: slurm.conf's line, then the daemons restarted
  sed -i '/^TopologyPlugin=/d' "$SLURM_CONF"
  [[ $1 == greedy ]] && echo "TopologyPlugin=topology/greedy" >>"$SLURM_CONF"
  "$TC" restart-slurm >/dev/null || fail "restart-slurm with topology/$1"
}
use_treewidth() {
  sed -i '/^TreeWidth=/d' "$SLURM_CONF"
  echo "TreeWidth=$1" >>"$SLURM_CONF"
  scontrol reconfigure || fail "scontrol reconfigure"
  sleep 1
}
busy_jiffies() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat; }
# When each host's slurmd got the launch (its "launch task" log line, ms resolution), as
# "HOST MS-after-srun-started" lines; reads only what the logs gained after OFFSETS.
arrivals() { # OFFSETS T0
  python3 - "$1" "$2" "$LOGDIR" <<'PY'
import datetime, os, re, sys
offsets, t0, logdir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
for line in open(offsets):
    host, off = line.split()
    with open(os.path.join(logdir, f"slurmd-{host}.log"), "rb") as f:
        f.seek(int(off))
        text = f.read().decode(errors="replace")
    m = re.search(r"^\[([0-9T:.-]+)\] launch task StepId=", text, re.M)
    if m:
        # Slurm logs local time without a zone; a naive datetime is taken as local too.
        print(host, round((datetime.datetime.fromisoformat(m.group(1)).timestamp() - t0) * 1000))
PY
}
time_srun() { # N COMMAND: wall seconds, CPU seconds the whole machine spent meanwhile, and
  # the ms until the last host got the launch; per-host arrivals in $work/arrivals.last
  wait_idle
  local h c0 t0
  for h in $(seq -f 'n%g' 1 "$1"); do echo "$h $(stat -c %s "$LOGDIR/slurmd-$h.log")"; done >"$work/offsets"
  c0=$(busy_jiffies)
  t0=$EPOCHREALTIME
  timeout 120 srun -N"$1" -w "n[1-$1]" "$2" >/dev/null 2>>"$work/srun.err" ||
    fail "srun -N$1 $2: $(tail -3 "$work/srun.err")"
  local wall cpu
  wall=$(echo "$EPOCHREALTIME - $t0" | bc -l)
  cpu=$(echo "($(busy_jiffies) - $c0) / $(getconf CLK_TCK)" | bc -l)
  arrivals "$work/offsets" "$t0" >"$work/arrivals.last"
  (($(wc -l <"$work/arrivals.last") == $1)) || fail "srun -N$1: $(wc -l <"$work/arrivals.last") slurmd logged the launch"
  echo "$wall $cpu $(sort -k2 -n "$work/arrivals.last" | tail -n 1 | cut -d' ' -f2)"
}
stats() { # stdin: seconds; prints "median min max" in ms
  sort -g | awk '{a[NR]=$1*1000} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f %.0f %.0f\n", m, a[1], a[NR]}'
}

t_start=$(date +%s)
for ((k = 0; k < rounds; k++)); do
  order=("$delegate" greedy)
  ((k % 2)) && order=(greedy "$delegate")
  for topo in "${order[@]}"; do
    use_topology "$topo"
    [[ $topo == greedy ]] && { scontrol show config | grep -q 'topology/greedy' || fail "topology/greedy not in use"; }
    for tw in 16 50; do
      use_treewidth "$tw"
      for n in 16 64; do
        for cmd in hostname /bin/true; do
          time_srun "$n" "$cmd" >/dev/null # warm-up
          for ((r = 0; r < reps; r++)); do
            read -r s cpu last < <(time_srun "$n" "$cmd")
            echo "$s" >>"$work/$topo-$tw-$n-${cmd##*/}"
            echo "$last" >>"$work/last-$topo-$tw-$n"
            echo "$cpu $s" >>"$work/cpu-$n"
            sed "s/^/$topo $tw $n /" "$work/arrivals.last" >>"$work/arrivals"
            awk -v s="$s" -v R="$RELEASE" -v d="$delay" -v n="$n" -v c="${cmd##*/}" -v tw="$tw" -v t="$topo" -v k="$k" -v r="$r" -v l="$last" \
              'BEGIN { printf "%s,%s,%s,%s,%s,%s,%s,%s,%.0f,%s\n", R, d, n, c, tw, t, k, r, s * 1000, l }' >>"$csv"
          done
        done
      done
    done
  done
done

# The model's launch-tree time (SEQ/REM: topology/greedy's built-in defaults) for srun + N hosts.
model() { # N TOPOLOGY TREEWIDTH
  "$CARGO_TARGET_DIR/debug/greedy-tree" plan --nodes $(($1 + 1)) --seq 0.011 --rem 0.056 \
    --max-fanout "$3" --slurm-release "$RELEASE" --topology "$2" --format summary |
    awk '{printf "%.0f", $(NF-1) * 1000}'
}
echo "Slurm $RELEASE, --delay $delay ms, $((reps * rounds)) runs each, $(date -u +%FT%TZ), $(($(date +%s) - t_start)) s"
echo
echo "| N | command | TreeWidth | topology/$delegate ms | topology/greedy ms | greedy / $delegate | last host launched ms: $delegate → greedy | model: $delegate → greedy ms |"
echo "|---|---|---|---|---|---|---|---|"
for n in 16 64; do
  for cmd in hostname true; do
    for tw in 16 50; do
      read -r dm dlo dhi < <(stats <"$work/$delegate-$tw-$n-$cmd")
      read -r gm glo ghi < <(stats <"$work/greedy-$tw-$n-$cmd")
      dl=$(awk '{print $1 / 1000}' "$work/last-$delegate-$tw-$n" | stats | cut -d' ' -f1)
      gl=$(awk '{print $1 / 1000}' "$work/last-greedy-$tw-$n" | stats | cut -d' ' -f1)
      echo "| $n | $cmd | $tw | $dm ($dlo–$dhi) | $gm ($glo–$ghi) | $(echo "scale=2; $gm / $dm" | bc -l) | $dl → $gl | $(model "$n" treewidth "$tw") → $(model "$n" greedy "$tw") |"
    done
  done
done
echo
echo "Per hop, N=64 (both commands): median ms from srun's start until the slurmds at each depth of"
echo "the tree (greedy-tree plan --slurm-release $RELEASE) logged the launch, and the model's time:"
echo
echo "| TreeWidth | topology | depth: measured ms (model ms) … |"
echo "|---|---|---|"
for tw in 16 50; do
  for topo in "$delegate" greedy; do
    shape=treewidth
    [[ $topo == greedy ]] && shape=greedy
    "$CARGO_TARGET_DIR/debug/greedy-tree" plan --hosts "srun,n[1-64]" --seq 0.011 --rem 0.056 \
      --max-fanout "$tw" --slurm-release "$RELEASE" --topology "$shape" >"$work/plan-$topo-$tw"
    echo "| $tw | $topo | $(python3 - "$work/plan-$topo-$tw" "$work/arrivals" "$topo" "$tw" <<'PY'
import statistics, sys
plan, arrivals, topo, tw = sys.argv[1:5]
depth, model = {}, {}
for line in open(plan):
    if line.startswith("#"):
        continue
    _, host, _, _, d, t = line.split()
    depth[host], model[host] = int(d), float(t) * 1000
by_depth, model_by_depth = {}, {}
for line in open(arrivals):
    t, w, n, host, ms = line.split()
    if t == topo and w == tw and n == "64":
        by_depth.setdefault(depth[host], []).append(int(ms))
        model_by_depth.setdefault(depth[host], []).append(model[host])
print(" · ".join(f"{d}: {statistics.median(v):.0f} ({statistics.median(model_by_depth[d]):.0f})"
                 for d, v in sorted(by_depth.items())))
PY
) |"
  done
done
echo
for n in 16 64; do
  echo "N=$n: busy cores during the sruns (median of CPU s / wall s, whole machine): $(awk '{print $1 / $2}' "$work/cpu-$n" | sort -g | awk '{a[NR]=$1} END {printf "%.2f", (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}') of 2"
done
echo
echo "Model projection (launch tree only, SEQ 0.011 s, REM 0.056 s):"
echo
echo "| N | TreeWidth | Slurm's tree ms | greedy plan ms | ratio |"
echo "|---|---|---|---|---|"
for n in 10000 100000; do
  for tw in 16 50; do
    d=$(model "$n" treewidth "$tw") g=$(model "$n" greedy "$tw")
    echo "| $n | $tw | $d | $g | $(echo "scale=2; $g / $d" | bc -l) |"
  done
done
