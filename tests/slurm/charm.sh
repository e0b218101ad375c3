#!/bin/bash
# tests/slurm/charm.sh [--release R]: Charm++ (the charm4py 1.1 wheel, netlrts) under
# `srun --mpi=greedy` with no protocol named, on the emulated Slurm cluster of the
# machine's release (22.05) or (--release 24.11|26.05) of that release, 4 hosts x 2 tasks (8 PEs).
# The wheel exists for CPython 3.11 only, which those releases' Debians lack: there the root
# sees the venv's own interpreter (testcluster --root-bind) and the `stranger` case is skipped
# (its second user exists on the machine only). The cases:
#   ok          chares on every PE, a broadcast, a sum and a gather checked; each PE's print
#               reaches srun labelled with its own task (`srun -l`) from the host Slurm put it on
#   exit3       charm.exit(3): srun exits 3 and says why (the process itself exits 1: a netlrts
#               process can only exit 0 or 1 once it sent `ending`; its agent reports the 3)
#   abort       charm.abort(...): srun exits 1 (as charmrun), the message on rank 0's stderr
#   fail-start  task 5 exits 5 before charm.start(): the job ends at once, srun exits 5 and
#               names n3 and task 5's code, and task 5's stderr says the job was aborted and why
#   +p8         with SLURM_GREEDY_PROTOCOL=charm: refused by srun before anything starts (a
#               non-SMP client would die silently)
# and nothing of a step left on any host after each case. Needs root; about 1 min.
# Env: CARGO_TARGET_DIR (default <repo>/target), GREEDY_CHARM4PY (the venv).
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=4
RELEASE="" RELEASE_ROOT=""
[[ ${1:-} != --release ]] || release_select "${2:-}"
TAG=slurm-charm${RELEASE:+ $RELEASE}

need_root
need_shared_target

. "$ROOT/tests/slurm/mpi-build.sh"
source "$ROOT/tests/charm/charm4py.sh"
# On another release: the venv's interpreter (the python3.11 installation it was made from).
binds=()
if [[ -n $RELEASE_ROOT ]]; then
  base=$("$CHARM/bin/python" -c 'import sys; print(sys.base_prefix)')
  if [[ $base == /usr ]]; then
    binds=(--root-bind /usr/bin/python3.11 --root-bind /usr/lib/python3.11)
  else
    binds=(--root-bind "$base")
  fi
fi

cluster_up --nodes "$NODES" --slurm --plugindir "$PLUGDIR" ${RELEASE:+--release "$RELEASE"} "${binds[@]}"
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/slurm-charm
mkdir -p "$WORK"
cd "$WORK"
cp "$ROOT/tests/charm/prog.py" "$WORK/prog.py"
# No protocol named: every node serves every family, and the tasks speak netlrts.

JOB_RE='slurmstepd|prog\.py'
. "$ROOT/tests/cluster/leftovers.sh"

# run NAME ARGS... : srun -l on 4 hosts x 2 with prog.py ARGS; sets RC, OUT, ERR, SECS
run() {
  local name=$1 t0=${EPOCHREALTIME/./}
  shift
  set +e
  timeout -k 5 90 srun -l -N"$NODES" -n$((2 * NODES)) --ntasks-per-node=2 --mpi=greedy \
    "$CHARM/bin/python" "$WORK/prog.py" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null
  RC=$?
  set -e
  SECS=$(awk -v a="$t0" -v b="${EPOCHREALTIME/./}" 'BEGIN { printf "%.2f", (b - a) / 1e6 }')
  OUT=$(<"$WORK/$name.out")
  ERR=$(<"$WORK/$name.err")
}

run ok ok
((RC == 0)) || fail "ok: exit $RC: $ERR $OUT"
grep -q "^0: charm-e2e: pes=8 sum=252 hosts=4 ok$" <<<"$OUT" || fail "ok: summary: $OUT $ERR"
for pe in $(seq 0 7); do
  # Block placement: tasks 2i and 2i+1 on n(i+1).
  grep -qx "$pe: charm-e2e: pe $pe on n$((pe / 2 + 1))" <<<"$OUT" ||
    fail "ok: no line of PE $pe labelled $pe from n$((pe / 2 + 1)): $OUT"
done
no_leftovers ok
pass "8 PEs on 4 hosts: broadcast, sum and gather checked; each PE's print labelled with its task, ${SECS}s"

run exit3 exit3
((RC == 3)) || fail "exit3: expected 3, got $RC: $ERR"
grep -q "exit code 3: rank 0 on n1 ended with charm.exit(3)" <<<"$ERR" || fail "exit3: srun does not say why: $ERR"
no_leftovers exit3
pass "charm.exit(3): srun exits 3 and says why"

run abort abort
((RC == 1)) || fail "abort: expected 1 (as charmrun and greedyrun), got $RC: $ERR"
grep -q "^0: .*charm-e2e deliberate abort" <<<"$ERR" || fail "abort: message missing: $ERR"
no_leftovers abort
pass "charm.abort: srun exits $RC, the message on rank 0's stderr"

run fail-start fail-start=5
((RC == 5)) || fail "fail-start: expected 5, got $RC: $ERR"
grep -q "n3: task 5: Exited with exit code 5" <<<"$ERR" || fail "fail-start: srun does not name n3/task 5: $ERR"
# (the code in the reason is 1 when slurmstepd reaped task 5 before the agent saw it end)
grep -Eq "^5: mpi/greedy: job aborted: .*rank 5 (on n3 )?exited with code [0-9]+ before connecting" <<<"$ERR" ||
  fail "fail-start: no abort note on task 5's stderr: $ERR"
(($(awk -v s="$SECS" 'BEGIN { print (s < 30) }'))) || fail "fail-start: took ${SECS}s"
no_leftovers fail-start
pass "task 5 exits 5 before connecting: job ends in ${SECS}s (srun $RC), n3 and the cause named"

# charmrun's options are checked when the step is named a Charm++ one (srun cannot strip them).
SLURM_GREEDY_PROTOCOL=charm run plus-p ok +p8
((RC != 0)) || fail "+p8: srun exited 0"
grep -q "+p8: srun passes it to every process" <<<"$ERR" || fail "+p8: $ERR"
[[ -z $OUT ]] || fail "+p8: something ran: $OUT"
pass "+p8 refused by srun with a reason"
if [[ -n $RELEASE_ROOT ]]; then
  echo "$TAG: all passed (the stranger case runs on the machine's release only)"
  exit 0
fi
# stranger: another local user (tests/security/stranger.sh) sends `initnode` claiming rank 0,
# then `abort`, PMI aborts and silent half headers to every port of n1 while the PEs start.
source "$ROOT/tests/security/stranger.sh"
stranger_setup
set +e
timeout -k 5 90 srun -l -N"$NODES" -n$((2 * NODES)) --ntasks-per-node=2 --mpi=greedy \
  sh -c "sleep 5; exec $CHARM/bin/python $WORK/prog.py ok" >"$WORK/stranger.out" 2>"$WORK/stranger.err" </dev/null &
STEP=$!
sleep 3
stranger_attack n1 3 $WORK/stranger.log
stranger_wait
wait "$STEP"
RC=$?
set -e
OUT=$(<"$WORK/stranger.out")
ERR=$(<"$WORK/stranger.err")
((RC == 0)) || fail "stranger: srun exited $RC: $ERR; stranger: $(<"$WORK/stranger.log")"
grep -q "^0: charm-e2e: pes=8 sum=252 hosts=4 ok$" <<<"$OUT" || fail "stranger: summary: $OUT $ERR"
! grep -q "stranger" <<<"$OUT$ERR" || fail "stranger: the stranger's text reached the job's output: $OUT $ERR"
! grep -qi "warn" <<<"$ERR" || fail "stranger: srun printed a warning about the stranger: $ERR"
no_leftovers stranger
pass "another user's initnode+abort to every port of n1 changed nothing; no warning in srun's stderr"
echo "$TAG: all passed"
