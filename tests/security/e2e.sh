#!/usr/bin/env bash
# Issue 15 end to end: a second local user, created by this test, attacks the endpoints of a
# running greedyrun job on the emulated cluster, as a site's security review would
# (docs/security.md). Each case failed before the change it checks.
#   pmi        a plain job (PMI served by default): the stranger speaks PMI-1/PMI-2/Charm++/PMIx to
#              every port of n1 (claim rank 0, abort 77, silent half headers): the job runs to
#              its end with status 0 and nothing of the stranger's in its output
#   charm      the same against a Charm++ job (greedyrun --pmi charm) whose ranks connect late
#   pmix       Open MPI over --pmi pmix; rank 1 leaks its PMIX_* variables and starts late, the
#              stranger runs Open MPI with them first and holds silent connections: the job
#              still wires up (4 x "of 4: ok") and ends 0; the stranger is refused
#   hostname   a host named -oProxyCommand=... (command line and hostfile): exit 2, nothing ran
# and no process of the job left on any host after each case. Needs root; ~1-2 min.
set -euo pipefail

TAG=security-e2e
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=4

need_root
need_shared_target
build --release -p greedy-launcher

source "$ROOT/tests/charm/charm4py.sh"
source "$ROOT/tests/security/stranger.sh"
cluster_up --nodes "$NODES"
stranger_setup
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/security
mkdir -p "$WORK"
chmod 755 "$WORK"
cd "$WORK"

JOB_RE='greedyd|sleep 424|wireup|prog\.py'
source "$ROOT/tests/cluster/leftovers.sh"

GR=("$BIN/greedyrun" --timeout 60 --progress 0 --hosts "n[1-$NODES]" --ppn 2 -n 8)
run() { # run NAME ARGS... in the background: sets JOB
  local name=$1
  shift
  "${GR[@]}" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null &
  JOB=$!
}
finish() { # finish NAME: waits for JOB; sets RC, OUT, ERR
  set +e
  wait "$JOB"
  RC=$?
  set -e
  OUT=$(<"$WORK/$1.out")
  ERR=$(<"$WORK/$1.err")
}
clean_of_stranger() { # clean_of_stranger NAME: the stranger's text reached no output
  ! grep -q "stranger" <<<"$OUT$ERR" || fail "$1: the stranger's text is in the job's output: $OUT $ERR"
  ! grep -qi "abort" <<<"$ERR" || fail "$1: the job saw an abort: $ERR"
}

# --- pmi: a plain job, PMI served to every rank ----------------------------------------------
run pmi -- sh -c 'sleep 6; echo "done $GREEDY_RANK"'
sleep 2
stranger_attack n1 3 $WORK/pmi.stranger
stranger_wait
finish pmi
((RC == 0)) || fail "pmi: exit $RC (77 = the stranger's PMI abort): $ERR; stranger: $(<"$WORK/pmi.stranger")"
[[ $(grep -c '^done ' <<<"$OUT") == 8 ]] || fail "pmi: expected 8 ranks done: $OUT"
clean_of_stranger pmi
no_leftovers pmi
pass "pmi: the stranger probed $(grep -c '^stranger: ' "$WORK/pmi.stranger") port(s) of n1; the job ended 0 with 8 ranks done"

# --- charm: netlrts clients connect late -------------------------------------------------------
cp "$ROOT/tests/charm/prog.py" "$WORK/prog.py"
run charm --pmi charm -- sh -c "sleep 5; exec $CHARM/bin/python $WORK/prog.py ok"
sleep 2
stranger_attack n1 3 $WORK/charm.stranger
stranger_wait
finish charm
((RC == 0)) || fail "charm: exit $RC: $ERR; stranger: $(<"$WORK/charm.stranger")"
grep -q "charm-e2e: pes=8 sum=252 hosts=4 ok" <<<"$OUT" || fail "charm: output: $OUT $ERR"
clean_of_stranger charm
no_leftovers charm
pass "charm: the stranger's initnode+abort to every port of n1 changed nothing; 8 PEs checked"

# --- pmix: a stranger with a real rank's PMIx variables --------------------------------------
OMPI=$WORK/wireup-ompi
mpicc.openmpi -O1 -o "$OMPI" "$ROOT/tests/mpi/wireup.c"
LEAK=/tmp/greedy-security-leak # n1's private /tmp: the stranger on n1 reads it
# Rank 1 publishes its PMIx variables (as a careless job might) and starts late.
printf '%s\n' '#!/bin/sh' \
  'if [ "$GREEDY_RANK" = 1 ]; then' \
  "  env | grep -E '^(PMIX_|FLUX_JOB_ID)' >$LEAK.tmp; chmod 644 $LEAK.tmp; mv $LEAK.tmp $LEAK" \
  '  sleep 6' \
  'fi' \
  "exec env OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp EXPECT_SIZE=4 $OMPI" >"$WORK/late.sh"
chmod 755 "$WORK/late.sh"
"$TC" exec n1 -- rm -f "$LEAK"
GR=("$BIN/greedyrun" --timeout 60 --progress 0 --hosts "n[1-2]" --ppn 2 -n 4)
run pmix --pmi pmix -- "$WORK/late.sh"
for _ in $(seq 50); do
  "$TC" exec n1 -- test -s "$LEAK" && break
  sleep 0.2
done
"$TC" exec n1 -- test -s "$LEAK" || fail "pmix: rank 1 did not publish its variables"
# The stranger's Open MPI rank 1, then silent half headers to every port.
as_stranger n1 sh -c "set -a; . $LEAK; set +a; exec timeout 20 $OMPI" >"$WORK/pmix.client" 2>&1 &
CLIENT=$!
stranger_attack n1 8 $WORK/pmix.stranger
stranger_wait
finish pmix
kill "$CLIENT" 2>/dev/null || true
wait "$CLIENT" 2>/dev/null || true
((RC == 0)) || fail "pmix: exit $RC: $ERR $OUT; stranger's client: $(<"$WORK/pmix.client")"
[[ $(grep -c "of 4: ok" <<<"$OUT") == 4 ]] || fail "pmix: expected 4 ok lines: $OUT"
grep -q "of 4: ok" "$WORK/pmix.client" && fail "pmix: the stranger's client wired up as a rank"
clean_of_stranger pmix
no_leftovers pmix
"$TC" exec n1 -- rm -f "$LEAK"
pass "pmix: the stranger's Open MPI with rank 1's variables was refused; the job wired up and ended 0"

# --- hostname: a host name that is an option ---------------------------------------------------
PWNED=/var/tmp/greedy-security-pwned
rm -f "$PWNED"
set +e
"$BIN/greedyrun" -H "-oProxyCommand=touch $PWNED" hostname >"$WORK/host.out" 2>&1
RC=$?
printf 'n1\n-oProxyCommand=touch %s\n' "$PWNED" >"$WORK/hostfile"
"$BIN/greedyrun" --hostfile "$WORK/hostfile" hostname >"$WORK/hostfile.out" 2>&1
RC2=$?
set -e
((RC == 2 && RC2 == 2)) || fail "hostname: expected 2 and 2, got $RC and $RC2: $(<"$WORK/host.out") $(<"$WORK/hostfile.out")"
[[ -e $PWNED ]] && fail "hostname: the ProxyCommand ran"
grep -q "line 2" "$WORK/hostfile.out" || fail "hostname: the hostfile line is not named: $(<"$WORK/hostfile.out")"
[[ $(wc -l <"$WORK/hostfile.out") == 1 ]] || fail "hostname: the error is printed more than once: $(<"$WORK/hostfile.out")"
pass "hostname: -oProxyCommand as a host is refused (exit 2, one line naming the entry/line), nothing ran"
