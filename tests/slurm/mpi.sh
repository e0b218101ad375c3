#!/bin/bash
# tests/slurm/mpi.sh [--release R]: mpi/greedy (mpi_greedy.so) on the emulated Slurm cluster
# of the machine's release (22.05), or with --release 24.11|26.05 on a cluster of that release
# (testcluster up --release: its daemons and srun from a Debian root of it), with the plugin
# built against that release and the test program against its own MPICH and Open MPI; there
# the cases up to `cpu-bind` run (the rest, marked below, on the machine's release only).
#
# Builds the plugin (release), installs it as mpi_greedy.so in a PluginDir entry, brings up an
# 8-host cluster with MpiDefault=greedy, and checks, with the test program tests/mpi/wireup.c
# built twice: MPICH (PyPI mpich 5.0.2, a PMI-1 client reliable across these hosts) and Open
# MPI (Debian 4.1, PMIx only); every node serves every family (GreedyProtocol=auto), and each
# rank is served by the one it speaks:
#   greedy     srun -N8 -n16 --mpi=greedy, each MPI: 16 ranks, size and allreduce checked
#   default    the same with no --mpi flag (MpiDefault=greedy)
#   protocol   a task gets every family's variables and MPIR_CVAR_PMI_VERSION=1 (a user's own
#              value wins); SLURM_GREEDY_PROTOCOL=pmi|pmix gives that family only
#   mixed      MPICH ranks on one node, Open MPI on the other: the step ends naming one of each
#   singletons the ranks of one node started outside srun's environment end 0 without a word:
#              the step ends as soon as that node leaves, naming it and its ranks
#   stranger   another local user with a real task's PMIX_* variables, and probes of every port
#              of n1, reach nothing: the Open MPI step ends 0 (issue 15, docs/security.md)
#   config     srun --mpi=list shows greedy; scontrol show config shows mpi.conf's Greedy* keys
#   exitcode   a rank exiting 7 before MPI_Init, each MPI: the job ends fast, srun exits 7
#   late       the same with n8 starting its part 3 s late (a Prolog, as sites have): the
#              step's kill waits for n8's stepd (slurmd and slurmstepd hold it) and ends it
#   abort      MPI_Abort(3) in rank 5, each MPI: srun exits 3 fast, the step is gone
#   nonmpi     steps that never speak PMI (hostname, staggered exits) run as usual; a task
#              exiting 3 ends the step and srun exits 3
#   true       100 consecutive srun -N4 -n8 --mpi=greedy /bin/true, none failing (issue 15:
#              nodes whose tasks end before the overlay join completes must leave cleanly)
#   cpu-bind   srun --cpu-bind=cores (task/affinity): PMIx tells each rank the CPU Slurm bound
#              it to and its peer's; Open MPI wires up bound; unbound ranks are told none
#   clients    issue 18's client matrix (tests/mpi/clients.sh: MPICH 5, Open MPI 4.1 and 5, Intel
#              MPI's three PMI paths, mpi4py on MPICH and Open MPI), 4x2, no protocol named
#   multi-prog srun --multi-prog with two programs: one MPI job of 8 ranks
#   user       both MPIs again with srun run by user nobody (PMIx registers the job's uid), under
#              a wrapper script
#   forged     another user's srun preloads a shim naming a victim's step in GREEDY_MPI_JOB and
#              runs a task exiting 3: refused on its node (srun exits 1 saying why), the victim's
#              step lives on
#   crash      a rank killed by SIGSEGV while the others wait: srun exits 139, nothing left
#   scancel    scancel of a running step: nothing left on any host
#   malformed  a rank writes garbage on its PMI socket: the job ends with an error naming the
#              rank in slurmd's log; slurmd and later steps are fine
#   repeat     50 consecutive jobs (MPICH and Open MPI alternating), all correct
#   ports      a second cluster with MpiParams=ports=...: the reserved-port rendezvous (no srun
#              listener), 8x2 again, plus NodeAddr-only addressing (no DNS used by the plugin)
#
# The cluster is shared with other engineers' tests: wait for a free one, take down only ours.
# Env: CARGO_TARGET_DIR (default <repo>/target), GREEDY_MPICH5 (default /var/tmp/greedy-mpich5),
# MPI_REPEAT (default 50), MPI_TRUE_REPEAT (default 100; 50 on another release).
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=8
RELEASE="" RELEASE_ROOT=""
[[ ${1:-} != --release ]] || release_select "${2:-}"
TAG=mpi${RELEASE:+ $RELEASE}
REPEAT=${MPI_REPEAT:-50}
TRUE_REPEAT=${MPI_TRUE_REPEAT:-$([[ -n $RELEASE_ROOT ]] && echo 50 || echo 100)}
need_shared_target
# A release root sees the repo and /var/tmp (testcluster --release), so the programs must be there.
[[ -z $RELEASE_ROOT || $CARGO_TARGET_DIR == "$ROOT"/* || $CARGO_TARGET_DIR == /var/tmp/* ]] ||
  fail "--release needs CARGO_TARGET_DIR under the repo or /var/tmp"
need_root

# --- build -------------------------------------------------------------------------------------
. "$ROOT/tests/slurm/mpi-build.sh"

# mpi.conf: mpi/greedy's keys beside another plugin's (which it must leave alone).
MPICONF=$BINDIR/mpi.conf
printf '%s\n' '# mpi/greedy test settings' 'PMIxTimeout=300' 'GreedyFenceTimeout=120' >"$MPICONF"
# slurmd's Prolog: the node named in $LATE starts its part of a job 3 s late.
LATE=$BINDIR/late-node
PROLOG=$BINDIR/prolog
printf '%s\n' '#!/bin/sh' "[ \"\$(cat '$LATE' 2>/dev/null)\" = \"\$SLURMD_NODENAME\" ] && sleep 3" 'exit 0' >"$PROLOG"
chmod 755 "$PROLOG"
rm -f "$LATE"

# --- cluster (shared: wait for a free one) -----------------------------------------------------
up() {
  cluster_up --nodes "$NODES" --slurm --plugindir "$PLUGDIR" --mpi-default greedy \
    --mpi-conf "$MPICONF" --prolog "$PROLOG" ${RELEASE:+--release "$RELEASE"} "$@"
  eval "$("$TC" env)"
  SLOG=$(dirname "$SLURM_CONF")/../log
  WORK=$GREEDY_TC_SCRATCH/mpi
  mkdir -p "$WORK"
  cd "$WORK"
}
down() { cd "$ROOT"; "$TC" down >/dev/null 2>&1 || true; }

# Processes of our jobs left in any host (slurmstepd included: a step must end entirely).
JOB_RE='slurmstepd|wireup|/names|sleep 4242|bash -c'
. "$ROOT/tests/cluster/leftovers.sh"
slurmds_alive() {
  local n
  n=$(pgrep -xc slurmd || true)
  ((n >= NODES)) || fail "$1: only $n slurmd left"
  [[ $(sinfo -h -o '%T' | sort -u | tr '\n' ' ') =~ ^(idle|mixed|allocated|completing)\ ?(idle|completing)?\ ?$ ]] ||
    fail "$1: nodes not healthy: $(sinfo -h -o '%T %D %N')"
}

# run NAME TIMEOUT SRUN-ARGS... : sets RC, OUT, ERR, SECS (srun's own timeout as a guard)
SRUN_CMD=(srun)
run() {
  local name=$1 limit=$2
  shift 2
  run_timed "$name" "$limit" "${SRUN_CMD[@]}" "$@"
}
# What slurmd and the stepds said about the last job, for a failure message: srun's stderr
# alone did not show why a job took 63 s (CI run 19).
last_job_log() {
  local id
  id=$(squeue -h -t all -o %i 2>/dev/null | sort -n | tail -1)
  echo "srun: $ERR"
  [[ -n $id ]] && grep -hw "$id" "$SLOG"/slurmd-n*.log "$SLOG"/slurmctld.log 2>/dev/null | tail -60
}
ok16() { # NAME: 16 correct ranks, exit 0
  ((RC == 0)) || fail "$1: exit $RC: $ERR $OUT"
  [[ $(grep -c " of 16: ok" <<<"$OUT") == 16 ]] || fail "$1: expected 16 ok lines: $OUT $ERR"
}
PPN=(-N"$NODES" -n$((2 * NODES)) --ntasks-per-node=2)

# ================================ phase 1: rendezvous through srun ============================
up
# (whole outputs first: `cmd | grep -q` under pipefail fails when grep quits before cmd ends)
LIST=$(srun --mpi=list 2>&1)
grep -qw greedy <<<"$LIST" || fail "srun --mpi=list does not show greedy: $LIST"
CONF=$(scontrol show config)
grep -q '^MpiDefault *= greedy' <<<"$CONF" || fail "MpiDefault is not greedy: $(grep Mpi <<<"$CONF")"
grep -q '^GreedyFenceTimeout *= 120$' <<<"$CONF" && grep -q '^GreedyProtocol *= auto$' <<<"$CONF" ||
  fail "scontrol show config does not show mpi.conf's Greedy* keys: $(grep -i greedy <<<"$CONF")"
pass "srun --mpi=list shows greedy; scontrol show config shows mpi.conf's GreedyFenceTimeout = 120 and the defaults"

for mpi in mpich ompi; do
  prog=$WIREUP
  [[ $mpi == ompi ]] && prog=$OMPI
  run "greedy-$mpi" 90 "${PPN[@]}" --mpi=greedy env EXPECT_SIZE=16 "$prog"
  ok16 "greedy-$mpi"
  pass "$mpi: srun ${PPN[*]} --mpi=greedy: 16/16 ranks ok in ${SECS}s"

  run "default-$mpi" 90 "${PPN[@]}" env EXPECT_SIZE=16 "$prog"
  ok16 "default-$mpi"
  pass "$mpi: srun ${PPN[*]} (MpiDefault=greedy): 16/16 ranks ok in ${SECS}s"

  run "exitcode-$mpi" 90 "${PPN[@]}" --mpi=greedy "$prog" fail-before-init=9:7
  grep -q "task 9: Exited with exit code 7" <<<"$ERR" ||
    fail "exitcode-$mpi: srun does not report rank 9's code 7: $ERR"
  # srun's own status: the plugin's (client_fini), not the SIGKILL that ended the others.
  ((RC == 7)) || fail "exitcode-$mpi: srun exited $RC, not rank 9's 7: $ERR"
  grep -Eq "mpi/greedy: job ended with exit code 7: n5: .*rank 9 (on n5 )?exited with code 7" <<<"$ERR" ||
    fail "exitcode-$mpi: srun does not say why the job ended: $ERR"
  (($(awk -v s="$SECS" 'BEGIN { print (s < 30) }'))) || fail "exitcode-$mpi: took ${SECS}s: $(last_job_log)"
  no_leftovers "exitcode-$mpi"
  grep -Eq "rank 9 (on n5 )?exited with code .* before" "$SLOG"/slurmd-n5.log ||
    fail "exitcode-$mpi: no log line naming rank 9"
  pass "$mpi: rank 9 exits 7 before MPI_Init: srun exits 7 in ${SECS}s saying why, nothing left"

  # n8's slurmd runs the Prolog 3 s long: the abort and the kill come before n8's slurmstepd
  # exists, n8's ranks start after them and must still end at once.
  echo n8 >"$LATE"
  run "late-$mpi" 90 "${PPN[@]}" --mpi=greedy "$prog" fail-before-init=9:7
  rm -f "$LATE"
  ((RC == 7)) || fail "late-$mpi: srun exited $RC, not rank 9's 7: $ERR"
  (($(awk -v s="$SECS" 'BEGIN { print (s < 20) }'))) || fail "late-$mpi: took ${SECS}s: $(last_job_log)"
  no_leftovers "late-$mpi"
  pass "$mpi: rank 9 exits 7 while n8 starts 3 s late: srun exits 7 in ${SECS}s, nothing left"

  run "abort-$mpi" 90 "${PPN[@]}" --mpi=greedy "$prog" abort-after-init=5:3
  ((RC == 3)) || fail "abort-$mpi: MPI_Abort(3) in rank 5 but srun exited $RC: $ERR"
  (($(awk -v s="$SECS" 'BEGIN { print (s < 30) }'))) || fail "abort-$mpi: took ${SECS}s: $(last_job_log)"
  no_leftovers "abort-$mpi"
  grep -qi "rank 5 .*abort.*3" "$SLOG"/slurmd-n3.log || fail "abort-$mpi: no log line naming rank 5"
  pass "$mpi: MPI_Abort(3) in rank 5: srun exits 3 in ${SECS}s, slurmd log names the rank, nothing left"
done

# MPI name publishing (PMI-1 publish_name, lookup_name, unpublish_name): one table per step,
# on its first node; a lookup of an unknown name fails at once (tests/mpi/names.c).
build_mpi_prog "$ROOT/tests/mpi/names.c" names
run names-mpich 90 "${PPN[@]}" --mpi=greedy "$BINDIR/names"
ok16 names-mpich
pass "mpich: MPI_Publish_name, MPI_Lookup_name, MPI_Unpublish_name across $NODES nodes: 16/16 ranks ok in ${SECS}s"

# Steps that are not MPI programs run as under Slurm's own plugins: a task that never speaks
# PMI and exits 0 ends nothing; one that fails ends the step with its code.
run nonmpi 60 "${PPN[@]}" hostname
((RC == 0)) && [[ $(wc -l <<<"$OUT") == 16 ]] || fail "nonmpi: srun hostname: exit $RC: $OUT $ERR"
run nonmpi-staggered 60 -N2 -n4 bash -c 'sleep "$SLURM_PROCID"; echo "task $SLURM_PROCID done"'
((RC == 0)) && [[ $(grep -c '^task [0-3] done$' <<<"$OUT") == 4 ]] ||
  fail "nonmpi-staggered: the first task to exit ended the step: exit $RC: $OUT $ERR"
run nonmpi-fail 60 -N2 -n4 bash -c '[ "$SLURM_PROCID" = 2 ] && exit 3; exec sleep 4242'
((RC == 3)) || fail "nonmpi-fail: task 2 exited 3 but srun exited $RC: $ERR"
no_leftovers nonmpi-fail
# The kill's SIGKILL can end a task's watcher before it reports: fini must not wait for it.
! grep -h "end not reported within" "$SLOG"/slurmd-n*.log ||
  fail "nonmpi-fail: a node held its fini for the step's end after the abort"
pass "non-MPI steps under MpiDefault=greedy: hostname 16/16 and staggered exits ok; a task exiting 3 ends the step, srun exits 3"

# Tasks that end within milliseconds: a node's slurmstepd may tear down (fini) before its overlay
# join is complete. It must finish or leave the join saying Bye: a link closed without one is a
# crash to the others, which end the step (issue 15: 8 of 200 such steps failed).
t0=$(ms)
for i in $(seq "$TRUE_REPEAT"); do
  run "true-$i" 60 -N4 -n8 --mpi=greedy /bin/true
  ((RC == 0)) || fail "true $i of $TRUE_REPEAT: srun -N4 -n8 --mpi=greedy /bin/true exited $RC: $ERR"
  rm -f "$WORK/true-$i".{out,err}
done
pass "$TRUE_REPEAT consecutive srun -N4 -n8 --mpi=greedy /bin/true, none failed, $(($(ms) - t0)) ms in all"

# Slurm binds each task (task/affinity) only after mpi/greedy's hooks: the PMIx locality a
# rank is told must be where it really runs, as /proc says, and its peer's likewise. A cluster
# of its own: task/affinity's automatic binding fails uneven steps on these emulated nodes
# (`srun -N4 -n8`: "failed to distribute tasks (bind_type:sockets,mask_cpu,one_thread)").
no_leftovers true
down
up --task-plugin affinity
run cpu-bind 90 -N4 -n8 --ntasks-per-node=2 --cpu-bind=cores sh -c \
  'echo "cpus $SLURM_PROCID $(sed -n "s/^Cpus_allowed_list:\s*//p" /proc/self/status)"; exec "$0"' \
  "$LOCALITY"
((RC == 0)) || fail "cpu-bind: exit $RC: $ERR $OUT"
for r in $(seq 0 7); do
  p=$((r ^ 1)) # the other rank of its node (block distribution)
  cpus=$(sed -n "s/^cpus $r //p" <<<"$OUT")
  loc=$(sed -n "s/^locality $r \([^ ]*\) hwloc:$cpus$/\1/p" <<<"$OUT")
  [[ $cpus =~ ^[0-9]+$ && -n $loc ]] || fail "cpu-bind: rank $r runs on CPU ${cpus:-?} but was told otherwise: $OUT"
  ploc=$(sed -n "s/^locality $p \([^ ]*\) .*/\1/p" <<<"$OUT")
  grep -qx "peer $r $p $ploc" <<<"$OUT" || fail "cpu-bind: rank $r was not told its peer $p's locality $ploc: $OUT"
done
[[ $(sed -n 's/^cpus [0-7] //p' <<<"$OUT" | sort -u | wc -l) -gt 1 ]] ||
  fail "cpu-bind: Slurm did not bind the ranks apart: $OUT"
run cpu-bind-ompi 90 -N4 -n8 --ntasks-per-node=2 --cpu-bind=cores env EXPECT_SIZE=8 "$OMPI"
((RC == 0)) && [[ $(grep -o "of 8: ok" <<<"$OUT" | wc -l) == 8 ]] || fail "cpu-bind: Open MPI: exit $RC: $ERR $OUT"
run cpu-bind-none 90 -N2 -n4 --ntasks-per-node=2 --cpu-bind=none "$LOCALITY"
((RC == 0)) && [[ $(grep -c "^unbound [0-3]$" <<<"$OUT") == 4 ]] || fail "cpu-bind=none: ranks should be told no locality: exit $RC: $ERR $OUT"
pass "srun --cpu-bind=cores: PMIx tells each rank the CPU Slurm bound it to and its peer's, Open MPI 8/8 ok; --cpu-bind=none: no locality"
no_leftovers cpu-bind
down

if [[ -n $RELEASE_ROOT ]]; then
  echo "$TAG: all passed (the cases below run on the machine's release only)"
  exit 0
fi
up

# Issue 18's client matrix (tests/mpi/clients.sh), 4 nodes x 2, no protocol flag or variable.
. "$ROOT/tests/mpi/clients.sh"
clients_build "$WORK/clients"
for client in "${CLIENTS[@]}"; do
  client_cmd "$client" "$WORK/clients"
  run "client-$client" 90 -N4 -n8 --ntasks-per-node=2 --mpi=greedy env EXPECT_SIZE=8 "${CMD[@]}"
  ((RC == 0)) && [[ $(grep -o "of 8: ok" <<<"$OUT" | wc -l) == 8 ]] || fail "clients: $client: exit $RC: $ERR $OUT"
  pass "clients: $client 4x2 under --mpi=greedy with no protocol named: 8/8 ranks ok in ${SECS}s"
done

# MPMD with srun --multi-prog: two programs, one MPI job of 8 ranks.
for part in a b; do
  printf '#!/bin/sh\necho "part %s $SLURM_PROCID"\nexec env EXPECT_SIZE=8 %s\n' "$part" "$WIREUP" >"$WORK/part-$part.sh"
  chmod 755 "$WORK/part-$part.sh"
done
printf '0-2 %s\n3-7 %s\n' "$WORK/part-a.sh" "$WORK/part-b.sh" >"$WORK/multi.conf"
run multi-prog 90 -N4 -n8 --ntasks-per-node=2 --mpi=greedy --multi-prog "$WORK/multi.conf"
((RC == 0)) && [[ $(grep -o "of 8: ok" <<<"$OUT" | wc -l) == 8 ]] || fail "multi-prog: exit $RC: $ERR $OUT"
[[ $(grep -c "^part a [0-2]$" <<<"$OUT") == 3 && $(grep -c "^part b [3-7]$" <<<"$OUT") == 5 ]] ||
  fail "multi-prog: tasks 0-2 should run part a, 3-7 part b: $OUT"
pass "srun --multi-prog (0-2 one program, 3-7 another) under --mpi=greedy: one MPI job of 8 ranks"

# A job user other than root (slurmstepd serves PMIx as root; PMIx admits a client only with
# the uid it was registered with, and Open MPI writes into the step's PMIx directory). The
# program runs under a wrapper script (bash -c), with no protocol named anywhere: every rank is
# offered every family and speaks its own.
for mpi in mpich ompi; do
  prog=$WIREUP
  [[ $mpi == ompi ]] && prog=$OMPI
  SRUN_CMD=(runuser -u nobody -- srun --chdir=/)
  run "user-$mpi" 90 "${PPN[@]}" --mpi=greedy bash -c 'echo "uid=$(id -u)"; exec env EXPECT_SIZE=16 '"$prog"
  ok16 "user-$mpi"
  [[ $(grep -c "^uid=$(id -u nobody)$" <<<"$OUT") == 16 ]] || fail "user-$mpi: tasks did not run as nobody: $OUT"
done
SRUN_CMD=(srun)
pass "srun as user nobody, MPI under a wrapper script, no protocol named: MPICH and Open MPI 16/16 ranks ok"

# Every family by default, with MPIR_CVAR_PMI_VERSION=1 so that MPICH >= 4.1 does not refuse
# the union (a user's own value wins); SLURM_GREEDY_PROTOCOL gives one family only.
for proto in auto pmi pmix; do
  set +e
  OUT=$(SLURM_GREEDY_PROTOCOL=$proto timeout 60 srun -N2 -n2 --mpi=greedy bash -c \
    'echo "pmi=${PMI_RANK:-} pmix=${PMIX_RANK:-} cvar=${MPIR_CVAR_PMI_VERSION:-}"' 2>&1)
  set -e
  case $proto in
    auto) [[ $(grep -c '^pmi=\([01]\) pmix=\1 cvar=1$' <<<"$OUT") == 2 ]] || fail "protocol auto: $OUT" ;;
    pmi) [[ $(grep -c '^pmi=[01] pmix= cvar=$' <<<"$OUT") == 2 ]] || fail "protocol pmi: $OUT" ;;
    pmix) [[ $(grep -c '^pmi= pmix=[01] cvar=$' <<<"$OUT") == 2 ]] || fail "protocol pmix: $OUT" ;;
  esac
done
# (PyPI's MPICH 5.0.2 is built with PMI-1 only: it refuses 2 and x, so only the variable is
# checked here.)
SRUN_CMD=(env MPIR_CVAR_PMI_VERSION=2 srun)
run cvar-user 60 -N2 -n2 --mpi=greedy bash -c 'echo "cvar=$MPIR_CVAR_PMI_VERSION"'
SRUN_CMD=(srun)
[[ $(grep -c '^cvar=2$' <<<"$OUT") == 2 ]] || fail "cvar-user: the user's MPIR_CVAR_PMI_VERSION=2 was not kept: $OUT $ERR"
pass "every family by default, with MPIR_CVAR_PMI_VERSION=1 unless the user set it; SLURM_GREEDY_PROTOCOL=pmi or pmix gives that family only"

# Ranks of one job that speak two families end it with a message naming one of each.
run mixed 60 -N2 -n4 --ntasks-per-node=2 --mpi=greedy bash -c \
  'if [ "$SLURM_PROCID" -lt 2 ]; then exec '"$WIREUP"'; else exec '"$OMPI"'; fi'
((RC != 0)) || fail "mixed: MPICH and Open MPI ranks in one step ended 0: $OUT"
grep -q "rank 0 on n1 speaks PMI-1/PMI-2 while rank 2 on n2 speaks PMIx" <<<"$ERR" ||
  fail "mixed: srun does not name a rank of each family: $ERR"
no_leftovers mixed
pass "MPICH ranks on n1 and Open MPI ranks on n2 in one step: srun exits $RC naming rank 0 (PMI) and rank 2 (PMIx)"

# Singletons: the ranks on n2 start with an emptied environment (as a careless wrapper would),
# run as "rank 0 of 1" and end 0 without a word, while n1's ranks wait in their first fence:
# the step ends as soon as n2's slurmstepd leaves, naming it, not at the fence timeout.
run singletons 60 -N2 -n4 --ntasks-per-node=2 --mpi=greedy bash -c \
  'if [ "$SLURM_PROCID" -lt 2 ]; then exec '"$WIREUP"'; else exec env -i '"$WIREUP"'; fi'
((RC != 0)) || fail "singletons: ranks 2-3 as singletons and the step ended 0: $OUT"
grep -q "hosts n2; ranks 2-3) left the job while .* was waiting for it: .* singletons" <<<"$ERR" ||
  fail "singletons: srun does not name n2 and its ranks: $ERR"
((${SECS%.*} < 20)) || fail "singletons: took ${SECS}s"
no_leftovers singletons
pass "ranks 2-3 on n2 run as singletons: srun exits $RC in ${SECS}s naming n2 and its ranks"

# stranger (issue 15): task 1 publishes its PMIx variables (as a careless job might) and starts
# late; another local user (tests/security/stranger.sh) runs Open MPI with them first and
# probes every port of n1 (PMI and Charm++ aborts, silent PMIx half headers). libpmix never
# sees them: the step wires up and ends 0, and srun prints nothing about them.
source "$ROOT/tests/security/stranger.sh"
stranger_setup
chmod 755 "$WORK"
cp "$OMPI" "$WORK/wireup-ompi"
LEAK=/tmp/greedy-security-leak # n1's own /tmp
printf '%s\n' '#!/bin/sh' \
  'if [ "$SLURM_PROCID" = 1 ]; then' \
  "  env | grep -E '^(PMIX_|FLUX_JOB_ID)' >$LEAK.tmp; chmod 644 $LEAK.tmp; mv $LEAK.tmp $LEAK" \
  '  sleep 6' \
  'fi' \
  "exec env EXPECT_SIZE=4 $WORK/wireup-ompi" >"$WORK/late.sh"
chmod 755 "$WORK/late.sh"
"$TC" exec n1 -- rm -f "$LEAK"
SLURM_GREEDY_PROTOCOL=pmix timeout -k 5 90 srun -N2 -n4 --ntasks-per-node=2 --mpi=greedy \
  "$WORK/late.sh" >"$WORK/stranger.out" 2>"$WORK/stranger.err" </dev/null &
STEP=$!
for _ in $(seq 100); do
  "$TC" exec n1 -- test -s "$LEAK" && break
  sleep 0.2
done
"$TC" exec n1 -- test -s "$LEAK" || fail "stranger: task 1 did not publish its variables"
as_stranger n1 sh -c "set -a; . $LEAK; set +a; exec timeout 20 $WORK/wireup-ompi" \
  >"$WORK/stranger.client" 2>&1 &
CLIENT=$!
stranger_attack n1 8 "$WORK/stranger.log"
stranger_wait
set +e
wait "$STEP"
RC=$?
set -e
kill "$CLIENT" 2>/dev/null || true
wait "$CLIENT" 2>/dev/null || true
"$TC" exec n1 -- rm -f "$LEAK"
OUT=$(<"$WORK/stranger.out")
ERR=$(<"$WORK/stranger.err")
((RC == 0)) || fail "stranger: srun exited $RC: $ERR; the stranger's client: $(<"$WORK/stranger.client")"
[[ $(grep -c " of 4: ok" <<<"$OUT") == 4 ]] || fail "stranger: expected 4 ok lines: $OUT $ERR"
grep -q "of 4: ok" "$WORK/stranger.client" && fail "stranger: the stranger's Open MPI wired up as a rank"
! grep -qi "warn\|stranger" <<<"$ERR" || fail "stranger: srun printed something about the stranger: $ERR"
no_leftovers stranger
pass "another user's Open MPI with task 1's PMIx variables and probes of every port of n1: refused, the step ended 0"

# forged: the launch env comes from srun, the user's own process. Another user preloads a shim
# into their srun that names the victim's step in GREEDY_MPI_JOB (tests/slurm/forge_job.c) and
# runs a task exiting 3: before slurmstepd took the step from its own record, root asked
# slurmctld to kill the victim's step on that abort. Now the forged step is refused on its
# node (one log line) and the victim's step lives on.
gcc -shared -fPIC -o "$WORK/forge_job.so" "$ROOT/tests/slurm/forge_job.c" -ldl || fail "forged: building the shim"
runuser -u nobody -- srun --chdir=/ -N1 -w n1 --job-name=greedy-victim sleep 4242 >"$WORK/victim.out" 2>&1 </dev/null &
VICTIM=$!
VJOB=""
for _ in $(seq 100); do
  VJOB=$(squeue -h -s -u nobody -o %i 2>/dev/null | grep -m1 '\.0$' || true)
  [[ -n $VJOB ]] && "$TC" exec n1 -- pgrep -u nobody -x sleep >/dev/null && break
  sleep 0.2
done
[[ -n $VJOB ]] || fail "forged: the victim's step never started"
SRUN_CMD=(runuser -u "$STRANGER" -- env LD_PRELOAD="$WORK/forge_job.so" FORGED_JOB="$VJOB" srun --chdir=/)
for i in 1 2; do
  run "forged-$i" 60 -N1 -w n2 --mpi=greedy sh -c 'exit 3'
  # The refusing node tells srun why (a launch failure alone leaves srun 22.05 at 0).
  ((RC == 1)) && grep -q "launch failed" <<<"$ERR" &&
    grep -q "job ended with exit code 1: n2: GREEDY_MPI_JOB=\"$VJOB\" contradicts slurmstepd's record" <<<"$ERR" ||
    fail "forged: the step with GREEDY_MPI_JOB=$VJOB was not refused saying why: exit $RC: $ERR"
done
SRUN_CMD=(srun)
grep -q "GREEDY_MPI_JOB=\"$VJOB\" contradicts slurmstepd's record" "$SLOG"/slurmd-n2.log ||
  fail "forged: n2's slurmd log does not name the forged GREEDY_MPI_JOB: $ERR"
sleep 3 # past the abort's re-kills (0.5 to 7 s after it), had there been an abort
kill -0 "$VICTIM" 2>/dev/null || fail "forged: the victim's srun ended: $(<"$WORK/victim.out")"
squeue -h -s -o %i | grep -qx "$VJOB" || fail "forged: the victim's step $VJOB is gone"
"$TC" exec n1 -- pgrep -u nobody -x sleep >/dev/null || fail "forged: the victim's task is gone"
scancel "${VJOB%.*}"
wait "$VICTIM" 2>/dev/null || true
no_leftovers forged
pass "another user's srun naming step $VJOB in its launch env, task exiting 3: refused on n2, the victim's step lives on"

# A rank that dies by a signal while the others sit in MPI: the server sees its socket close.
run crash 90 "${PPN[@]}" --mpi=greedy bash -c \
  '[ "$PMI_RANK" = 3 ] && { sleep 1; kill -SEGV $$; }; exec sleep 4242'
((RC == 139)) || fail "crash: rank 3 died of SIGSEGV, srun exited $RC"
(($(awk -v s="$SECS" 'BEGIN { print (s < 60) }'))) || fail "crash: took ${SECS}s"
no_leftovers crash
# The tasks are bash, which never speaks PMI: rank 3 is named as one that died before it
# connected. (This grep used to accept any "rank 3 … before finalize" line, which the earlier
# steps' killed ranks left in the same logs.)
grep -Eq "rank 3 on n[0-9]+ exited with code 139 before connecting to any wire-up service" <<<"$ERR" ||
  fail "crash: srun does not say rank 3 died with 139: $ERR"
grep -Eq "rank 3 on n[0-9]+ exited with code 139 before connecting to any wire-up service" "$SLOG"/slurmd-n*.log ||
  fail "crash: no log line naming rank 3 and its code"
pass "rank 3 killed by SIGSEGV: srun exits 139 (128+11) in ${SECS}s, nothing left on any host"

# scancel of a running step.
set +e
srun "${PPN[@]}" --mpi=greedy --job-name=greedy-scancel sleep 4242 >"$WORK/scancel.out" 2>&1 &
SRUN=$!
set -e
for _ in $(seq 100); do
  [[ $(leftovers) == *"sleep 4242"* ]] && break
  sleep 0.2
done
[[ $(leftovers) == *"sleep 4242"* ]] || fail "scancel: the step never started"
scancel --name=greedy-scancel
for _ in $(seq 100); do kill -0 $SRUN 2>/dev/null || break; sleep 0.2; done
kill -0 $SRUN 2>/dev/null && fail "scancel: srun still running 20 s after scancel"
wait $SRUN || true
no_leftovers scancel
pass "scancel of a running --mpi=greedy step: nothing left on any host"

# A malformed PMI message from rank 1: the job ends with an error naming rank 1.
run malformed 90 -N2 -n4 --ntasks-per-node=2 --mpi=greedy bash -c \
  'if [ "$PMI_RANK" = 1 ]; then printf "cmd=init pmi_version=1 pmi_subversion=1\n\x01\x02garbage\n" >&"$PMI_FD"; fi; exec sleep 4242'
((RC != 0)) || fail "malformed: srun exited 0"
(($(awk -v s="$SECS" 'BEGIN { print (s < 60) }'))) || fail "malformed: took ${SECS}s"
no_leftovers malformed
# (Any node: n1 may still be completing the scancelled step, so Slurm can place this one elsewhere.)
cat "$SLOG"/slurmd-n*.log | grep -E "rank 1: .*(garbage|malformed|unknown|pmi)" | tail -1 | grep -q . ||
  fail "malformed: no log line naming rank 1: $ERR"
grep -q "job ended with exit code 1: .*rank 1" <<<"$ERR" || fail "malformed: srun does not say why: $ERR"
slurmds_alive malformed
MAL_RC=$RC MAL_SECS=$SECS
run after-malformed 90 "${PPN[@]}" --mpi=greedy env EXPECT_SIZE=16 "$WIREUP"
ok16 after-malformed
pass "malformed PMI from rank 1: srun exits $MAL_RC in ${MAL_SECS}s, logged, slurmd fine, next job ok"

t0=$(ms)
for i in $(seq "$REPEAT"); do
  prog=$WIREUP
  ((i % 2)) || prog=$OMPI
  run "repeat-$i" 90 "${PPN[@]}" --mpi=greedy env EXPECT_SIZE=16 "$prog"
  ok16 "repeat $i of $REPEAT ($(basename "$prog"))"
  rm -f "$WORK/repeat-$i".{out,err}
done
pass "$REPEAT consecutive 8x2 jobs (MPICH and Open MPI alternating), all correct, $(($(ms) - t0)) ms in all"
no_leftovers repeat
down

# ================================ phase 2: reserved ports ======================================
up --mpi-params ports=20000-20999
run ports 90 "${PPN[@]}" --mpi=greedy bash -c 'echo "resv=$SLURM_STEP_RESV_PORTS"; exec env EXPECT_SIZE=16 '"$WIREUP"
ok16 ports
grep -q 'resv=20' <<<"$OUT" || fail "ports: no SLURM_STEP_RESV_PORTS in the tasks: $OUT"
grep -q 'rendezvous reserved port' "$SLOG"/slurmd-n1.log || fail "ports: the reserved-port rendezvous was not used"
for i in 1 2 3 4 5 6; do
  prog=$WIREUP
  ((i % 2)) || prog=$OMPI
  run "ports-$i" 90 "${PPN[@]}" --mpi=greedy env EXPECT_SIZE=16 "$prog"
  ok16 "ports $i ($(basename "$prog"))"
done
pass "MpiParams=ports: reserved-port rendezvous, 7 jobs of 8x2 ok (MPICH and Open MPI)"
# (`|| true`: grep -c exits 1 on a count of 0, and a task that fails ends the step.)
run ports-private 30 -N2 -n2 --mpi=greedy bash -c 'env | grep -c "^GREEDY_MPI_" || true'
[[ $(grep -c '^0$' <<<"$OUT") == 2 ]] || fail "private GREEDY_MPI_* variables reached the tasks: $OUT"
pass "no GREEDY_MPI_* variable reaches a task"
down
echo "mpi: all passed"
