#!/usr/bin/env bash
# Where a one-child MPI_Comm_spawn's time goes under greedyrun, phase by phase, for MPICH 5
# (PMI-1) and Open MPI 5 (PMIx): JOBS jobs per library of tests/mpi/spawn_latency.c spawning
# one child ROUNDS times on one loopback pseudo-host, greedyd logging at debug level (each line
# timed to the microsecond); prints the median of each phase over the rounds after each job's
# first, from the agent's log:
#   ask→add        the requester's spawn reaches the node service → the agent is told to add
#                  the child (up to greedyrun, placed, down again)
#   add→added      the node service serves the child's namespace
#   added→start    the agent is told to fork (a round trip through greedyrun in two phases)
#   start→forked   the child's wire-up variables and fork/exec
#   forked→first   exec, the MPI library's loading and its init up to its first PMI/PMIx message
#   first→connect  the rest of the child's init: Open MPI's up to the child's first name-service
#                  put at node 0 (its connect back to the parent); MPICH's up to the return (its
#                  child connects over MPICH's own network; neither child fences before)
#   rest           until MPI_Comm_spawn returns in the parent (its own clock, from the call)
#   answered       (not on the critical path) fork → the requester's answer is on this node
# and the floor outside any launcher: an exec of a program that is linked with the library and
# makes no MPI call, and the same program as a singleton (MPI_Init and MPI_Finalize).
# usage: tests/mpi/spawn-phases.sh [JOBS] [ROUNDS]   (default 3 jobs of 6 rounds)
#        GREEDYRUN=/path/to/greedyrun tests/mpi/spawn-phases.sh   (another build, to compare)
set -euo pipefail

TAG="spawn-phases"
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$ROOT/tests/mpi/clients.sh"
. "$ROOT/tests/launcher/loopback.sh"

jobs=${1:-3} rounds=${2:-6}
loopback_bench spawn-phases
G=${GREEDYRUN:-$BIN}
MPICH5=${GREEDY_MPICH5:-/var/tmp/greedy-mpich5}
ompi=(OPAL_PREFIX="$OMPI5" OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo)
printf '#include <mpi.h>\nint main(void) { int f; MPI_Initialized(&f); return f; }\n' >"$work/linked.c"
for lib in mpich5 ompi5; do
  cc=("$MPICH5/bin/mpicc")
  [[ $lib == mpich5 ]] || cc=(env OPAL_PREFIX="$OMPI5" "$OMPI5/bin/mpicc")
  "${cc[@]}" -O1 -o "$work/sl-$lib" "$ROOT/tests/mpi/spawn_latency.c"
  "${cc[@]}" -O1 -o "$work/linked-$lib" "$work/linked.c"
done

# floor CMD...: the median wall time of 15 runs, in ms.
floor() {
  local i s
  for ((i = 0; i < 15; i++)); do
    s=$(date +%s%N)
    "$@" >/dev/null 2>&1 || fail "$*: exit $?"
    echo $((($(date +%s%N) - s) / 1000))
  done | sort -n | awk '{v[NR] = $1} END {printf "%.1f", v[int((NR + 1) / 2)] / 1000}'
}

for lib in mpich5 ompi5; do
  cmd=("$G" --rsh "$work/localsh" -H "$(loopback_hosts 1 2)" --progress 0 --oversubscribe -n 1 "$work/sl-$lib" 1 "$rounds")
  [[ $lib == mpich5 ]] || cmd=(env "${ompi[@]}" "${cmd[@]:0:5}" --pmi pmix "${cmd[@]:5}")
  for ((j = 0; j < jobs; j++)); do
    GREEDY_LOG=debug timeout 300 "${cmd[@]}" >"$work/$lib-$j.log" 2>&1 || fail "$lib job $j: exit $? ($(tail -3 "$work/$lib-$j.log"))"
  done
  (
    [[ $lib == mpich5 ]] || export "${ompi[@]}"
    echo "$lib: exec of a program linked with it $(floor "$work/linked-$lib") ms, as a singleton (MPI_Init, MPI_Finalize) $(floor "$work/sl-$lib" 1 0) ms"
  )
  python3 - "$work/$lib"-*.log <<'PY'
import datetime, re, statistics, sys
names = ["ask→add", "add→added", "added→start", "start→forked", "forked→first", "first→connect",
         "rest", "spawn (parent's clock)", "answered", "child fences before the return"]
rows = []
for path in sys.argv[1:]:
    ev, took = [], []
    for line in open(path):
        m = re.search(r"(\d{4}-\d\d-\d\dT[\d:.]+)Z\s+\w+ (?:.*?: )?[a-z_]+(?:::[a-z_0-9]+)+: (.*)$", line)
        if m:
            ev.append((datetime.datetime.fromisoformat(m.group(1)).timestamp() * 1e3, m.group(2)))
        m = re.search(r"round \d+ took ([\d.]+)", line)
        if m:
            took.append(float(m.group(1)) * 1e3)
    ev.sort()
    asks = [i for i, (_, m) in enumerate(ev) if m.startswith(("spawn asked", "PMIx_Spawn asked"))]
    for k, i in list(enumerate(asks))[1:len(took)]:
        t0, after = ev[i][0], ev[i:]
        first = lambda p: next(t for t, m in after if p(m))
        ns = next(re.search(r"nspace=(\S+)", m).group(1) for _, m in after if m.startswith("adding child"))
        mine = lambda m: f"nspace={ns} " in m + " " or f'nspace: "{ns}"' in m
        add, added = first(lambda m: m.startswith("adding child")), first(lambda m: m.startswith("child added"))
        start, forked = first(lambda m: m.startswith("starting child ranks")), first(lambda m: m.startswith("child rank forked"))
        answered = first(lambda m: m.startswith("spawn answered"))
        msg = first(lambda m: m.startswith(("rank's first PMI message", "PMIx client connected")) and mine(m))
        # The parent's clock started before t0: the return is at t0 + took at the latest.
        end = t0 + took[k]
        put = next((t for t, m in after if "request=Put" in m and mine(m)), end)
        fenced = any(t < end for t, m in after if m.startswith("rank entered fence") and mine(m))
        rows.append([add - t0, added - add, start - added, forked - start, msg - forked,
                     min(put, end) - msg, end - min(put, end), took[k], answered - forked, fenced])
print(f"| phase ({len(rows)} rounds) | median ms | min–max |")
print("|---|---|---|")
for j, name in enumerate(names[:-1]):
    col = [r[j] for r in rows]
    print(f"| {name} | {statistics.median(col):.2f} | {min(col):.2f}–{max(col):.2f} |")
print(f"rounds whose child entered a fence before the return: {sum(r[-1] for r in rows)}")
PY
done
