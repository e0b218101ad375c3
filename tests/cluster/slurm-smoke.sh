#!/usr/bin/env bash
# Smoke test of the emulated cluster's Slurm part (slurm-conf/testcluster up --slurm): 4 hosts,
# srun -N4 hostname, an Open MPI hello over srun --mpi=pmix on 4 nodes, an extra PluginDir,
# and a down that leaves no Slurm daemon or namespace. Needs root; about 20 s (plus the first
# package install). Exits non-zero naming the first failed check.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
need_root
cluster_wait
# Open MPI is needed only by this test (the cluster script installs Slurm and munge itself).
if ! command -v mpicc.openmpi >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null ||
    fail "installing openmpi-bin libopenmpi-dev"
fi

plugins=$(mktemp -d /var/tmp/slurm-smoke-plugins.XXXXXX)
trap '"$TC" down >/dev/null 2>&1 || true; rm -rf "$plugins"' EXIT

"$TC" up --nodes 4 --slurm --plugindir "$plugins" || fail "up --nodes 4 --slurm"
eval "$("$TC" env)"
[[ -n ${SLURM_CONF:-} ]] || fail "'testcluster env' exported no SLURM_CONF"
pass "up with Slurm"

[[ $(scontrol show config | awk '/^PluginDir/ {print $3}') == *":$plugins" ]] ||
  fail "PluginDir does not end with the extra dir: $(scontrol show config | grep PluginDir)"
[[ $(scontrol show config | awk '/^MpiDefault/ {print $3}') == none ]] || fail "MpiDefault is not none"
pass "PluginDir has the extra dir; MpiDefault=none"

got=$(timeout 60 srun -N4 hostname | sort | tr '\n' ' ') || fail "srun -N4 hostname"
[[ $got == "n1 n2 n3 n4 " ]] || fail "srun -N4 hostname printed '$got'"
pass "srun -N4 hostname"

# The binary must be on a filesystem every host sees (/tmp is private per host).
cd "$GREEDY_TC_SCRATCH"
cat >hello.c <<'C'
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size; char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    long v = rank + 1, sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d/%d on %s allreduce=%ld\n", rank, size, host, sum);
    MPI_Finalize();
    return sum == (long)size * (size + 1) / 2 ? 0 : 1;
}
C
mpicc.openmpi -O2 -o hello_ompi hello.c || fail "mpicc.openmpi hello.c"
out=$(timeout 60 srun -N4 -n4 --mpi=pmix ./hello_ompi 2>&1) || fail "srun --mpi=pmix hello: $out"
# Every rank must see 4 ranks: a singleton start (wrong PMI) would print 'rank 0/1' four times.
for r in 0 1 2 3; do
  [[ $out == *"rank $r/4 on n$((r + 1)) allreduce=10"* ]] || fail "rank $r missing or wrong: $out"
done
pass "Open MPI hello, srun -N4 -n4 --mpi=pmix"
cd /

"$TC" down || fail "down"
left=$(ip netns list | grep -E '^gtc-' || true)
[[ -z $left ]] || fail "namespaces left: $left"
# One pgrep per name: pgrep refuses -x patterns longer than 15 characters.
for p in $(for n in slurmctld slurmd slurmstepd munged; do pgrep -x "$n"; done || true); do
  st=$(cat "/proc/$p/stat" 2>/dev/null) || continue
  st=${st#*) }
  [[ ${st:0:1} == Z ]] && continue
  if [[ $({ tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null) == *greedy-testcluster* ]]; then
    fail "$(cat "/proc/$p/comm") $p still running"
  fi
done
pass "down left no Slurm daemon or namespace"
echo "slurm-smoke: all checks passed"
