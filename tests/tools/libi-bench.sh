#!/bin/bash
# tests/tools/libi-bench.sh: libgreedy and greedy-stack side by side with their competitors on
# the emulated Slurm cluster (22.05), one cluster per size, the runners interleaved per rep.
#   launch  launch one tool daemon per host and gather 1 KB from each to the front end, beside a
#           running job that holds every node (srun -N H -n H sleep):
#             libgreedy-slurm   tests/tools/gather1k.c (libgreedy's C ABI), `gather1k job J H`:
#                               GREEDY_BACKEND_SLURM_JOB (srun --overlap --jobid J --mpi=greedy),
#                               greedy_gather to the master, the total to the front end
#             libgreedy-ssh     the same program, `gather1k rsh ssh n1 … nH`: greedyrun over ssh
#             srun-overlap-tcp  srun --overlap --jobid J -N H -n H --mpi=none, each task sending
#                               1024 bytes to a listener on the login node (bash's /dev/tcp)
#             ssh-serial        for h: ssh h 'head -c 1024 /dev/zero', output counted
#             ssh-parallel      the same, every ssh at once (&, wait), as pdsh would
#             ssh-parallel-curve25519  the same with -oKexAlgorithms=^curve25519-sha256, the
#                               cheaper key exchange greedyrun asks ssh for (launcher/src/ssh.rs)
#   stack   a hung MPI job of one rank per host (srun -N H -n H --mpi=greedy tests/mpi/hang.c),
#             greedy-stack         greedy-stack --job J.0, every rank named in its output
#             ssh-eu-stack-serial  for h: ssh h, there `eu-stack -p PID` for each process of the
#                                  job on h (environment SLURM_JOB_ID=J, SLURMD_NODENAME=h,
#                                  SLURM_PROCID set: what pgrep would give on a real node; the
#                                  hosts share one PID namespace), H processes' stacks in all
#   stack-idle  the same two against a job of one `sleep` per host: the tools' own cost, without
#             H ranks spinning on the machine's cores
# Every run is checked (ok: H*1024 bytes, or every rank's stack); after each, nothing of it may
# be left on any host or on the login node. One CSV row per run is appended to --csv (default
# docs/data/libi-bench.csv: time_utc,hosts,what,method,rep,seconds,ok); a table of medians (ok
# runs) and their ratio to libgreedy's (launch: libgreedy-slurm; stack: greedy-stack) closes.
# All emulated hosts share this machine's cores: the CPU, not a network, decides.
# usage: tests/tools/libi-bench.sh [--hosts "16 64"] [--reps N] [--what "launch stack stack-idle"]
#                                  [--csv FILE]
# Env: CARGO_TARGET_DIR (default <repo>/target).
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
SIZES="16 64" REPS=3 WHAT="launch stack" CSV=$ROOT/docs/data/libi-bench.csv
usage() {
  echo "usage: $0 [--hosts \"16 64\"] [--reps N] [--what \"launch stack stack-idle\"] [--csv FILE]" >&2
  exit 2
}
while (($#)); do
  (($# >= 2)) || usage
  case $1 in
    --hosts) SIZES=$2 ;;
    --reps) REPS=$2 ;;
    --what) WHAT=$2 ;;
    --csv) CSV=$2 ;;
    *) usage ;;
  esac
  shift 2
done
[[ $REPS =~ ^[1-9][0-9]*$ ]] || usage
for w in $WHAT; do [[ $w =~ ^(launch|stack|stack-idle)$ ]] || usage; done
for n in $SIZES; do [[ $n =~ ^[1-9][0-9]*$ ]] || usage; done
need_shared_target
need_root
command -v eu-stack >/dev/null || fail "eu-stack (elfutils) is not installed"

# --- builds: release, as libi.sh does them ------------------------------------------------------
# shellcheck source=../slurm/mpi-build.sh
. "$ROOT/tests/slurm/mpi-build.sh" # PLUGDIR, BINDIR, MPICH5
"$MPICH5/bin/mpicc" -g -O0 -o "$BINDIR/hang" "$ROOT/tests/mpi/hang.c" || fail "PyPI MPICH's mpicc"
build --release -p greedy-launcher -p greedy-libi # BIN: the release directory
LIB=$BINDIR/libgreedy-release
mkdir -p "$LIB"
ln -sf "$BIN/libgreedy_libi.so" "$LIB/libgreedy.so.0"
ln -sf libgreedy.so.0 "$LIB/libgreedy.so"
cc -O2 -Wall -Wextra -Werror -I"$ROOT/libgreedy/include" -o "$BINDIR/gather1k" \
  "$ROOT/tests/tools/gather1k.c" -L"$LIB" -lgreedy || fail "cc gather1k.c"
export LD_LIBRARY_PATH=$LIB GREEDYRUN=$BIN/greedyrun
LOGIN_ADDR=10.123.1.1 # the login node (the root namespace) as every host reaches it

# The helpers every run uses, in the shared target dir (the hosts' /tmp is private).
HELP=$BINDIR/libi-bench
mkdir -p "$HELP"
# listen.py N PORTFILE LIMIT: accepts on the login node's address until N senders closed (or
# LIMIT s passed), counting bytes; writes its port to PORTFILE first, prints "BYTES CLOSED".
cat >"$HELP/listen.py" <<PY
import os, selectors, socket, sys, time
n, portfile, limit = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("$LOGIN_ADDR", 0))
s.listen(4096)
s.setblocking(False)
with open(portfile + ".new", "w") as f:
    f.write(str(s.getsockname()[1]))
os.rename(portfile + ".new", portfile)
sel = selectors.DefaultSelector()
sel.register(s, selectors.EVENT_READ)
total = closed = 0
deadline = time.monotonic() + limit
while closed < n and time.monotonic() < deadline:
    for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
        if key.fileobj is s:
            c, _ = s.accept()
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ)
            continue
        data = key.fileobj.recv(65536)
        if data:
            total += len(data)
        else:
            sel.unregister(key.fileobj)
            key.fileobj.close()
            closed += 1
print(total, closed)
PY
# srun-tcp.sh J N PORT RESULT: N tasks beside job J, each sending 1024 bytes to the listener;
# returns srun's exit once the listener has written RESULT too (it has counted every byte).
cat >"$HELP/srun-tcp.sh" <<SH
#!/bin/bash
srun --overlap --jobid "\$1" -N "\$2" -n "\$2" --mpi=none \\
  bash -c "head -c 1024 /dev/zero >/dev/tcp/$LOGIN_ADDR/\$3"
rc=\$?
while [[ ! -s \$4 ]]; do sleep 0.005; done
exit \$rc
SH
# ssh-serial.sh N / ssh-parallel.sh N [SSH-OPTION…]: 1024 bytes from each of n1..nN, counted on
# the login node.
cat >"$HELP/ssh-serial.sh" <<'SH'
#!/bin/bash
for ((i = 1; i <= $1; i++)); do
  ssh -n -oBatchMode=yes "n$i" 'head -c 1024 /dev/zero'
done | wc -c
SH
cat >"$HELP/ssh-parallel.sh" <<'SH'
#!/bin/bash
{
  for ((i = 1; i <= $1; i++)); do
    ssh -n -oBatchMode=yes "${@:2}" "n$i" 'head -c 1024 /dev/zero' &
  done
  wait
} | wc -c
SH
# eu-loop.sh J N: on each of n1..nN in turn, eu-stack every rank of job J on that host.
cat >"$HELP/eu-loop.sh" <<'SH'
#!/bin/bash
for ((i = 1; i <= $2; i++)); do
  ssh -n -oBatchMode=yes "n$i" "for p in \$(grep -lzx SLURM_JOB_ID=$1 /proc/[0-9]*/environ 2>/dev/null |
    xargs -r grep -lzx SLURMD_NODENAME=n$i 2>/dev/null | xargs -r grep -lz '^SLURM_PROCID=' 2>/dev/null |
    cut -d/ -f3); do eu-stack -p \$p; done"
done
SH
chmod +x "$HELP"/*.sh

[[ -s $CSV ]] || echo "time_utc,hosts,what,method,rep,seconds,ok" >"$CSV"
ROWS=() # this run's rows, for the summary
# record WHAT METHOD REP OK: one CSV row of the last run_timed (its start time, SECS).
record() {
  local row="$T_UTC,$H,$1,$2,$3,$SECS,$4"
  echo "$row" >>"$CSV"
  ROWS+=("$row")
  echo "libi-bench: $H hosts $1 rep $3 $2: ${SECS}s ok=$4" >&2
}
# timed NAME LIMIT CMD…: run_timed with the UTC start time kept in T_UTC.
timed() {
  T_UTC=$(date -u +%FT%TZ)
  run_timed "$@"
}

# --- leftovers: on the hosts (leftovers.sh), the steps' slurmstepds, the login node --------------
# shellcheck source=../cluster/leftovers.sh
. "$ROOT/tests/cluster/leftovers.sh"
JOB_RE='x^' # set per check
# stepds: how many slurmstepds run (the hosts share the machine's PID namespace, and there is one
# cluster on it: ours).
stepds() { pgrep -c -x slurmstepd || true; }
# clean NAME RE STEPDS: nothing matching RE on any host, no process of ours on the login node
# but the job holders, and STEPDS slurmstepds (the running jobs' own), within 20 s.
clean() {
  local name=$1 re=$2 stepds=$3 n mine _i
  # shellcheck disable=SC2034 # read by leftovers.sh
  JOB_RE=$re
  no_leftovers "$name"
  for _i in $(seq 100); do
    n=$(stepds)
    mine=$(pgrep -af "$BINDIR/(gather1k|libi-bench/)|greedy-stack --(job $JOB|daemon)" || true)
    [[ $n == "$stepds" && -z $mine ]] && return 0
    sleep 0.2
  done
  fail "$name: left behind: $n slurmstepds (want $stepds); on the login node: $mine"
}

# wait_ready FILE N: N "ready" lines in FILE within 5 min (N ranks of MPICH on 2 cores).
wait_ready() {
  for _ in $(seq 1500); do
    (($(grep -c ' ready$' "$1" 2>/dev/null || true) >= $2)) && return 0
    sleep 0.2
  done
  fail "the hung job never got ready: $(tail -5 "$1")"
}
# start_job OUT CMD…: CMD in the background (its pid in JOBPID), its job id (JOB) once its step 0
# runs (the only job on our cluster).
start_job() {
  local out=$1 _i
  shift
  "$@" >"$out" 2>&1 &
  JOBPID=$!
  JOB=""
  for _i in $(seq 600); do
    JOB=$(squeue -h -t R -o %i | head -1)
    [[ -n $JOB ]] && squeue -h -s -j "$JOB" -o %i | grep -qx "$JOB.0" && return 0
    sleep 0.2
  done
  fail "job $* did not start: $(cat "$out")"
}
end_job() {
  scancel "$JOB"
  wait "$JOBPID" || true
  JOBPID=""
}
JOBPID=""
# Run by cluster_up's EXIT trap before `down`: our job cancelled, then its srun on the login
# node gone (a TERM alone leaves srun waiting for tasks of a cluster about to vanish).
end_ours() {
  [[ -n $JOBPID ]] || return 0
  scancel "$JOB" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$JOBPID" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$JOBPID" 2>/dev/null || true
}
at_exit end_ours

# --- launch ------------------------------------------------------------------------------------
# launch_rep REP: every launch runner once, beside job $JOB.
launch_rep() {
  local k=$1 m ok bytes hosts port
  hosts=$(seq -f 'n%g' 1 "$H" | tr '\n' ' ')
  for m in libgreedy-slurm libgreedy-ssh srun-overlap-tcp ssh-serial ssh-parallel \
    ssh-parallel-curve25519; do
    case $m in
      libgreedy-slurm)
        timed "$m" 300 "$BINDIR/gather1k" job "$JOB" "$H"
        ok=0
        ((RC == 0)) && [[ $OUT == "$H daemons, $((H * 1024)) bytes gathered" ]] && ok=1
        ;;
      libgreedy-ssh)
        # shellcheck disable=SC2086 # one word per host
        timed "$m" 300 "$BINDIR/gather1k" rsh ssh $hosts
        ok=0
        ((RC == 0)) && [[ $OUT == "$H daemons, $((H * 1024)) bytes gathered" ]] && ok=1
        ;;
      srun-overlap-tcp)
        rm -f "$WORK/port"
        python3 "$HELP/listen.py" "$H" "$WORK/port" 280 >"$WORK/listen.out" 2>&1 &
        local lpid=$!
        for _ in $(seq 100); do [[ -s $WORK/port ]] && break; sleep 0.05; done
        port=$(cat "$WORK/port") || fail "the listener did not start: $(cat "$WORK/listen.out")"
        timed "$m" 300 "$HELP/srun-tcp.sh" "$JOB" "$H" "$port" "$WORK/listen.out"
        wait "$lpid" || true
        bytes=$(cat "$WORK/listen.out")
        ok=0
        ((RC == 0)) && [[ $bytes == "$((H * 1024)) $H" ]] && ok=1
        OUT+=" listener: $bytes"
        ;;
      ssh-serial | ssh-parallel | ssh-parallel-curve25519)
        if [[ $m == ssh-parallel-curve25519 ]]; then
          timed "$m" 600 "$HELP/ssh-parallel.sh" "$H" -oKexAlgorithms=^curve25519-sha256
        else
          timed "$m" 600 "$HELP/$m.sh" "$H"
        fi
        ok=0
        ((RC == 0)) && [[ $OUT == "$((H * 1024))" ]] && ok=1
        ;;
    esac
    record launch "$m" "$k" "$ok"
    ((ok)) || echo "libi-bench: $m failed (exit $RC): $(tail -c 600 <<<"$OUT") $(tail -c 600 <<<"$ERR")" >&2
    if [[ $m == libgreedy-* ]]; then grep -h 'phases' "$WORK/$m.err" >&2 || true; fi
    clean "$m" 'gather1k|greedyd|greedyrun|/dev/tcp|head -c 1024' "$STEPDS"
  done
}

bench_launch() {
  start_job "$WORK/holder.out" srun -N"$H" -n"$H" --mpi=none sleep 100000
  # The holder's own slurmstepds (one per node, with an extern step's where Slurm makes one).
  sleep 1
  STEPDS=$(stepds)
  local k
  for ((k = 0; k < REPS; k++)); do launch_rep "$k"; done
  end_job
  clean "launch" 'slurmstepd|sleep 100000|gather1k|greedyd|greedyrun|/dev/tcp|head -c 1024' 0
  wait_idle
}

# --- stack -------------------------------------------------------------------------------------
# all_ranks: greedy-stack's output ($OUT) names every rank 0..H-1.
RANKS_CHECK=$(
  cat <<'PY'
import re, sys
n = int(sys.argv[1])
seen = set()
for line in sys.stdin:
    m = re.match(r"\[([0-9,-]+)\] ", line)
    if m:
        for part in m[1].split(","):
            a, _, b = part.partition("-")
            seen |= set(range(int(a), int(b or a) + 1))
sys.exit(0 if seen == set(range(n)) else 1)
PY
)
# stack_reps WHAT MAIN: REPS × (greedy-stack, the ssh loop) on job $JOB's step 0; MAIN: a regex
# every rank's stack must match in the loop's output.
stack_reps() {
  local what=$1 main=$2 k ok
  for ((k = 0; k < REPS; k++)); do
    timed greedy-stack 600 "$BIN/greedy-stack" --job "$JOB.0" --timeout 600
    ok=0
    ((RC == 0)) && python3 -c "$RANKS_CHECK" "$H" <<<"$OUT" && ok=1
    record "$what" greedy-stack "$k" "$ok"
    ((ok)) || echo "libi-bench: greedy-stack failed (exit $RC): $(tail -c 600 <<<"$OUT") $ERR" >&2
    clean greedy-stack 'greedy-stack|eu-stack|greedyd' "$STEPDS"

    timed ssh-eu-stack-serial 1200 "$HELP/eu-loop.sh" "$JOB" "$H"
    ok=0
    # One "PID p - process" header per rank, and as many stacks through MAIN.
    ((RC == 0)) && (($(grep -c '^PID [0-9]* - process' <<<"$OUT") == H)) &&
      (($(grep -c -E "$main" <<<"$OUT") >= H)) && ok=1
    record "$what" ssh-eu-stack-serial "$k" "$ok"
    ((ok)) || echo "libi-bench: ssh eu-stack loop failed (exit $RC): $(head -c 600 <<<"$OUT") $ERR" >&2
    clean ssh-eu-stack-serial 'eu-stack|grep -lz' "$STEPDS"
  done
}
bench_stack() {
  start_job "$WORK/hang.out" srun -N"$H" -n"$H" --mpi=greedy "$BINDIR/hang"
  wait_ready "$WORK/hang.out" "$H"
  sleep 1
  STEPDS=$(stepds)
  stack_reps stack ' main$| main '
  end_job
  clean "stack" 'slurmstepd|/hang|greedy-stack|eu-stack|greedyd' 0
  wait_idle
}
# The same against ranks that sleep: no H spinning ranks sharing the cores with the tools.
bench_stack_idle() {
  start_job "$WORK/idle.out" srun -N"$H" -n"$H" --mpi=none sleep 100000
  sleep 1
  STEPDS=$(stepds)
  stack_reps stack-idle 'nanosleep'
  end_job
  clean "stack-idle" 'slurmstepd|sleep 100000|greedy-stack|eu-stack|greedyd' 0
  wait_idle
}

# --- one cluster per size ----------------------------------------------------------------------
START=$(date -u +%FT%TZ)
for H in $SIZES; do
  t0=$(ms)
  cluster_up --nodes "$H" --slurm --plugindir "$PLUGDIR" --mpi-default greedy
  eval "$("$TC" env)"
  WORK=$GREEDY_TC_SCRATCH/libi-bench
  mkdir -p "$WORK"
  cd "$WORK"
  wait_sshd "$H"
  wait_idle
  echo "libi-bench: $H hosts up in $((($(ms) - t0) / 1000)) s; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  for w in $WHAT; do
    t1=$(ms)
    "bench_${w//-/_}"
    echo "libi-bench: $H hosts $w: $((($(ms) - t1) / 1000)) s; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  done
  cd "$ROOT"
  "$TC" down >/dev/null
  trap - EXIT # the next size's cluster_up sets it again; never take down another's cluster
done

# --- summary: medians of the ok runs, ratio to libgreedy's --------------------------------------
echo
echo "libi-bench: $START to $(date -u +%FT%TZ), reps $REPS, rows appended to ${CSV#"$ROOT"/}"
echo "| hosts | what | method | median s | vs libgreedy | ok |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}" | awk -F, '
  { key = $2 SUBSEP $3 SUBSEP $4; runs[key]++; if ($7 == 1) { ok[key]++; v[key, ok[key]] = $6 }
    if (!(key in order)) { order[key] = ++n; keys[n] = key } }
  function median(key,   i, j, m, t, a) {
    m = ok[key]; if (!m) return -1
    for (i = 1; i <= m; i++) a[i] = v[key, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return a[int((m + 1) / 2)]
  }
  END {
    for (i = 1; i <= n; i++) {
      split(keys[i], f, SUBSEP)
      base = f[2] == "launch" ? "libgreedy-slurm" : "greedy-stack"
      b = median(f[1] SUBSEP f[2] SUBSEP base); m = median(keys[i])
      printf "| %s | %s | %s | %s | %s | %d/%d |\n", f[1], f[2], f[3],
        m < 0 ? "-" : sprintf("%.2f", m), (m < 0 || b <= 0) ? "-" : sprintf("%.2fx", m / b),
        ok[keys[i]], runs[keys[i]]
    }
  }'
