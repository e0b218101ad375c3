#!/usr/bin/env bash
# tests/slurm/topology.sh --release 24.11|26.05: topology/greedy (issue 17) on an emulated
# 16-host cluster of that release (testcluster up --release), TopologyPlugin=topology/greedy
# delegating to topology/tree (greedy.conf TopologyDelegate=tree) over a two-switch
# topology.conf (s1: n[1-8], s2: n[9-16]):
#   delegate  scontrol show config names topology/greedy; scontrol show topology prints the
#             switches of topology.conf, and with -v names topology/tree as the delegate
#   split     srun -N16 hostname reaches every host along the tree `greedy-tree plan
#             --slurm-release R` predicts (tests/slurm/route_tree.py on the splits the plugin
#             logged, RouteLogSplits=yes): on 24.11 the whole tree, srun's split included
#             (TreeWidth 16); on 26.05 srun splits its first level itself with Slurm's rule
#             (TreeWidth 4 here, so that level has forwarders) and every slurmd below follows
#             the plan; and every split slurmctld or a slurmd logged is the plan of its list
#   placement a fixed sequence of jobs (an exclusive 3-node job, then -N6, then -N4
#             --switches=1) lands on one switch each, as topology/tree places them
#   fault     greedy.conf naming a delegate that does not exist: srun (24.11) or scontrol
#             (26.05) says so once and uses the default delegate; the job still runs. A
#             malformed greedy.conf (Slurm restarted with it): every slurmd says why, no split
#             is greedy's, the job runs
#   removal   TopologyPlugin=topology/tree, topology_greedy.so deleted, Slurm restarted on the
#             same state: jobs run, the placement and scontrol show topology are exactly what
#             they were under topology/greedy, and no log line names topology/greedy again
# Needs root; about 2 min once built. Leaves no cluster, no process, no temp dir.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
CHECK="$ROOT/tests/slurm/route_tree.py"
export GREEDY_TC_QUIET=1
[[ ${1:-} == --release && -n ${2:-} ]] || { echo "usage: $0 --release 24.11|26.05" >&2; exit 2; }
release_select "$2"
TAG="topology $RELEASE"
need_root
[[ $RELEASE =~ ^(24\.11|26\.05)$ ]] || fail "topology/greedy is for 24.11 and 26.05"
# 24.11: SEQ/REM = 1/3, a tree several levels deep at 16 hosts, so a wrong split at any level
# shows; Slurm's default TreeWidth. 26.05: srun's own split at TreeWidth 4 leaves lists of 3
# below it, which SEQ/REM = 2/3 splits unlike Slurm (n2+1 n4+0, not flat).
SEQ=0.01 REM=0.03 TREEWIDTH=16
[[ $RELEASE == 26.05 ]] && REM=0.015 TREEWIDTH=4

build --slurm "$RELEASE" --release -p greedy-slurm-topology
work=$(mktemp -d /var/tmp/topology-test.XXXXXX)
chmod 755 "$work"
cp "$BIN/libtopology_greedy.so" "$work/topology_greedy.so"
# greedy-tree predicts the plugin's splits.
build -p greedy-tree
printf 'RouteSeq=%s\nRouteRem=%s\nRouteLogSplits=yes\nTopologyDelegate=tree\n' $SEQ $REM >"$work/greedy.conf"
printf '%s\n' 'SwitchName=s1 Nodes=n[1-8]' 'SwitchName=s2 Nodes=n[9-16]' 'SwitchName=top Switches=s[1-2]' \
  >"$work/topology.conf"

cluster_up --nodes 16 --slurm --release "$RELEASE" --plugindir "$work" --topology greedy \
  --greedy-conf "$work/greedy.conf" --topology-conf "$work/topology.conf" --treewidth $TREEWIDTH
trap 'cd "$ROOT"; "$TC" down >/dev/null 2>&1; rm -rf "$work"' EXIT
eval "$("$TC" env)"
LOGDIR=$(dirname "$(dirname "$SLURM_CONF")")/log
cd "$work"

# --- delegate -----------------------------------------------------------------------------------
default_delegate=default
[[ $RELEASE == 26.05 ]] && default_delegate=flat
[[ $(scontrol show config | awk '$1 == "TopologyPlugin" {print $3}') == topology/greedy ]] ||
  fail "TopologyPlugin is not topology/greedy: $(scontrol show config | grep -i topology)"
# scontrol loads the topology plugin to print it; -v shows the plugin's verbose line.
scontrol -v show topology >"$work/topology.out" 2>&1 || fail "scontrol show topology: $(cat "$work/topology.out")"
grep -q "everything else is topology/tree " "$work/topology.out" ||
  fail "scontrol -v show topology does not name topology/tree as the delegate: $(cat "$work/topology.out")"
scontrol show topology >"$work/topology.greedy" 2>&1 || fail "scontrol show topology: $(cat "$work/topology.greedy")"
grep -q "SwitchName=s1 .*Nodes=n\[1-8\]" "$work/topology.greedy" && grep -q "SwitchName=s2 .*Nodes=n\[9-16\]" "$work/topology.greedy" ||
  fail "scontrol show topology does not print topology.conf's switches: $(cat "$work/topology.greedy")"
pass "TopologyPlugin=topology/greedy loaded, delegating to topology/tree; scontrol show topology prints its switches"

# --- split --------------------------------------------------------------------------------------
for h in $("$TC" hosts); do
  echo "$h $(stat -c %s "$LOGDIR/slurmd-$h.log" 2>/dev/null || echo 0)"
done >"$work/offsets"
got=$(timeout 60 srun -N16 hostname 2>"$work/srun.err" | sort -V | tr '\n' ' ') ||
  fail "srun -N16 hostname: $(cat "$work/srun.err")"
[[ $got == "$(seq -f 'n%g' 1 16 | tr '\n' ' ')" ]] || fail "srun -N16 hostname printed '$got'"
"$CARGO_TARGET_DIR/debug/greedy-tree" plan --hosts "srun,n[1-16]" --seq $SEQ --rem $REM \
  --max-fanout $TREEWIDTH --slurm-release "$RELEASE" --format json >"$work/plan.json" || fail "greedy-tree plan"
python3 "$CHECK" "$work/plan.json" $TREEWIDTH "$work/srun.err" "$LOGDIR" "$work/offsets" topology/greedy ||
  fail "the forwarding tree of srun -N16 is not the plan of greedy-tree plan --slurm-release $RELEASE"
pass "srun -N16 hostname ran on every host along greedy-tree plan --slurm-release $RELEASE, TreeWidth $TREEWIDTH"
# Every split the plugin made (slurmctld's RPCs, each forwarding slurmd) must be the greedy
# plan's top level for its list.
checked=0
while read -r line; do
  # "topology/greedy: split M hosts FIRST..LAST tree_width W greedy into K: HEAD+REST …"
  read -r _ m _ range _ tw _ _ k rest <<<"${line#*topology/greedy: }"
  first=${range%..*} last=${range#*..}
  ((m == ${last#n} - ${first#n} + 1)) || fail "a split of a list that is not contiguous: $line"
  want=$("$CARGO_TARGET_DIR/debug/greedy-tree" plan --hosts "sender,n[${first#n}-${last#n}]" \
    --seq $SEQ --rem $REM --max-fanout "$tw" --format json |
    python3 -c 'import json, sys
nodes = json.load(sys.stdin)["nodes"]
kids = [n for n in nodes if n["parent"] == 0]
print(len(kids), " ".join("%s+%d" % (n["host"], n["subtree"][1] - n["subtree"][0] - 1) for n in kids))')
  [[ "${k%:} $rest" == "$want" ]] || fail "split of $range is not the greedy plan: got '${k%:} $rest', want '$want'"
  checked=$((checked + 1))
done < <(cat "$LOGDIR"/slurmd-*.log "$LOGDIR/slurmctld.log" | grep -o 'topology/greedy: split .*' | sort -u)
((checked > 0)) || fail "no topology/greedy split was logged for srun -N16"
pass "all $checked distinct splits logged by slurmctld and slurmd are the greedy plan of their list"

# --- placement ----------------------------------------------------------------------------------
# Where a fixed sequence of jobs runs: an exclusive 3-node job, then -N6 beside it, then -N4
# --switches=1. Printed as "JOB NODES" lines.
placement() {
  local hold state t
  hold=$(sbatch --parsable -N3 --exclusive -o /dev/null --wrap 'sleep 600') || fail "sbatch"
  for ((t = 0; t < 300; t++)); do
    state=$(squeue -h -j "$hold" -o %T)
    [[ $state == RUNNING ]] && break
    sleep 0.1
  done
  [[ $state == RUNNING ]] || fail "the 3-node job did not start: ${state:-gone}"
  echo "hold $(squeue -h -j "$hold" -o %N)"
  echo "six $(timeout 60 srun -N6 hostname 2>>"$work/placement.err" | sort -V | tr '\n' ' ')"
  echo "switch $(timeout 60 srun -N4 --switches=1 hostname 2>>"$work/placement.err" | sort -V | tr '\n' ' ')"
  scancel "$hold"
  for ((t = 0; t < 300; t++)); do
    [[ -z $(squeue -h -j "$hold" -o %T 2>/dev/null) ]] && break
    sleep 0.1
  done
}
placement >"$work/placement.greedy"
# Each job within one switch: topology/tree's placement (flat's would give -N6 n[4-9]).
while read -r job nodes; do
  nums=$(tr -d 'n' <<<"$nodes" | tr ',[]-' '    ')
  lo=$(tr ' ' '\n' <<<"$nums" | grep . | sort -n | head -1)
  hi=$(tr ' ' '\n' <<<"$nums" | grep . | sort -n | tail -1)
  ((hi <= 8 || lo >= 9)) || fail "job '$job' spans both switches ($nodes): not topology/tree's placement"
done <"$work/placement.greedy"
pass "placement as topology/tree: $(tr '\n' ';' <"$work/placement.greedy")"

# --- fault --------------------------------------------------------------------------------------
printf 'RouteSeq=%s\nRouteRem=%s\nTopologyDelegate=nosuch\n' $SEQ $REM >"$work/bad.conf"
if [[ $RELEASE == 24.11 ]]; then # srun loads the topology plugin itself on 24.11
  GREEDY_CONF=$work/bad.conf timeout 60 srun -N4 true 2>"$work/bad.err" || fail "srun with a bad greedy.conf: $(cat "$work/bad.err")"
  out=$(cat "$work/bad.err")
else
  out=$(GREEDY_CONF=$work/bad.conf scontrol show topology 2>&1) || fail "scontrol show topology with a bad greedy.conf: $out"
fi
[[ $(grep -c "no topology_nosuch.so in .*; delegating to topology/$default_delegate" <<<"$out") == 1 ]] ||
  fail "a missing delegate is not named once: $out"
pass "greedy.conf naming a missing delegate: one line naming it, topology/$default_delegate used, the command ran"

# --- a broken greedy.conf: Slurm's own split, said once by each daemon ---------------------------
cp "$(dirname "$SLURM_CONF")/greedy.conf" "$work/good.conf"
printf 'RouteSeq=fast\nRouteLogSplits=yes\nTopologyDelegate=tree\n' >"$(dirname "$SLURM_CONF")/greedy.conf"
"$TC" restart-slurm >/dev/null || fail "Slurm did not come back with a broken greedy.conf"
for h in $("$TC" hosts); do echo "$h $(stat -c %s "$LOGDIR/slurmd-$h.log")"; done >"$work/offsets"
got=$(timeout 60 srun -N16 hostname 2>"$work/srun.err" | sort -V | tr '\n' ' ') ||
  fail "srun -N16 hostname with a broken greedy.conf: $(cat "$work/srun.err")"
[[ $got == "$(seq -f 'n%g' 1 16 | tr '\n' ' ')" ]] || fail "srun -N16 hostname with a broken greedy.conf printed '$got'"
for h in $("$TC" hosts); do
  # The whole log since the restart: the line is written when slurmd loads the plugin.
  n=$(grep -c "topology/greedy: .*RouteSeq.*; the delegate splits every host list" "$LOGDIR/slurmd-$h.log" || true)
  ((n >= 1)) || fail "slurmd on $h does not say why greedy.conf was ignored"
done
while read -r h off; do
  ! tail -c +$((off + 1)) "$LOGDIR/slurmd-$h.log" | grep -q "topology/greedy: split" ||
    fail "slurmd on $h split with greedy's plan although greedy.conf was ignored"
done <"$work/offsets"
cp "$work/good.conf" "$(dirname "$SLURM_CONF")/greedy.conf"
pass "broken greedy.conf: every slurmd says why, the job ran on Slurm's own split"

# --- removal ------------------------------------------------------------------------------------
sed -i 's|^TopologyPlugin=topology/greedy$|TopologyPlugin=topology/tree|' "$SLURM_CONF"
rm "$work/topology_greedy.so"
"$TC" restart-slurm >/dev/null || fail "Slurm did not come back with TopologyPlugin=topology/tree"
for h in $("$TC" hosts); do echo "$h $(stat -c %s "$LOGDIR/slurmd-$h.log")"; done >"$work/offsets"
ctl_offset=$(stat -c %s "$LOGDIR/slurmctld.log")
placement >"$work/placement.tree"
diff "$work/placement.greedy" "$work/placement.tree" >&2 ||
  fail "jobs are placed differently under topology/tree alone (above: greedy's, then tree's)"
scontrol show topology >"$work/topology.tree" 2>&1
diff "$work/topology.greedy" "$work/topology.tree" >&2 ||
  fail "scontrol show topology differs under topology/tree alone"
got=$(timeout 60 srun -N16 hostname 2>"$work/srun.err" | sort -V | tr '\n' ' ') ||
  fail "srun -N16 hostname under topology/tree: $(cat "$work/srun.err")"
[[ $got == "$(seq -f 'n%g' 1 16 | tr '\n' ' ')" ]] || fail "srun -N16 hostname under topology/tree printed '$got'"
while read -r h off; do
  ! tail -c +$((off + 1)) "$LOGDIR/slurmd-$h.log" | grep -q "topology/greedy" ||
    fail "slurmd on $h still names topology/greedy after it was removed"
done <"$work/offsets"
! tail -c +$((ctl_offset + 1)) "$LOGDIR/slurmctld.log" | grep -q "topology/greedy" ||
  fail "slurmctld still names topology/greedy after it was removed"
pass "topology/greedy removed and Slurm restarted on the same state: the same placement and topology, jobs run, no trace of it"
echo "$TAG: all passed"
