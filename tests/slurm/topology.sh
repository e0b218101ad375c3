#!/usr/bin/env bash
# tests/slurm/topology.sh --release 24.11|26.05: topology/greedy (issue 17) on an emulated
# 16-host cluster of that release (testcluster up --release), TopologyPlugin=topology/greedy:
#   split     srun -N16 hostname reaches every host, and the splits the plugin logged
#             (RouteLogSplits=yes) are the greedy plan: on 24.11 the whole tree, srun's split
#             included, is `greedy-tree plan` capped at TreeWidth 16 (tests/slurm/route_tree.py);
#             on 26.05 srun splits its first level itself (hostlist_split_treewidth): every
#             split logged there (slurmctld's RPCs, each forwarding slurmd) is the greedy plan's
#             top level for its own list
#   delegate  scontrol show config names topology/greedy, scontrol show topology answers (the
#             delegate's, topology/default on 24.11, flat on 26.05) and with -v names it
#   fault     greedy.conf naming a delegate that does not exist: srun (24.11) or scontrol
#             (26.05) says so once and uses the default delegate; the job still runs
# Needs root; about 1 min once built. Leaves no cluster, no process, no temp dir.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TC="$ROOT/slurm-conf/testcluster"
CHECK="$ROOT/tests/slurm/route_tree.py"
export GREEDY_TC_QUIET=1
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[[ ${1:-} == --release && -n ${2:-} ]] || { echo "usage: $0 --release 24.11|26.05" >&2; exit 2; }
. "$ROOT/tests/slurm/release.sh"
release_select "$2"
TAG="topology $RELEASE"
fail() { echo "$TAG: FAIL: $*" >&2; exit 1; }
pass() { echo "$TAG: ok: $*"; }
[[ $EUID -eq 0 ]] || fail "must run as root"
[[ $RELEASE =~ ^(24\.11|26\.05)$ ]] || fail "topology/greedy is for 24.11 and 26.05"
# SEQ/REM = 1/3: a tree several levels deep at 16 hosts, so a wrong split at any level shows.
SEQ=0.01 REM=0.03 TREEWIDTH=16 # Slurm's default TreeWidth from 23.11

(eval "$("$ROOT/slurm-conf/release-root" --build-env "$RELEASE")" &&
  CARGO_TARGET_DIR=$CARGO_TARGET_DIR/slurm-$RELEASE cargo build -q --release --locked -p greedy-slurm-topology) ||
  fail "building topology_greedy.so for Slurm $RELEASE"
cargo build -q --locked -p greedy-tree || fail "cargo build greedy-tree"
work=$(mktemp -d /var/tmp/topology-test.XXXXXX)
chmod 755 "$work"
cp "$CARGO_TARGET_DIR/slurm-$RELEASE/release/libtopology_greedy.so" "$work/topology_greedy.so"
printf 'RouteSeq=%s\nRouteRem=%s\nRouteLogSplits=yes\n' $SEQ $REM >"$work/greedy.conf"

# shellcheck source=../cluster/claim.sh
. "$ROOT/tests/cluster/claim.sh"
cluster_up --nodes 16 --slurm --release "$RELEASE" --plugindir "$work" --topology greedy \
  --greedy-conf "$work/greedy.conf"
trap 'cd "$ROOT"; "$TC" down >/dev/null 2>&1; rm -rf "$work"' EXIT
eval "$("$TC" env)"
LOGDIR=$(dirname "$(dirname "$SLURM_CONF")")/log
cd "$work"

# --- delegate -----------------------------------------------------------------------------------
delegate=default
[[ $RELEASE == 26.05 ]] && delegate=flat
[[ $(scontrol show config | awk '$1 == "TopologyPlugin" {print $3}') == topology/greedy ]] ||
  fail "TopologyPlugin is not topology/greedy: $(scontrol show config | grep -i topology)"
# scontrol loads the topology plugin to print it; -v shows the plugin's verbose line.
scontrol -v show topology >"$work/topology.out" 2>&1 || fail "scontrol show topology: $(cat "$work/topology.out")"
grep -q "everything else is topology/$delegate " "$work/topology.out" ||
  fail "scontrol -v show topology does not name topology/$delegate as the delegate: $(cat "$work/topology.out")"
pass "TopologyPlugin=topology/greedy loaded, delegating to topology/$delegate; scontrol show topology answers"

# --- split --------------------------------------------------------------------------------------
for h in $("$TC" hosts); do
  echo "$h $(stat -c %s "$LOGDIR/slurmd-$h.log" 2>/dev/null || echo 0)"
done >"$work/offsets"
got=$(timeout 60 srun -N16 hostname 2>"$work/srun.err" | sort -V | tr '\n' ' ') ||
  fail "srun -N16 hostname: $(cat "$work/srun.err")"
[[ $got == "$(seq -f 'n%g' 1 16 | tr '\n' ' ')" ]] || fail "srun -N16 hostname printed '$got'"
if [[ $RELEASE == 24.11 ]]; then
  "$CARGO_TARGET_DIR/debug/greedy-tree" plan --hosts "srun,n[1-16]" --seq $SEQ --rem $REM \
    --max-fanout $TREEWIDTH --format json >"$work/plan.json" || fail "greedy-tree plan"
  python3 "$CHECK" "$work/plan.json" $TREEWIDTH "$work/srun.err" "$LOGDIR" "$work/offsets" topology/greedy ||
    fail "the forwarding tree of srun -N16 is not the greedy plan"
  pass "srun -N16 hostname ran on every host along the greedy tree (srun's split included), TreeWidth $TREEWIDTH"
else
  # srun splits its own first level (hostlist_split_treewidth); every split the plugin made
  # (slurmctld's RPCs, each forwarding slurmd) must be the greedy plan's top level for its list.
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
  pass "srun -N16 hostname ran on every host; all $checked distinct splits logged by slurmctld and slurmd are the greedy plan of their list"
fi

# --- fault --------------------------------------------------------------------------------------
printf 'RouteSeq=%s\nRouteRem=%s\nTopologyDelegate=nosuch\n' $SEQ $REM >"$work/bad.conf"
if [[ $RELEASE == 24.11 ]]; then # srun loads the topology plugin itself on 24.11
  GREEDY_CONF=$work/bad.conf timeout 60 srun -N4 true 2>"$work/bad.err" || fail "srun with a bad greedy.conf: $(cat "$work/bad.err")"
  out=$(cat "$work/bad.err")
else
  out=$(GREEDY_CONF=$work/bad.conf scontrol show topology 2>&1) || fail "scontrol show topology with a bad greedy.conf: $out"
fi
[[ $(grep -c "no topology_nosuch.so in .*; delegating to topology/$delegate" <<<"$out") == 1 ]] ||
  fail "a missing delegate is not named once: $out"
pass "greedy.conf naming a missing delegate: one line naming it, topology/$delegate used, the command ran"
echo "$TAG: all passed"
