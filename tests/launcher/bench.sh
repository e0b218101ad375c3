#!/usr/bin/env bash
# Side-by-side launch measurements of greedyrun against MPICH's Hydra and Open MPI's mpirun on
# the emulated cluster (numbers in docs/benchmarks.md, "greedyrun vs Hydra and Open MPI").
#
#   tests/launcher/bench.sh            # RUNS=3 SIZES="16 64" DELAY=10 PARTS="A B C"
#   PARTS=D SIZES= CSIZE=64: what --batch costs (flat with 8 vs 64 shells in flight, and Hydra)
#   PARTS="A C" SIZES=16 CSIZE=64 runs the MPI hello on 16 hosts and B/C on 64
#   PARTS=M SIZES= MSIZES="8 16 32 64" SHELLS="rsh ssh": the model validation (part M below)
#   results (CSV, every run's stderr) are copied to $BENCH_OUT (default $CARGO_TARGET_DIR/launcher-bench)
#   SETTLE=N: wait at most N half-seconds for an idle machine before each run (default 30)
#   ACONFIGS="hydra ompi gr-greedy": only these runners of part A (default: all six)
#   MPICH_NET=ofi: MPICH's hello over libfabric's tcp provider instead of its default, UCX, whose
#                address exchange fails at 512 hosts here ("Destination is unreachable")
#   `greedy-bench` (bench/) runs this script per section and turns the CSV into docs/benchmarks.md
#
# Part A (same cluster, same sitting, interleaved runs): launch-to-finish wall time of an MPI
# hello (tests/mpi/wireup.c: Init, Allreduce, Barrier, Finalize), 1 rank per host:
#   hydra        PyPI mpich 5.0.2 `mpiexec.hydra -launcher ssh` (Debian's 4.0.2 hello hangs in
#                MPI_Finalize here, research/baseline-launchers.md §4), default ssh
#   ompi         Open MPI 4.1.4 `mpirun` at its defaults (tree spawn, radix 64), default ssh
#   gr-flat-kex  greedyrun --topology flat with Debian's default ssh KEX: same hops as Hydra
#   gr-flat      greedyrun --topology flat, cheap hops (curve25519 first, the default)
#   gr-greedy    greedyrun defaults: cheap hops + greedy tree (SEQ/REM calibrated below)
#   gr-greedy-rsh  the same over rsh (its own calibrated SEQ/REM)
# gr-flat-kex → gr-flat is what cheaper hops buy; gr-flat → gr-greedy is what the tree buys.
# All MPI programs are the same source, built by each MPI's own mpicc.
#
# Part C: the same side by side for `hostname` (launch only) on the largest size, or on each of
# CSIZES (issue 19's 128/256/512: `PARTS=C SIZES= CSIZES="128 256 512"`), plus greedyrun over rsh.
#
# Part B: the tree alone. 64 hosts over rsh (cheap hops), `--pmi none -- true`, topologies
# flat, binomial, kary:4, kary:8, greedy; greedyrun -v reports when the last agent said hello
# and what the SEQ/REM model predicts for that tree, with SEQ/REM from `greedyrun --calibrate`
# on the same hosts.
#
# Part M: the model validation (the paper's Figure 4 on these hosts): every topology of part B
# at each of MSIZES hosts, over each of SHELLS (rsh, ssh with cheap hops), `--pmi none -- true`;
# the greedy tree uses that shell's calibrated SEQ/REM (calibration.csv). One cluster per DELAY:
# greedy-bench runs the script once per delay.
#
# Runs itself under `unshare --uts` with hostname `login`: Hydra and Open MPI send their own
# hostname to remote daemons for call-backs, and this machine's name resolves to 127.0.0.1.
# Waits for another engineer's cluster to go down (never tears it down). ≈ 10 min.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
if [[ ${GREEDY_BENCH_UTS:-} != 1 ]]; then
  exec env GREEDY_BENCH_UTS=1 unshare --uts bash -c 'hostname login && exec "$0" "$@"' "$0" "$@"
fi
export GREEDY_TC_QUIET=1
RUNS=${RUNS:-3}
SIZES=${SIZES-16 64} # SIZES= (empty) runs no part A size
DELAY=${DELAY:-10}
PARTS=${PARTS:-A B C}
ACONFIGS=${ACONFIGS:-hydra ompi gr-flat-kex gr-flat gr-greedy gr-greedy-rsh}
MPICH_ENV=()
[[ ${MPICH_NET:-} != ofi ]] || MPICH_ENV=(MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp)
MSIZES=${MSIZES:-8 16 32 64}
SHELLS=${SHELLS:-rsh ssh}
SETTLE=${SETTLE:-30}

. "$ROOT/tests/launcher/cluster-bench.sh"
. "$ROOT/tests/mpi/mpich5.sh"

MAXN=${CSIZE:-0} # CSIZE: hosts of parts B and C (default: the largest of SIZES)
for n in $SIZES ${CSIZES:-}; do ((n > MAXN)) && MAXN=$n; done
if [[ " $PARTS " == *" M "* ]]; then
  for n in $MSIZES; do ((n > MAXN)) && MAXN=$n; done
fi
cluster_up --nodes "$MAXN" --delay "$DELAY"
eval "$("$TC" env)"
wait_sshd "$MAXN"
W=$GREEDY_TC_SCRATCH/bench
mkdir -p "$W"
cd "$W"
if [[ " $PARTS " == *" A "* ]]; then
  "$MPICH5/bin/mpicc" -O1 -o hello_mpich5 "$ROOT/tests/mpi/wireup.c"
  mpicc.openmpi -O1 -o hello_ompi "$ROOT/tests/mpi/wireup.c"
fi
CSV=$W/results.csv
echo "part,hosts,config,run,wall_ms,rc,ok,cpu_s,launch_ms,model_ms" >"$CSV"

# measure PART N CONFIG RUN EXPECT CMD... : one timed run, appended to the CSV.
measure() {
  local part=$1 n=$2 cfg=$3 run=$4 expect=$5
  shift 5
  local t0 j0 rc wall cpu ok launch="" model=""
  [[ $part != A || " $ACONFIGS " == *" $cfg "* ]] || return 0
  settle
  j0=$(busy_jiffies)
  t0=$(ms)
  set +e
  # 120 s, or two seconds per host past 120 hosts: an MPI hello on 256 hosts takes 100-120 s here.
  timeout $((n > 120 ? 2 * n : 120)) "$@" >"$W/$cfg-$n-$run.out" 2>"$W/$cfg-$n-$run.err" </dev/null
  rc=$?
  set -e
  wall=$(($(ms) - t0))
  cpu=$(awk -v a="$j0" -v b="$(busy_jiffies)" 'BEGIN {printf "%.2f", (b - a) / 100}')
  ok=$(grep -c "$expect" "$W/$cfg-$n-$run.out" || true)
  if grep -q "agents up after" "$W/$cfg-$n-$run.err"; then
    launch=$(sed -n 's/.*agents up after \([0-9.]*\) s.*/\1/p' "$W/$cfg-$n-$run.err" | awk '{printf "%d", $1 * 1000}')
    model=$(sed -n 's/.*predicts \([0-9.]*\) s.*/\1/p' "$W/$cfg-$n-$run.err" | awk '{printf "%d", $1 * 1000}')
  fi
  echo "$part,$n,$cfg,$run,$wall,$rc,$ok,$cpu,$launch,$model" >>"$CSV"
  echo "bench: $part n=$n $cfg run $run: ${wall} ms rc=$rc ok=$ok cpu=${cpu}s ${launch:+launch=${launch}ms model=${model}ms}"
}

# --- calibrate SEQ/REM on these hosts, per remote shell ------------------------------------------
ALL="n[1-$MAXN]"
"$BIN/greedyrun" --calibrate --hosts "$ALL" >"$W/cal-ssh.txt"
"$BIN/greedyrun" --calibrate --hosts "$ALL" --rsh rsh >"$W/cal-rsh.txt"
cat "$W/cal-ssh.txt" "$W/cal-rsh.txt"
SSH_SEQ=$(sed -n 's/^GREEDY_SEQ=//p' "$W/cal-ssh.txt")
SSH_REM=$(sed -n 's/^GREEDY_REM=//p' "$W/cal-ssh.txt")
RSH_SEQ=$(sed -n 's/^GREEDY_SEQ=//p' "$W/cal-rsh.txt")
RSH_REM=$(sed -n 's/^GREEDY_REM=//p' "$W/cal-rsh.txt")
{
  echo "shell,delay_ms,seq,rem"
  echo "ssh,$DELAY,$SSH_SEQ,$SSH_REM"
  echo "rsh,$DELAY,$RSH_SEQ,$RSH_REM"
} >"$W/calibration.csv"

# --- Part A --------------------------------------------------------------------------------------
DEFAULT_KEX="ssh -oKexAlgorithms=sntrup761x25519-sha512@openssh.com,curve25519-sha256"
[[ " $PARTS " == *" A "* ]] || SIZES=""
for n in $SIZES; do
  for i in $(seq "$n"); do echo "n$i"; done >"hosts$n"
  for i in $(seq "$n"); do echo "n$i slots=1"; done >"hosts$n.ompi"
  for run in $(seq "$RUNS"); do
    measure A "$n" hydra "$run" "of $n: ok" \
      "$MPICH5/bin/mpiexec.hydra" -launcher ssh -f "hosts$n" -n "$n" -ppn 1 env EXPECT_SIZE="$n" "${MPICH_ENV[@]}" ./hello_mpich5
    measure A "$n" ompi "$run" "of $n: ok" \
      mpirun --allow-run-as-root --hostfile "hosts$n.ompi" -np "$n" --map-by node -x EXPECT_SIZE="$n" ./hello_ompi
    measure A "$n" gr-flat-kex "$run" "of $n: ok" \
      "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --topology flat --rsh "$DEFAULT_KEX" \
      --seq "$SSH_SEQ" --rem "$SSH_REM" -- env EXPECT_SIZE="$n" "${MPICH_ENV[@]}" ./hello_mpich5
    measure A "$n" gr-flat "$run" "of $n: ok" \
      "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --topology flat \
      --seq "$SSH_SEQ" --rem "$SSH_REM" -- env EXPECT_SIZE="$n" "${MPICH_ENV[@]}" ./hello_mpich5
    measure A "$n" gr-greedy "$run" "of $n: ok" \
      "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" \
      --seq "$SSH_SEQ" --rem "$SSH_REM" -- env EXPECT_SIZE="$n" "${MPICH_ENV[@]}" ./hello_mpich5
    measure A "$n" gr-greedy-rsh "$run" "of $n: ok" \
      "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --rsh rsh \
      --seq "$RSH_SEQ" --rem "$RSH_REM" -- env EXPECT_SIZE="$n" "${MPICH_ENV[@]}" ./hello_mpich5
  done
done

# --- Part B --------------------------------------------------------------------------------------
for run in $(seq "$RUNS"); do
  [[ " $PARTS " == *" B "* ]] || break
  for topo in flat binomial kary:4 kary:8 greedy; do
    measure B "$MAXN" "rsh-$topo" "$run" "" \
      "$BIN/greedyrun" -v --progress 0 --hosts "$ALL" --rsh rsh --pmi none --topology "$topo" \
      --seq "$RSH_SEQ" --rem "$RSH_REM" -- true
  done
done

# --- Part C: launch only, `hostname`, the largest size or each of CSIZES (MPI at 64 ranks on 2
# cores fails for every launcher's MPICH, see docs/benchmarks.md) -------------------------------
csizes=""
[[ " $PARTS " != *" C "* ]] || csizes=${CSIZES:-$MAXN}
for run in $(seq "$RUNS"); do
  for n in $csizes; do
    for i in $(seq "$n"); do echo "n$i"; done >"hosts$n"
    for i in $(seq "$n"); do echo "n$i slots=1"; done >"hosts$n.ompi"
    measure C "$n" hydra "$run" "^n" "$MPICH5/bin/mpiexec.hydra" -launcher ssh -f "hosts$n" -n "$n" -ppn 1 hostname
    measure C "$n" ompi "$run" "^n" mpirun --allow-run-as-root --hostfile "hosts$n.ompi" -np "$n" --map-by node hostname
    measure C "$n" gr-flat-kex "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --topology flat \
      --rsh "$DEFAULT_KEX" --pmi none --seq "$SSH_SEQ" --rem "$SSH_REM" -- hostname
    measure C "$n" gr-flat "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --topology flat \
      --pmi none --seq "$SSH_SEQ" --rem "$SSH_REM" -- hostname
    measure C "$n" gr-greedy "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" \
      --pmi none --seq "$SSH_SEQ" --rem "$SSH_REM" -- hostname
    measure C "$n" gr-greedy-pmi "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" \
      --seq "$SSH_SEQ" --rem "$SSH_REM" -- hostname
    measure C "$n" gr-greedy-rsh "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" \
      --rsh rsh --pmi none --seq "$RSH_SEQ" --rem "$RSH_REM" -- hostname
  done
done

# --- Part D: what --batch costs, `hostname`, the largest size ------------------------------------
if [[ " $PARTS " == *" D "* ]]; then
  n=$MAXN
  for i in $(seq "$n"); do echo "n$i"; done >"hosts$n"
  for run in $(seq "$RUNS"); do
    measure D "$n" hydra "$run" "^n" "$MPICH5/bin/mpiexec.hydra" -launcher ssh -f "hosts$n" -n "$n" -ppn 1 hostname
    measure D "$n" gr-flat-kex-b8 "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --topology flat \
      --rsh "$DEFAULT_KEX" --pmi none -- hostname
    measure D "$n" gr-flat-kex-b64 "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --topology flat \
      --rsh "$DEFAULT_KEX" --pmi none --batch 64 -- hostname
    measure D "$n" gr-flat-b64 "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --topology flat \
      --pmi none --batch 64 -- hostname
    measure D "$n" gr-greedy "$run" "^n" "$BIN/greedyrun" -v --progress 0 --hostfile "hosts$n" --pmi none \
      --seq "$SSH_SEQ" --rem "$SSH_REM" -- hostname
  done
fi

# --- Part M: model validation, every topology × MSIZES × SHELLS, interleaved per run -----------
if [[ " $PARTS " == *" M "* ]]; then
  for run in $(seq "$RUNS"); do
    for n in $MSIZES; do
      for shell in $SHELLS; do
        if [[ $shell == rsh ]]; then
          sh=(--rsh rsh --seq "$RSH_SEQ" --rem "$RSH_REM")
        else
          sh=(--seq "$SSH_SEQ" --rem "$SSH_REM")
        fi
        for topo in flat binomial kary:4 kary:8 greedy; do
          measure M "$n" "$shell-$topo" "$run" "" \
            "$BIN/greedyrun" -v --progress 0 --hosts "n[1-$n]" "${sh[@]}" --pmi none --topology "$topo" -- true
        done
      done
    done
  done
fi

# --- summary -------------------------------------------------------------------------------------
python3 - "$CSV" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def med(xs): return statistics.median(xs) if xs else float("nan")
groups = {}
for r in rows:
    groups.setdefault((r["part"], int(r["hosts"]), r["config"]), []).append(r)
print("\n| part | hosts | config | wall ms median (min–max) | ok runs | CPU-s | launch ms | model ms | vs greedyrun |")
print("|---|---|---|---|---|---|---|---|---|")
for (part, n, cfg), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    walls = [int(r["wall_ms"]) for r in rs]
    ok = sum(1 for r in rs if r["rc"] == "0" and (part in ("B", "M") or int(r["ok"]) == n))
    cpu = med([float(r["cpu_s"]) for r in rs])
    launch = [int(r["launch_ms"]) for r in rs if r["launch_ms"]]
    model = [int(r["model_ms"]) for r in rs if r["model_ms"]]
    ref = groups.get((part, n, "rsh-greedy" if part == "B" else cfg.split("-")[0] + "-greedy" if part == "M" else "gr-greedy"))
    ratio = med(walls) / med([int(r["wall_ms"]) for r in ref]) if ref else float("nan")
    print(f"| {part} | {n} | {cfg} | {med(walls):.0f} ({min(walls)}–{max(walls)}) | {ok}/{len(rs)} | {cpu:.2f} | "
          f"{med(launch) if launch else '':} | {med(model) if model else ''} | {ratio:.2f}× |")
EOF
OUT=${BENCH_OUT:-$CARGO_TARGET_DIR/launcher-bench}
mkdir -p "$OUT"
cp "$W"/*.csv "$W"/*.err "$W"/cal-*.txt "$OUT"/
echo "bench: results in $OUT"
cd "$ROOT" # down deletes the scratch dir we are in
"$TC" down >/dev/null
trap - EXIT
