#!/usr/bin/env bash
# Benchmark for docs/benchmarks.md: srun --mpi=greedy vs --mpi=pmi2 with MPICH (PyPI mpich
# 5.0.2, PMI-1 client), vs --mpi=pmix with Open MPI (Debian 4.1, PMIx), and vs --mpi=none on
# /bin/true (MPI `true`: the plugin's overhead on a step that speaks no PMI; `true-pmi`,
# `true-pmix`, `true-charm`: the same with greedy serving that family alone,
# SLURM_GREEDY_PROTOCOL=FAMILY) on the emulated
# Slurm 22.05 cluster; with --release 24.11|26.05 on a cluster of that release, with its own
# MPICH and Open MPI (where the release has no mpi_pmix, as Debian's 26.05, that pair is skipped). For each (delay, nodes, MPI) it runs REPS steps of tests/slurm/init_time.c per
# plugin, alternating the plugins so that drift of the machine's load hits both alike, and
# measures from srun's start
#   init: until the last rank is past MPI_Init (ranks print CLOCK_REALTIME; one machine clock)
#   exit: until srun exits
# Each timed srun starts on an idle cluster. Prints one markdown row per (delay, nodes, MPI,
# metric): medians, min-max, and the ratio greedy/other.
#
# usage: tests/slurm/mpi-bench.sh [--reps R] [--delays "0 10"] [--nodes "8 16"] [--ppn P]
#                                  [--mpis "mpich ompi true true-pmi true-pmix true-charm"] [--mpi-conf FILE] [--csv FILE]
#                                  [--release R]
# --mpi-conf FILE: mpi.conf for the cluster (e.g. GreedyRem for a high-latency network).
# --csv FILE: also append every timed step to FILE
#   (delay_ms,nodes,ranks,mpi,plugin,rep,init_ms,exit_ms,ok; a header if FILE is new; greedy-bench reads it).
# Needs root; about 8 min with the defaults. Leaves nothing behind.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
reps=7 delays="0 10" nodes_list="8 16" ppn=2 mpis="mpich ompi" gconf=() csv=/dev/null
RELEASE="" RELEASE_ROOT=""
while (($#)); do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --delays) delays=$2; shift 2 ;;
    --nodes) nodes_list=$2; shift 2 ;;
    --ppn) ppn=$2; shift 2 ;;
    --mpis) mpis=$2; shift 2 ;;
    --mpi-conf) gconf=(--mpi-conf "$(realpath "$2")"); shift 2 ;;
    --csv) csv=$(realpath "$2"); shift 2 ;;
    --release) RELEASE=$2; shift 2 ;;
    *) echo "usage: $0 [--reps R] [--delays \"0 10\"] [--nodes \"8 16\"] [--ppn P]" >&2; exit 2 ;;
  esac
done
need_root
[[ $csv == /dev/null || -s $csv ]] || echo "delay_ms,nodes,ranks,mpi,plugin,rep,init_ms,exit_ms,ok" >"$csv"

[[ -z $RELEASE ]] || release_select "$RELEASE"
build --release -p greedy-netdelay
. "$ROOT/tests/slurm/mpi-build.sh"
build_mpi_prog "$ROOT/tests/slurm/init_time.c" init_time

# Each delay's cluster is claimed (tests/lib.sh), and wait_idle: every timed srun starts on an
# idle cluster (the previous step's nodes may still be completing: slurmd polls for the stepd's
# exit once a second, which is not this step's cost).
ours=0
trap 'cd "$ROOT"; ((ours)) && "$TC" down >/dev/null 2>&1; true' EXIT


# stats FILE: "median min max" of one number per line
stats() { sort -n "$1" | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.0f %.0f %.0f", m, v[1], v[NR] }'; }

echo "| delay | nodes x ranks | MPI | metric | greedy ms (median, min-max) | other ms (median, min-max) | greedy/other |"
echo "|---|---|---|---|---|---|---|"
maxn=0
for n in $nodes_list; do ((n > maxn)) && maxn=$n; done
for delay in $delays; do
  cluster_claim --nodes "$maxn" --delay "$delay" --slurm --plugindir "$PLUGDIR" "${gconf[@]}" \
    ${RELEASE:+--release "$RELEASE"}
  ours=1

  eval "$("$TC" env)"
  work=$GREEDY_TC_SCRATCH/mpi-bench
  mkdir -p "$work"
  cd "$work"
  for n in $nodes_list; do
    np=$((n * ppn))
    for mpi in $mpis; do
      case $mpi in
        mpich) PROG=$BINDIR/init_time other=pmi2 metrics="init exit" ;;
        ompi) PROG=$BINDIR/init_time-ompi other=pmix metrics="init exit" ;;
        true) PROG=/bin/true other=none metrics=exit ;;
        true-pmi | true-pmix | true-charm) PROG=/bin/true other=none metrics=exit ;;
        *) fail "--mpis: $mpi is not mpich, ompi, true or true-{pmi,pmix,charm}" ;;
      esac
      # true-FAMILY: greedy serving that family alone (true-pmi: what a step cost before every
      # family was served; with true-pmix and true-charm, what each family adds).
      proto=$([[ $mpi == true-* ]] && echo "${mpi#true-}" || echo auto)
      if [[ $other != none ]] && ! grep -qw "$other" <<<"$(srun --mpi=list 2>&1)"; then
        echo "| ${delay} ms | ${n} x ${np} | $mpi: greedy vs $other | (this Slurm has no mpi/$other) | | | |"
        continue
      fi
      for plugin in greedy $other; do : >"$work/$plugin.init"; : >"$work/$plugin.exit"; : >"$work/$plugin.failed"; done
      # One unmeasured step per plugin: the first step after up pays for page-cache misses.
      for plugin in greedy $other; do
        wait_idle
        SLURM_GREEDY_PROTOCOL=$proto timeout 60 srun -N"$n" -n"$np" --ntasks-per-node="$ppn" --mpi="$plugin" "$PROG" >/dev/null 2>&1 || true
      done
      for ((r = 0; r < reps; r++)); do
        for plugin in greedy $other; do
          wait_idle
          t0=$(ms)
          t0s=${EPOCHREALTIME}
          # A failed step is counted, not timed: Open MPI 4.1 at 32 ranks on 2 cores fails
          # now and then whatever the launcher (slurm-testcluster.md §7.4).
          if ! SLURM_GREEDY_PROTOCOL=$proto timeout 60 srun -N"$n" -n"$np" --ntasks-per-node="$ppn" --mpi="$plugin" "$PROG" >"$work/out" 2>"$work/err" ||
            [[ $mpi != true* && $(grep -c '^init ' "$work/out") != "$np" ]]; then
            echo "mpi-bench: $mpi $plugin -N$n rep $r failed: $(tail -2 "$work/err" | tr '\n' ' ')" >&2
            echo x >>"$work/$plugin.failed"
            echo "$delay,$n,$np,$mpi,$plugin,$r,,,0" >>"$csv"
            continue
          fi
          t1=$(ms)
          awk -v t0="$t0s" '$1 == "init" && $4 > m { m = $4 } END { printf "%.0f\n", m ? (m - t0) * 1000 : 0 }' "$work/out" >>"$work/$plugin.init"
          echo $((t1 - t0)) >>"$work/$plugin.exit"
          echo "$delay,$n,$np,$mpi,$plugin,$r,$(tail -1 "$work/$plugin.init"),$((t1 - t0)),1" >>"$csv"
        done
      done
      for metric in $metrics; do
        read -r gm gl gh <<<"$(stats "$work/greedy.$metric")"
        read -r pm pl ph <<<"$(stats "$work/$other.$metric")"
        ratio=$(awk -v a="$gm" -v b="$pm" 'BEGIN { printf "%.2f", a / b }')
        label=$([[ $metric == init ]] && echo "all ranks past MPI_Init" || echo "srun exit")
        gf=$(wc -l <"$work/greedy.failed") pf=$(wc -l <"$work/$other.failed")
        echo "| ${delay} ms | ${n} x ${np} | $mpi: greedy vs $other | $label | $gm ($gl-$gh)$( ((gf)) && echo ", $gf failed") | $pm ($pl-$ph)$( ((pf)) && echo ", $pf failed") | $ratio |"
      done
    done
  done
  cd "$ROOT"
  "$TC" down >/dev/null
  ours=0
done
