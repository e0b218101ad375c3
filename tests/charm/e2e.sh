#!/usr/bin/env bash
# Charm++ (charm4py 1.1 wheel, netlrts) under `greedyrun` with no protocol flag on the emulated cluster.
#
# Cases, 4 hosts x 2 processes (8 PEs):
#   ok          chares on every PE, a broadcast, a sum and a gather; output checked, rc 0
#   exit3       charm.exit(3) -> greedyrun exits 3 (clients themselves exit 1 after `ending`)
#   abort       charm.abort(...) -> non-zero, the message and the rank named
#   fail-start  rank 5 exits 5 before charm.start() -> job ends 5, its host (n3) named
#   +p9         refused before anything starts (a non-SMP client would die silently)
#   session     ok and exit3 again as jobs on a session's agents (GREEDY_SESSION)
# and no process left behind after each case. charm4py 1.1 from PyPI is installed on first use
# (tests/charm/charm4py.sh). Needs root; ~1-2 min.
set -euo pipefail

TAG=charm-e2e
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
NODES=4

need_root
need_shared_target
build --release -p greedy-launcher

source "$ROOT/tests/charm/charm4py.sh"

# --- cluster (waits while another engineer's is up; takes only ours down) -------------------
cluster_up --nodes "$NODES" "$@"
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/charm
mkdir -p "$WORK"
cd "$WORK"
cp "$ROOT/tests/charm/prog.py" "$WORK/prog.py"

JOB_RE='greedyd|prog\.py'
source "$ROOT/tests/cluster/leftovers.sh"

# No protocol flag: every agent serves every family, and the ranks speak netlrts. Only the
# charmrun options (+pN) need --pmi charm, which drops or refuses them.
GR=("$BIN/greedyrun" --timeout 60 --progress 0 --hosts "n[1-$NODES]" --ppn 2 -n 8)
run() { # run NAME ARGS... : sets RC, OUT, ERR
  local name=$1
  shift
  set +e
  timeout 120 "${GR[@]}" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null
  RC=$?
  set -e
  OUT=$(<"$WORK/$name.out")
  ERR=$(<"$WORK/$name.err")
}
PY=("$CHARM/bin/python" "$WORK/prog.py")

run ok -- "${PY[@]}" ok
((RC == 0)) || fail "ok: exit $RC: $ERR $OUT"
grep -q "charm-e2e: pes=8 sum=252 hosts=4 ok" <<<"$OUT" || fail "ok: output: $OUT $ERR"
no_leftovers ok
pass "8 PEs on 4 hosts: broadcast, sum and gather checked"

run exit3 -- "${PY[@]}" exit3
((RC == 3)) || fail "exit3: expected 3, got $RC: $ERR"
no_leftovers exit3
pass "charm.exit(3) -> 3"

run abort -- "${PY[@]}" abort
((RC != 0)) || fail "abort: exit 0"
grep -q "deliberate abort" <<<"$ERR" || fail "abort: message missing: $ERR"
no_leftovers abort
pass "charm.abort -> $RC, message shown"

run fail-start -- "${PY[@]}" fail-start=5
((RC == 5)) || fail "fail-start: expected 5, got $RC: $ERR"
grep -q "rank 5 on n3" <<<"$ERR" || fail "fail-start: host not named: $ERR"
no_leftovers fail-start
pass "a process failing before connecting ends the job (5), host named"

run plus-p --pmi charm -- "${PY[@]}" +p9
((RC == 2)) || fail "+p9: expected 2, got $RC: $ERR"
grep -q "greedy starts 8 processes" <<<"$ERR" || fail "+p9: $ERR"
pass "+p9 refused up front"

run plus-p8 --pmi charm -- "${PY[@]}" ok +p8
((RC == 0)) && grep -q "pes=8 sum=252 hosts=4 ok" <<<"$OUT" || fail "+p8: exit $RC: $ERR $OUT"
no_leftovers plus-p8
pass "+p8 (= -n) accepted and dropped"
# The same program as a job on a session's agents (started once): no flag, same checks.
eval "$("$BIN/greedyrun" --timeout 60 --hosts "n[1-$NODES]" --ppn 2 --start-session)"
[[ -S ${GREEDY_SESSION:-} ]] || fail "session: no control socket"
GR=("$BIN/greedyrun" --timeout 60 --progress 0 -n 8)
run session-ok -- "${PY[@]}" ok
((RC == 0)) && grep -q "charm-e2e: pes=8 sum=252 hosts=4 ok" <<<"$OUT" || fail "session ok: exit $RC: $ERR $OUT"
run session-exit3 -- "${PY[@]}" exit3
((RC == 3)) || fail "session exit3: expected 3, got $RC: $ERR"
"$BIN/greedyrun" --end-session
unset GREEDY_SESSION
no_leftovers session
pass "on a session's agents: 8 PEs on 4 hosts checked, charm.exit(3) -> 3, nothing left"
echo "charm-e2e: all passed"
