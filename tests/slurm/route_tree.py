#!/usr/bin/env python3
"""Checks that a Slurm launch followed a planned tree (tests/slurm/route.sh).

usage: route_tree.py PLAN.json TREE_WIDTH SRUN_STDERR LOGDIR OFFSETS [PLUGIN]

PLAN.json is `greedy-tree plan --hosts "srun,<hosts>" --format json` (with --slurm-release R):
position 0 is srun, the rest the sorted host list. Where the plan says srun splits its first
level itself (`"srun_splits_with_plugin": false`, 25.05 on), srun must log no split and its
children are checked through the forward lists their own splits name. route/greedy (PLUGIN,
the default; or topology/greedy) logs every split it makes as
`route/greedy: split M hosts FIRST..LAST tree_width W greedy into K: HEAD+REST ...`
(RouteLogSplits=yes): srun's on its stderr, each forwarding slurmd's in slurmd-HOST.log. For every
planned node with children, the line it must have logged is derived from the plan and looked
up in that node's log, reading only what was written after OFFSETS (a file of `HOST BYTES`
lines taken before the job). Prints the tree as found and exits 1 naming the first mismatch.
"""
import json
import os
import re
import sys


def main():
    plan_path, tree_width, srun_err, logdir, offsets_path = sys.argv[1:6]
    plugin = sys.argv[6] if len(sys.argv) > 6 else "route/greedy"
    doc = json.load(open(plan_path))
    plan = doc["nodes"]
    srun_splits = doc.get("srun_splits_with_plugin", True)
    offsets = {}
    for line in open(offsets_path):
        host, size = line.split()
        offsets[host] = int(size)

    def new_log(host):
        path = os.path.join(logdir, f"slurmd-{host}.log")
        with open(path, "rb") as f:
            f.seek(offsets.get(host, 0))
            return f.read().decode(errors="replace")

    host = [n["host"] for n in plan]
    children = {i: [] for i in range(len(plan))}
    for n in plan:
        if n["parent"] is not None:
            children[n["parent"]].append(n["node_idx"])
    srun_text = open(srun_err).read()
    splits_by_srun = re.findall(re.escape(plugin) + r": split .*", srun_text)
    if len(splits_by_srun) != int(srun_splits):
        fail(f"srun logged {len(splits_by_srun)} splits, expected {int(srun_splits)}: {splits_by_srun}")
    checked = 0
    for v, kids in children.items():
        if not kids or (v == 0 and not srun_splits):
            continue
        start, end = plan[v]["subtree"]
        tail = " ".join(f"{host[c]}+{plan[c]['subtree'][1] - plan[c]['subtree'][0] - 1}" for c in kids)
        want = (f"{plugin}: split {end - start - 1} hosts {host[start + 1]}..{host[end - 1]} "
                f"tree_width {tree_width} greedy into {len(kids)}: {tail}")
        text = srun_text if v == 0 else new_log(host[v])
        found = [l for l in text.splitlines() if l.endswith(want)]
        where = "srun" if v == 0 else f"slurmd-{host[v]}.log"
        if not found and end - start - 1 == 1:
            # A list of one host has one split; from 25.05 topology_g_split_hostlist() makes
            # it without asking the plugin.
            print(f"  {host[v]:>5} -> {tail} (one host: Slurm's own)")
            continue
        if not found:
            got = [l.split(f"{plugin}: ", 1)[1] for l in text.splitlines() if f"{plugin}: split" in l]
            fail(f"{host[v]} did not split as planned\n  want: {want}\n  got in {where}: {got}")
        print(f"  {host[v]:>5} -> {tail}")
        checked += 1
    print(f"route_tree: all {checked} forwarding nodes split as planned ({len(plan) - 1} hosts)")


def fail(msg):
    print(f"route_tree: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
