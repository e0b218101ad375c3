#!/usr/bin/env bash
# End-to-end tests of greedyrun/greedyd on the emulated cluster (slurm-conf/testcluster).
#
# 8 hosts, then 8 hosts with --delay 20. Each case asserts behaviour, and after every case no
# process of the job (greedyd, its guard, a rank, a remote shell client) may be left in any
# host namespace or on the login node. Cases:
#   stdio     hostname on 8 hosts x 2 ranks over ssh and over rsh; -np/--hostfile habits;
#             --tag-output; stdin reaches rank 0 only
#   alloc     no host option: inside `salloc -N4 --ntasks-per-node 2` (also with --rsh srun:
#             one step starts every agent; an MPI job across them) (the first cluster runs
#             Slurm) greedyrun takes SLURM_JOB_NODELIST and its tasks per node (-v names them);
#             with PBS_NODEFILE, the node file's hosts and slots
#   env       -x VAR=VAL, -genv VAR VAL, -wdir DIR and --export NONE,VAR=VAL, seen from the ranks
#   exit      the first failing rank's code is greedyrun's (exit 3), 128+signal (137), 127
#   sigint    Ctrl-C (SIGINT) mid-job: exit 130, ranks get SIGTERM (a trap sees it), no orphans
#   sigterm   SIGTERM, ranks ignoring SIGTERM are SIGKILLed after --grace: exit 143
#   nosshd    sshd of n5 stopped: exit 125 within --timeout, one line naming n5
#   hang      a remote shell that hangs (n6): exit 124/125 within --timeout, naming n6
#   stall     a remote shell that stalls on n7 before greedyd starts: what it started is reaped
#   agentkill an agent SIGKILLed mid-job: exit 125 naming the host, its ranks reaped by its guard
#   mpich     MPI hello + allreduce, 8 hosts x 2 ranks, wire-up across hosts through greedy-pmix;
#             the same as an MPMD command line of two parts (-n 4 … : -n 12 …)
#             (MPICH build: see MPICH below)
#   openmpi   the same with Debian's Open MPI 4.1 with no --pmi (greedy-pmix's PMIx server),
#             and MPI_Abort(42) from rank 5 ending the job with 42
#   bind      --bind-to core: a host's local rank N runs on core N alone, PMIx tells it so
#             (PMIX_LOCALITY_STRING, PMIX_CPUSET), and Open MPI wires up
#   map-by    --map-by node: ranks round the hosts, MPICH and Open MPI wire up
#   clients   issue 18's client matrix (tests/mpi/clients.sh: MPICH 5, Open MPI 4.1 and 5, Intel
#             MPI's three PMI paths, mpi4py on MPICH and Open MPI), 4 hosts x 2, no --pmi;
#             ranks started without the launcher's environment (singletons) named fast
#   session   the same clients as jobs on a session's agents (`--start-session`, GREEDY_SESSION),
#             an exit code, a job on the free hosts beside a running one, Ctrl-C, nothing left
#   delay     the same launches with --delay 20
#
# MPICH: Debian's MPICH 4.0.2 (ch4:ucx) hangs in MPI_Finalize over UCX/TCP between these
# namespaces most of the time at 8x2 (research/slurm-testcluster.md §7.1), and UCX shared memory
# cannot cross hosts here (private /dev/shm, IPC namespace and boot_id per host). So the MPI
# case uses PyPI's `mpich` 5.0.2 wheel (ch4:ucx,ofi; 20/20 reliable across these hosts under
# Hydra, research/baseline-launchers.md §4), which speaks PMI-1 to greedy-pmix like Debian's:
# wire-up *and* data cross the veths. It lives in $GREEDY_MPICH5 (default
# /var/tmp/greedy-mpich5, visible to every host) and is installed with pip on first use
# (≈ 15 s, 13 MB). GREEDY_E2E_MPICH=debian runs Debian's build instead, with a retry.
#
# Needs root. Waits (up to 10 min) for another engineer's cluster to go down, never tears it
# down. Takes about 2 minutes. Exits non-zero naming the first failed check.
set -euo pipefail

TAG=launcher-e2e
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=8

need_root

# --- build and tools -------------------------------------------------------------------------
need_shared_target
# `up --delay` builds the packet delayer (release) unless told where one is; build it here
# (it sets GREEDY_NETDELAY), where the cwd exists, and in our target dir.
build --release -p greedy-netdelay
build -p greedy-launcher # BIN: the debug directory

if [[ ${GREEDY_E2E_MPICH:-pypi} == pypi ]]; then
  . "$ROOT/tests/mpi/mpich5.sh"
fi

# --- cluster ---------------------------------------------------------------------------------

up() {
  cluster_up --nodes "$NODES" "$@"
  eval "$("$TC" env)"
  WORK=$GREEDY_TC_SCRATCH/launcher
  mkdir -p "$WORK"
  cd "$WORK"
  HOSTS="n[1-$NODES]"
}

# The job's processes: greedyd (agent or guard), ranks (marked by 424x), remote shell clients.
JOB_RE='greedyd|sleep 424|wireup|ssh .*greedyd|rsh .*greedyd'
leftovers() {
  local ns pid out=""
  for ns in $(ip netns list | awk '/^gtc-n/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      local cmd
      cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
      [[ $cmd =~ $JOB_RE ]] && out+="$ns:$pid:$cmd; "
    done
  done
  # The login node: remote shell clients of greedyrun.
  for pid in $(pgrep -f 'greedyd' || true); do
    local cmd
    cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
    [[ $cmd == *"$BIN/greedyd"* && $cmd =~ ^(ssh|rsh|/bin/sh|sh) ]] && out+="login:$pid:$cmd; "
  done
  echo "$out"
}
# Processes in host namespaces whose command line is exactly "$*".
count_procs() {
  local ns pid n=0
  for ns in $(ip netns list | awk '/^gtc-n/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == "$* " ]] && n=$((n + 1))
    done
  done
  echo "$n"
}
# No process of the job may remain (polls up to 10 s: guards wait --grace before SIGKILL).
no_orphans() {
  local left
  for _ in $(seq 50); do
    left=$(leftovers)
    [[ -z $left ]] && return 0
    sleep 0.2
  done
  fail "$1: processes left behind: $left"
}

GR=("$BIN/greedyrun" --timeout 30 --progress 0)
run() { # run NAME ARGS... : sets RC, OUT, ERR, SECS
  local name=$1
  shift
  local t0
  t0=$(ms)
  set +e
  "${GR[@]}" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null
  RC=$?
  set -e
  SECS=$((($(ms) - t0) / 1000))
  OUT=$(<"$WORK/$name.out")
  ERR=$(<"$WORK/$name.err")
}

cases() {
  local tag=$1

  # --- stdio: ssh, rsh, habits, tagging, stdin --------------------------------------------
  run hostname-ssh -np 16 --hosts "$HOSTS" --ppn 2 --pmi none -- hostname
  ((RC == 0)) || fail "$tag ssh hostname: exit $RC: $ERR"
  [[ $(sort <<<"$OUT" | uniq -c | awk '$1 == 2' | wc -l) == "$NODES" ]] ||
    fail "$tag ssh hostname: expected every host twice, got: $OUT"
  pass "$tag: hostname on $NODES hosts x 2 over ssh"

  printf 'n%s slots=2\n' $(seq "$NODES") >"$WORK/hostfile"
  run hostname-rsh --hostfile "$WORK/hostfile" --rsh rsh --pmi none --tag-output -- sh -c 'echo $(hostname) $GREEDY_RANK'
  ((RC == 0)) || fail "$tag rsh hostname: exit $RC: $ERR"
  for r in 0 7 15; do
    grep -qx "\[$r\] n$((r / 2 + 1)) $r" <<<"$OUT" || fail "$tag rsh/tag-output: no line for rank $r in: $OUT"
  done
  pass "$tag: hostfile with slots over rsh, tagged output"

  set +e
  OUT=$(printf 'line1\nline2\n' | "${GR[@]}" -H n2,n3 --pmi none -- sh -c 'echo "$GREEDY_RANK:$(cat | tr "\n" " ")"' 2>"$WORK/stdin.err")
  RC=$?
  set -e
  ((RC == 0)) || fail "$tag stdin: exit $RC: $(<"$WORK/stdin.err")"
  grep -qx "0:line1 line2 " <<<"$OUT" && grep -qx "1:" <<<"$OUT" ||
    fail "$tag stdin: rank 0 should read stdin, rank 1 nothing: $OUT"
  pass "$tag: stdin goes to rank 0 only"
  no_orphans "$tag stdio"

  # --- alloc: the allocation's hosts, no host option ---------------------------------------------
  if [[ -n ${SLURM_CONF:-} ]]; then
    set +e
    timeout 120 salloc -Q -N4 --ntasks-per-node 2 -- "${GR[@]}" -v --pmi none -- hostname \
      >"$WORK/alloc.out" 2>"$WORK/alloc.err" </dev/null
    RC=$?
    set -e
    OUT=$(<"$WORK/alloc.out") ERR=$(<"$WORK/alloc.err")
    ((RC == 0)) || fail "$tag salloc: exit $RC: $ERR"
    [[ $(wc -l <<<"$OUT") == 8 && $(sort <<<"$OUT" | uniq -c | awk '$1 == 2' | wc -l) == 4 ]] ||
      fail "$tag salloc: expected 4 hosts twice each, got: $OUT"
    grep -q "hosts from SLURM_JOB_NODELIST=n.* (SLURM_TASKS_PER_NODE=2(x4))" <<<"$ERR" ||
      fail "$tag salloc: -v does not name the allocation: $ERR"
    pass "$tag: inside salloc -N4 --ntasks-per-node 2, no host option: 8 ranks on its 4 hosts"
  fi
  printf 'n5\nn5\nn6\n' >"$WORK/pbs-nodes"
  set +e
  OUT=$(env -u SLURM_JOB_NODELIST PBS_NODEFILE="$WORK/pbs-nodes" "${GR[@]}" --pmi none -- hostname 2>"$WORK/pbs.err" </dev/null)
  RC=$?
  set -e
  ((RC == 0)) && [[ $(sort <<<"$OUT" | tr '\n' ' ') == "n5 n5 n6 " ]] ||
    fail "$tag PBS_NODEFILE: exit $RC, out '$OUT': $(<"$WORK/pbs.err")"
  pass "$tag: PBS_NODEFILE's hosts and slots, no host option"
  no_orphans "$tag alloc"

  # --- env: environment and working-directory options, checked inside the ranks ------------------
  run envopts -H n2,n3 --pmi none -x GREEDY_E2E_X=1 -genv GREEDY_E2E_G "a b" -wdir /var/tmp -- \
    sh -c 'echo "$GREEDY_RANK|$GREEDY_E2E_X|$GREEDY_E2E_G|$(pwd)|${GREEDY_TC_STATE:+inherited}"'
  ((RC == 0)) && [[ $(sort <<<"$OUT" | tr '\n' ' ') == "0|1|a b|/var/tmp|inherited 1|1|a b|/var/tmp|inherited " ]] ||
    fail "$tag env options: exit $RC, out '$OUT': $ERR"
  run envnone -H n2 --pmi none --export NONE,GREEDY_E2E_X=2 -- /bin/sh -c 'echo "$GREEDY_E2E_X|${GREEDY_TC_STATE:-none}"'
  ((RC == 0)) && [[ $OUT == "2|none" ]] || fail "$tag --export NONE: exit $RC, out '$OUT': $ERR"
  pass "$tag: -x, -genv, -wdir and --export NONE,VAR=VAL as the ranks see them"

  # --- exit codes ---------------------------------------------------------------------------
  run exit3 -n 16 --hosts "$HOSTS" --ppn 2 --pmi none -- sh -c '[ $GREEDY_RANK = 5 ] && exit 3; sleep 4240'
  ((RC == 3)) || fail "$tag exit code: expected 3, got $RC: $ERR"
  grep -q "rank 5 on n3 exited with code 3" <<<"$ERR" || fail "$tag exit code: message: $ERR"
  ((SECS < 15)) || fail "$tag exit code: the failing rank took ${SECS}s to end the job"
  no_orphans "$tag exit 3"
  run exit137 -n 4 --hosts "$HOSTS" --pmi none -- sh -c '[ $GREEDY_RANK = 2 ] && kill -KILL $$; exit 0'
  ((RC == 137)) || fail "$tag signal exit: expected 137, got $RC: $ERR"
  run exit127 -n 2 --hosts "$HOSTS" --pmi none -- /nonexistent/prog
  ((RC == 127)) || fail "$tag not found: expected 127, got $RC: $ERR"
  run keepgoing -n 4 --hosts "$HOSTS" --pmi none --keep-going -- sh -c '[ $GREEDY_RANK = 1 ] && exit 4; sleep 1; echo done'
  ((RC == 4)) && [[ $(grep -c done <<<"$OUT") == 3 ]] || fail "$tag --keep-going: exit $RC, out: $OUT"
  pass "$tag: exit codes 3, 137, 127, --keep-going"
  no_orphans "$tag exit codes"

  # --- SIGINT / SIGTERM -----------------------------------------------------------------------
  local t0 pid
  "${GR[@]}" -n 16 --hosts "$HOSTS" --ppn 2 --pmi none --grace 5 -- \
    sh -c 'trap "echo got-TERM-\$GREEDY_RANK; exit 0" TERM; sleep 4241 & wait' >"$WORK/sigint.out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    (($(count_procs sleep 4241) >= 16)) && break
    sleep 0.2
  done
  (($(count_procs sleep 4241) >= 16)) || fail "$tag sigint: 16 ranks did not start"
  t0=$(ms)
  kill -INT "$pid"
  set +e
  wait "$pid"
  RC=$?
  set -e
  ((RC == 130)) || fail "$tag sigint: expected 130, got $RC: $(<"$WORK/sigint.out")"
  [[ $(grep -c got-TERM "$WORK/sigint.out") == 16 ]] ||
    fail "$tag sigint: every rank should see SIGTERM (and its output arrive): $(<"$WORK/sigint.out")"
  no_orphans "$tag sigint"
  pass "$tag: SIGINT -> SIGTERM to all 16 ranks, exit 130 in $(($(ms) - t0)) ms, no orphans"

  "${GR[@]}" -n 8 --hosts "$HOSTS" --pmi none --grace 2 -- sh -c 'trap "" TERM; sleep 4242' >"$WORK/sigterm.out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    (($(count_procs sleep 4242) >= 8)) && break
    sleep 0.2
  done
  t0=$(ms)
  kill -TERM "$pid"
  set +e
  wait "$pid"
  RC=$?
  set -e
  ((RC == 143)) || fail "$tag sigterm: expected 143, got $RC: $(<"$WORK/sigterm.out")"
  no_orphans "$tag sigterm"
  pass "$tag: SIGTERM, ranks ignoring TERM killed after --grace 2: exit 143 in $(($(ms) - t0)) ms"

  # --- an agent killed mid-job --------------------------------------------------------------
  "${GR[@]}" -n 16 --hosts "$HOSTS" --ppn 2 --pmi none -- sleep 4243 >"$WORK/agentkill.out" 2>&1 &
  pid=$!
  local victim=""
  for _ in $(seq 100); do
    if (($(count_procs sleep 4243) >= 16)); then
      for p in $(ip netns pids gtc-n4); do
        [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") == "$BIN/greedyd --launch "* ]] && victim=$p
      done
      [[ -n $victim ]] && break
    fi
    sleep 0.2
  done
  [[ -n $victim ]] || fail "$tag agentkill: no greedyd found on n4"
  kill -KILL "$victim"
  set +e
  wait "$pid"
  RC=$?
  set -e
  ((RC == 125)) || fail "$tag agentkill: expected 125, got $RC: $(<"$WORK/agentkill.out")"
  grep -q "host n4.* lost" "$WORK/agentkill.out" || fail "$tag agentkill: message: $(<"$WORK/agentkill.out")"
  no_orphans "$tag agentkill"
  pass "$tag: agent on n4 SIGKILLed: exit 125, $(grep -c . "$WORK/agentkill.out") line(s), no orphans"

  # --- MPI hello + allreduce, 8 hosts x 2 ----------------------------------------------------
  local hello=$WORK/wireup t
  for t in 1 2 3; do
    if [[ ${GREEDY_E2E_MPICH:-pypi} == pypi ]]; then
      "$MPICH5/bin/mpicc" -O1 -o "$hello" "$ROOT/tests/mpi/wireup.c"
      run mpich -n 16 --hosts "$HOSTS" --ppn 2 --timeout 60 -- env EXPECT_SIZE=16 "$hello"
    else
      mpicc.mpich -O1 -o "$hello" "$ROOT/tests/mpi/wireup.c"
      run mpich -n 16 --hosts "$HOSTS" --ppn 2 --timeout 60 -- timeout 60 env EXPECT_SIZE=16 UCX_TLS=tcp,self "$hello"
    fi
    ((RC == 0)) && break
    [[ ${GREEDY_E2E_MPICH:-pypi} == pypi ]] && break # no retries for the reliable build
    echo "launcher-e2e: Debian MPICH run $t failed ($RC), retrying (research §7.1)"
  done
  ((RC == 0)) || fail "$tag mpich: exit $RC: $ERR $OUT"
  [[ $(grep -c "of 16: ok" <<<"$OUT") == 16 ]] || fail "$tag mpich: expected 16 ok lines: $OUT"
  pass "$tag: MPI hello+allreduce on $NODES hosts x 2 ranks in ${SECS}s"
  if [[ ${GREEDY_E2E_MPICH:-pypi} == pypi ]]; then
    # MPMD: two parts, one job and one wire-up: every rank sees size 16 and its part's argument.
    local part='echo "part $1 $GREEDY_RANK"; exec env EXPECT_SIZE=16 "$0"'
    run mpmd --hosts "$HOSTS" --ppn 2 --timeout 60 -n 4 sh -c "$part" "$hello" a : \
      -n 12 sh -c "$part" "$hello" b
    ((RC == 0)) && [[ $(grep -c "of 16: ok" <<<"$OUT") == 16 ]] || fail "$tag MPMD: exit $RC: $ERR $OUT"
    [[ $(grep -c "^part a [0-3]$" <<<"$OUT") == 4 && $(grep -c "^part b \([4-9]\|1[0-5]\)$" <<<"$OUT") == 12 ]] ||
      fail "$tag MPMD: ranks 0-3 should run part a, 4-15 part b: $OUT"
    pass "$tag: MPMD -n 4 … : -n 12 …, one MPI job of 16 ranks"
  fi
  run mpich-fail -n 16 --hosts "$HOSTS" --ppn 2 --timeout 60 -- "$hello" fail-before-init=9:7
  ((RC == 7)) || fail "$tag mpich early exit: expected 7, got $RC: $ERR"
  no_orphans "$tag mpich"
  pass "$tag: MPI rank 9 exiting before MPI_Init: exit 7 in ${SECS}s"

  # --- Open MPI through greedy-pmix's PMIx server, 8 hosts x 2, no protocol flag (issue 18) ---
  # ob1 over TCP: the hosts share no memory segment, so the data crosses the veths too.
  local ompi=$WORK/wireup-ompi
  local -a ompi_env=(env OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp EXPECT_SIZE=16)
  mpicc.openmpi -O1 -o "$ompi" "$ROOT/tests/mpi/wireup.c"
  run openmpi -n 16 --hosts "$HOSTS" --ppn 2 --timeout 60 -- "${ompi_env[@]}" "$ompi"
  ((RC == 0)) || fail "$tag openmpi: exit $RC: $ERR $OUT"
  [[ $(grep -c "of 16: ok" <<<"$OUT") == 16 ]] || fail "$tag openmpi: expected 16 ok lines: $OUT"
  pass "$tag: Open MPI (PMIx, no --pmi) hello+allreduce on $NODES hosts x 2 ranks in ${SECS}s"
  run openmpi-abort -n 16 --hosts "$HOSTS" --ppn 2 --pmi pmix --timeout 60 -- \
    "${ompi_env[@]}" "$ompi" abort-after-init=5:42
  ((RC == 42)) || fail "$tag openmpi MPI_Abort: expected 42, got $RC: $ERR"
  no_orphans "$tag openmpi"
  pass "$tag: Open MPI rank 5 calling MPI_Abort(42): exit 42 in ${SECS}s, no orphans"

  # --- host whose sshd is stopped -------------------------------------------------------------
  local sshd
  read -r sshd _ <"$GREEDY_TC_STATE/pids/n5.sshd"
  kill -STOP "$sshd" 2>/dev/null || true
  kill -TERM "$sshd"
  kill -CONT "$sshd" 2>/dev/null || true
  sleep 0.5
  run nosshd -n 8 --hosts "$HOSTS" --pmi none --timeout 20 -- sleep 4244
  ((RC == 125 || RC == 124)) || fail "$tag nosshd: expected 125, got $RC: $ERR"
  grep -q "n5" <<<"$ERR" || fail "$tag nosshd: message does not name n5: $ERR"
  ((SECS <= 30)) || fail "$tag nosshd: took ${SECS}s with --timeout 20"
  no_orphans "$tag nosshd"
  pass "$tag: sshd on n5 stopped: exit $RC in ${SECS}s: $(head -1 <<<"$ERR")"

  # --- a remote shell that hangs ----------------------------------------------------------------
  cat >"$WORK/hangsh" <<'EOF'
#!/bin/sh
# A remote shell that hangs for one host (as ssh to a host that swallows packets would).
[ "$1" = n6 ] && exec sleep 4245
exec rsh "$@"
EOF
  chmod +x "$WORK/hangsh"
  run hang -n 8 --hosts "$HOSTS" --pmi none --rsh "$WORK/hangsh" --timeout 5 --progress 1 -- sleep 4246
  ((RC == 124 || RC == 125)) || fail "$tag hang: expected 124/125, got $RC: $ERR"
  grep -q "launch: 7/8 hosts up after .* waiting for n6" <<<"$ERR" || fail "$tag hang: no progress line naming n6: $ERR"
  ERR=$(grep -v "launch: 7/8" <<<"$ERR")
  # The timeout naming n6, then: the second remote shell, to clean n6 up, hung too.
  [[ $(wc -l <<<"$ERR") == 2 ]] || fail "$tag hang: expected two lines besides progress: $ERR"
  grep -q "timed out.*n6" <<<"$ERR" || fail "$tag hang: message does not name n6: $ERR"
  grep -q "could not clean up n6 .*did not answer within 3 s" <<<"$ERR" ||
    fail "$tag hang: n6 not named as left unclean: $ERR"
  ((SECS <= 15)) || fail "$tag hang: took ${SECS}s with --timeout 5"
  JOB_RE="$JOB_RE|sleep 424[56]" no_orphans "$tag hang"
  pgrep -f 'sleep 4245' >/dev/null && fail "$tag hang: the hung remote shell was not killed"
  pass "$tag: hanging remote shell to n6: exit $RC in ${SECS}s: $(head -1 <<<"$ERR")"

  # --- a remote shell that reaches n7 but stalls there before greedyd starts ---------------------
  cat >"$WORK/stallsh" <<'EOF'
#!/bin/sh
# On n7 the remote command stalls before greedyd starts (as a hung login script or filesystem
# would); rshd does not signal it when the client goes. `greedyd --reap` goes through.
if [ "$1" = n7 ]; then case "$2" in *--reap*) ;; *) exec rsh n7 "sleep 4247; $2" ;; esac; fi
exec rsh "$@"
EOF
  chmod +x "$WORK/stallsh"
  run stall -n 8 --hosts "$HOSTS" --pmi none --rsh "$WORK/stallsh" --timeout 5 -- sleep 4248
  ((RC == 124 || RC == 125)) || fail "$tag stall: expected 124/125, got $RC: $ERR"
  [[ $(wc -l <<<"$ERR") == 1 ]] && grep -q "n7" <<<"$ERR" || fail "$tag stall: expected one line naming n7: $ERR"
  ((SECS <= 15)) || fail "$tag stall: took ${SECS}s with --timeout 5"
  JOB_RE="$JOB_RE|sleep 424[78]" no_orphans "$tag stall"
  pass "$tag: remote shell stalled on n7 before greedyd: exit $RC in ${SECS}s, nothing left on n7"
}

up --slurm
cases "8 hosts"

# --- issue 18's client matrix, 4 hosts x 2, no protocol flag or variable ----------------------
. "$ROOT/tests/mpi/clients.sh"
clients_build "$WORK/clients"
for client in "${CLIENTS[@]}"; do
  client_cmd "$client" "$WORK/clients"
  run "client-$client" -n 8 --hosts "n[1-4]" --ppn 2 --timeout 60 -- env EXPECT_SIZE=8 "${CMD[@]}"
  ((RC == 0)) && [[ $(grep -o "of 8: ok" <<<"$OUT" | wc -l) == 8 ]] ||
    fail "clients: $client: exit $RC: $ERR $OUT"
  pass "clients: $client 4x2 with no --pmi: 8/8 ranks ok in ${SECS}s"
done
# Issue 20: the same clients as jobs on a session's agents (started once over ssh), with no
# flag; an exit code; a job on the other hosts beside a running one; then nothing left.
eval "$("${GR[@]}" --hosts "n[1-4]" --ppn 2 --start-session)"
[[ -S ${GREEDY_SESSION:-} ]] || fail "session: no control socket"
for client in "${CLIENTS[@]}"; do
  client_cmd "$client" "$WORK/clients"
  run "session-$client" -n 8 --timeout 60 -- env EXPECT_SIZE=8 "${CMD[@]}"
  ((RC == 0)) && [[ $(grep -o "of 8: ok" <<<"$OUT" | wc -l) == 8 ]] ||
    fail "session: $client: exit $RC: $ERR $OUT"
  pass "session: $client 4x2 on the session's agents, no --pmi: 8/8 ranks ok in ${SECS}s"
done
client_cmd mpich5 "$WORK/clients"
run session-fail -n 8 --timeout 60 -- "${CMD[@]}" fail-before-init=5:7
((RC == 7)) || fail "session: expected 7, got $RC: $ERR"
set +e
"${GR[@]}" -n 4 --hosts "n[1-2]:2" -- sleep 4277 >"$WORK/session-long.out" 2>&1 </dev/null &
long=$!
set -e
sleep 1
run session-beside -n 4 -- sh -c 'echo "beside $(hostname)"'
[[ $RC == 0 && $(grep -c '^beside n[34]$' <<<"$OUT") == 4 ]] ||
  fail "session: a job beside the running one should get n3, n4: exit $RC: $ERR $OUT"
kill -INT "$long"
set +e
wait "$long"
RC=$?
set -e
((RC == 130)) || fail "session: Ctrl-C of a job on the session: expected 130, got $RC"
"${GR[@]}" --end-session
unset GREEDY_SESSION
no_orphans session
pass "session: a failing job (7), a job beside a running one on the free hosts, Ctrl-C (130), end: nothing left"
# Singletons: ranks 4-7 run with an emptied environment (as a careless wrapper would), start as
# "rank 0 of 1" and end 0 without a word, while ranks 0-3 wait in their first fence for them.
client_cmd mpich5 "$WORK/clients"
run singletons --hosts "n[1-4]" --ppn 2 --timeout 60 -n 4 "${CMD[@]}" : -n 4 env -i "${CMD[1]}"
((RC == 125)) && grep -q "on n[34] ended without speaking to the wire-up service while the ranks on n[12] speak PMI-1/PMI-2: they probably ran as singletons" <<<"$ERR" ||
  fail "singletons: exit $RC: $ERR"
((SECS < 20)) || fail "singletons: took ${SECS}s"
pass "singletons: 4 ranks started without the launcher's environment end the job in ${SECS}s, named"
no_orphans clients

# --bind-to core: each of a host's two ranks on its own core (the hosts share this machine's
# cores), as the rank sees it, and an Open MPI job (which reads the PMIx locality) wires up.
client_cmd ompi4 "$WORK/clients"
run bind-core -n 4 --hosts "n[1-2]" --ppn 2 --bind-to core --timeout 60 -- sh -c \
  'echo "bound $GREEDY_RANK $GREEDY_LOCAL_RANK $GREEDY_CPUS $(sed -n "s/^Cpus_allowed_list:\t//p" /proc/self/status)"; exec env EXPECT_SIZE=4 "$@"' sh "${CMD[@]}"
((RC == 0)) && [[ $(grep -o "of 4: ok" <<<"$OUT" | wc -l) == 4 ]] || fail "bind-to core: exit $RC: $ERR $OUT"
[[ $(grep -c '^bound [0-3] 0 0 0$' <<<"$OUT") == 2 && $(grep -c '^bound [0-3] 1 1 1$' <<<"$OUT") == 2 ]] ||
  fail "bind-to core: local rank N should run on core N alone: $OUT"
pass "--bind-to core: each host's rank N on core N (as /proc/self/status says), Open MPI 4/4 ranks ok"
# ... and PMIx tells each rank, and its local peer, where it runs: core N, CPU N.
run bind-locality -n 4 --hosts "n[1-2]" --ppn 2 --bind-to core --timeout 60 -- "$WORK/clients/locality"
((RC == 0)) || fail "bind-to core locality: exit $RC: $ERR $OUT"
for r in 0 1 2 3; do
  c=$((r % 2)) p=$((r ^ 1))
  grep -Eq "^locality $r ([A-Z0-9]+:)*CR$c:.* hwloc:$c$" <<<"$OUT" &&
    grep -Eq "^peer $r $p ([A-Z0-9]+:)*CR$((p % 2)):" <<<"$OUT" ||
    fail "bind-to core locality: rank $r should be told core $c, CPU $c, and its peer core $((p % 2)): $OUT"
done
run unbound-locality -n 2 --hosts n1 --ppn 2 --timeout 60 -- "$WORK/clients/locality"
((RC == 0)) && [[ $(grep -c '^unbound [01]$' <<<"$OUT") == 2 ]] ||
  fail "unbound ranks should be told no locality: exit $RC: $ERR $OUT"
pass "--bind-to core: PMIx tells each rank its core and CPU (PMIX_LOCALITY_STRING, PMIX_CPUSET) and its peer's; unbound ranks none"

# --map-by node: consecutive ranks go round the hosts; MPICH (PMI_process_mapping) and Open MPI
# (PMIx proc map) wire up with ranks 0,2 on n1 and 1,3 on n2.
for client in mpich5 ompi4; do
  client_cmd "$client" "$WORK/clients"
  run "map-by-node-$client" -n 4 --hosts "n[1-2]" --ppn 2 --map-by node --timeout 60 -- sh -c \
    'echo "placed $GREEDY_RANK $(hostname)"; exec env EXPECT_SIZE=4 "$@"' sh "${CMD[@]}"
  ((RC == 0)) && [[ $(grep -o "of 4: ok" <<<"$OUT" | wc -l) == 4 ]] || fail "map-by node: $client: exit $RC: $ERR $OUT"
  [[ $(grep -Ec '^placed [02] n1$|^placed [13] n2$' <<<"$OUT") == 4 ]] ||
    fail "map-by node: $client: ranks 0,2 on n1 and 1,3 on n2 expected: $OUT"
  pass "--map-by node: ranks 0,2 on n1 and 1,3 on n2, $client 4/4 ranks ok"
done

# Slurm as the remote shell, inside an allocation (where ssh may not be allowed): one srun step
# starts every agent (rank 0 counts the job's steps while it runs), and they connect back; the
# MPI job wires up across them as over ssh.
client_cmd mpich5 "$WORK/clients"
set +e
timeout 120 salloc -Q -N4 --ntasks-per-node 2 -- "${GR[@]}" --rsh srun --timeout 60 -- sh -c \
  '[ "$GREEDY_RANK" = 0 ] && echo "steps $(squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -vc -e extern -e interactive)"
   exec env EXPECT_SIZE=8 "$@"' sh "${CMD[@]}" >"$WORK/alloc-srun.out" 2>"$WORK/alloc-srun.err" </dev/null
RC=$?
set -e
OUT=$(<"$WORK/alloc-srun.out") ERR=$(<"$WORK/alloc-srun.err")
((RC == 0)) && [[ $(grep -o "of 8: ok" <<<"$OUT" | wc -l) == 8 ]] ||
  fail "alloc --rsh srun: exit $RC: $ERR $OUT"
grep -qx "steps 1" <<<"$OUT" || fail "alloc --rsh srun: one step should start every agent: $OUT"
no_orphans alloc-srun
pass "inside salloc -N4 --ntasks-per-node 2: greedyrun --rsh srun, one step for the 4 agents, MPICH 8/8 ranks ok"
cd "$ROOT" # down deletes the scratch dir we are in
"$TC" down >/dev/null
trap - EXIT
up --delay 20
GR=("$BIN/greedyrun" --timeout 30 --progress 0)
run delay-hostname -n 16 --hosts "$HOSTS" --ppn 2 --pmi none -- hostname
((RC == 0)) && [[ $(wc -l <<<"$OUT") == 16 ]] || fail "delay 20: hostname: exit $RC: $ERR"
pass "delay 20: hostname 8x2 over ssh in ${SECS}s"
run delay-rsh -n 16 --hosts "$HOSTS" --ppn 2 --rsh rsh --topology binomial -- hostname
((RC == 0)) && [[ $(wc -l <<<"$OUT") == 16 ]] || fail "delay 20: rsh binomial: exit $RC: $ERR"
pass "delay 20: hostname 8x2 over rsh, binomial tree, with PMI up, in ${SECS}s"
if [[ ${GREEDY_E2E_MPICH:-pypi} == pypi ]]; then
  "$MPICH5/bin/mpicc" -O1 -o "$WORK/wireup" "$ROOT/tests/mpi/wireup.c"
  run delay-mpich -n 16 --hosts "$HOSTS" --ppn 2 --timeout 60 -- env EXPECT_SIZE=16 "$WORK/wireup"
  ((RC == 0)) && [[ $(grep -c "of 16: ok" <<<"$OUT") == 16 ]] || fail "delay 20: mpich: exit $RC: $ERR $OUT"
  pass "delay 20: MPI hello 8x2 in ${SECS}s"
fi
no_orphans "delay"
cd "$ROOT"
"$TC" down >/dev/null
trap - EXIT
pass "all launcher cases"
