#!/bin/bash
# tests/tools/libi.sh: libgreedy and greedy-stack on the emulated Slurm cluster (22.05).
#   beside     a hung MPI job runs (srun -N3 -n6 --mpi=greedy tests/mpi/hang.c: rank 5 spins in
#              compute(), ranks 0-4 wait in MPI_Barrier); the C tool libgreedy/examples/c/
#              hostnames.c, built against include/greedy/libi.h and libgreedy.so.0, launches
#              one daemon on every node of that job (srun --overlap --jobid) and gathers
#              their host names: each of n1..n3 once, in rank order
#   stack      greedy-stack --job J.0 prints the merged stacks: [0-4] through
#              wait_for_the_others, [5] through compute; --format json and svg are well formed
#   greedyrun  the same hung job under greedyrun over ssh; greedy-stack --greedy-job
#              greedy<PID> --hosts n[1-3] finds it through greedyrun's daemons
# Nothing is left on any host after each.
# Env: CARGO_TARGET_DIR (default <repo>/target).
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=3
need_shared_target
need_root

. "$ROOT/tests/slurm/mpi-build.sh"
"$MPICH5/bin/mpicc" -g -O0 -o "$BINDIR/hang" "$ROOT/tests/mpi/hang.c" || fail "PyPI MPICH's mpicc"
build -p greedy-launcher -p greedy-libi # BIN: the debug directory
LIB=$BINDIR/libgreedy
mkdir -p "$LIB"
ln -sf "$BIN/libgreedy_libi.so" "$LIB/libgreedy.so.0"
ln -sf libgreedy.so.0 "$LIB/libgreedy.so"
cc -Wall -Wextra -Werror -I"$ROOT/libgreedy/include" -o "$BINDIR/hostnames" \
  "$ROOT/libgreedy/examples/c/hostnames.c" -L"$LIB" -lgreedy || fail "cc hostnames.c"
export LD_LIBRARY_PATH=$LIB

cluster_up --nodes "$NODES" --slurm --plugindir "$PLUGDIR" --mpi-default greedy
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/libi
mkdir -p "$WORK"
cd "$WORK"
# shellcheck disable=SC2034 # read by leftovers.sh
JOB_RE='slurmstepd|/hang|greedy-stack|hostnames|greedyd'
. "$ROOT/tests/cluster/leftovers.sh"

# wait_ready FILE N: N "ready" lines in FILE within 60 s.
wait_ready() {
  for _ in $(seq 300); do
    (($(grep -c ' ready$' "$1" 2>/dev/null || true) >= $2)) && return 0
    sleep 0.2
  done
  fail "the hung job never got ready: $(cat "$1")"
}
# merged_stacks NAME: the lines through main > wait_for_the_others > PMPI_Barrier hold ranks 0-4
# and only them (their innermost frames may differ), the one through main > compute rank 5.
MERGED_CHECK=$(
  cat <<'PY'
import re, sys
def ranks(text):
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out
barrier, compute = set(), set()
for line in sys.stdin:
    m = re.match(r"\[([0-9,-]+)\] (.*)", line)
    if m and "main > wait_for_the_others > PMPI_Barrier" in m[2]:
        barrier |= ranks(m[1])
    if m and m[2].endswith("main > compute"):
        compute |= ranks(m[1])
assert barrier == set(range(5)) and compute == {5}, (sys.argv[1], barrier, compute)
PY
)
merged_stacks() { python3 -c "$MERGED_CHECK" "$1" <<<"$OUT" || fail "$1: $OUT $ERR"; }

srun -N3 -n6 --mpi=greedy "$BINDIR/hang" >"$WORK/hang.out" 2>&1 &
HANG=$!
at_exit "kill $HANG 2>/dev/null"
wait_ready "$WORK/hang.out" 6
JOB=$(squeue -h -o %i | head -1)

run_timed beside 60 "$BINDIR/hostnames" job "$JOB"
((RC == 0)) || fail "beside: exit $RC: $OUT $ERR"
[[ $(grep -c '^hello [0-2]/3 on n[1-3]$' <<<"$OUT") == 3 ]] || fail "beside: not 3 daemons: $OUT $ERR"
[[ $(grep -o 'on n[1-3]$' <<<"$OUT" | sort -u | wc -l) == 3 ]] || fail "beside: not one per node: $OUT"
pass "a C tool launched one daemon on each node of running job $JOB through libgreedy and gathered from them in ${SECS}s"

run_timed stack 120 "$BIN/greedy-stack" --job "$JOB.0"
((RC == 0)) || fail "stack: exit $RC: $OUT $ERR"
merged_stacks stack
pass "greedy-stack --job $JOB.0: [0-4] in the barrier, [5] in compute, in ${SECS}s"
run_timed json 120 "$BIN/greedy-stack" --job "$JOB.0" --format json
python3 -c 'import json,sys; t=json.load(sys.stdin); assert "children" in t, t' <<<"$OUT" || fail "json: $OUT $ERR"
run_timed svg 120 "$BIN/greedy-stack" --job "$JOB.0" --format svg -o "$WORK/stack.svg"
python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$WORK/stack.svg" ||
  fail "svg: not well-formed"
grep -q compute "$WORK/stack.svg" || fail "svg: no compute frame"
pass "--format json and svg"

scancel "$JOB"
wait "$HANG" || true
no_leftovers beside

"$BIN/greedyrun" --hosts "n[1-$NODES]" --ppn 2 --progress 0 "$BINDIR/hang" >"$WORK/ghang.out" 2>&1 &
GHANG=$!
at_exit "kill $GHANG 2>/dev/null"
wait_ready "$WORK/ghang.out" 6
run_timed greedyrun 120 "$BIN/greedy-stack" --greedy-job "greedy$GHANG" --hosts "n[1-$NODES]"
((RC == 0)) || fail "greedyrun: exit $RC: $OUT $ERR"
merged_stacks greedyrun
pass "greedy-stack on a greedyrun job (greedy$GHANG, 3 hosts over ssh) in ${SECS}s"
kill -TERM "$GHANG"
wait "$GHANG" || true
no_leftovers greedyrun
