#!/usr/bin/env bash
# What a job costs each host's launcher daemon, in CPU: greedyd against Hydra's
# hydra_pmi_proxy and Open MPI's prted, side by side in one sitting (the regression guard of lean nodes; run by hand
# before a release, not in CI). H loopback pseudo-hosts on this machine (the fake remote shell of
# tests/launcher/loopback.sh, no network delay, no ssh), one rank per host, J jobs per
# configuration, the configurations alternating job by job:
#   greedy      greedyrun, every wire-up family served (the default)
#   greedy-pmi  greedyrun --pmi pmi1 (PMI-1 alone, what Hydra serves)
#   greedy-none greedyrun --pmi none
#   greedy-pmix greedyrun --pmi pmix (PMIx alone, what prted serves)
#   hydra       PyPI MPICH 5.0.2's mpiexec.hydra -launcher rsh through the same fake shell
#   prte        PyPI Open MPI 5.0.11's prterun (PRRTE 3, its own tree spawn of prted) through
#               the same fake shell
#   greedy-old, greedy-old-pmi, greedy-old-none
#               with --old DIR: DIR/greedyrun (and the greedyd beside it) in each greedy
#               configuration chosen, to compare two builds in one sitting
# The fake remote shell puts each host's daemon into a cpuacct cgroup of its configuration
# before it execs it, so the cgroup holds exactly the daemons and what they start but the
# ranks (greedyd's guard, the remote shells greedyd starts for its tree children); each rank
# moves itself into a cgroup of the configuration's ranks before it execs the program (a
# one-line sh wrapper, the same everywhere); the front end (greedyrun, mpiexec, and the remote
# shells mpiexec starts until each moves) is in a cgroup of its own. Prints per configuration
# the daemons', the ranks' and the whole job's CPU ms per host per job (cgroup usage over hosts
# and jobs) with their ratios to the reference's (Hydra's; prted's for an Open MPI program), the
# front end's, and the median wall per job.
# usage: tests/launcher/node-cpu.sh [--hosts H] [--jobs J] [--program "ARGV"|mpich-hello|ompi-hello] [--old DIR] [CONFIG...]
#   (default 128 hosts, 5 jobs, /bin/true, every configuration; mpich-hello: tests/mpi/wireup.c
#   built with PyPI's MPICH 5, PMI-1 under both launchers; ompi-hello: the same built with
#   PyPI's Open MPI 5, PMIx under greedyrun and prterun, its default configurations greedy,
#   greedy-pmix and prte)
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
TAG=node-cpu
hosts=128 jobs=5 program=/bin/true old=""
configs=()
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --program) program=$2; shift 2 ;;
    --old) old=$2; shift 2 ;;
    greedy | greedy-pmi | greedy-none | greedy-pmix | hydra | prte) configs+=("$1"); shift ;;
    *) echo "usage: $0 [--hosts H] [--jobs J] [--program ARGV|mpich-hello|ompi-hello] [--old DIR] [greedy|greedy-pmi|greedy-none|greedy-pmix|hydra|prte]..." >&2; exit 2 ;;
  esac
done
ref=hydra label=Hydra
if [[ $program == ompi-hello ]]; then
  ref=prte label=prted
  ((${#configs[@]})) || configs=(greedy greedy-pmix prte)
fi
((${#configs[@]})) || configs=(greedy greedy-pmi greedy-none greedy-pmix hydra prte)
if [[ -n $old ]]; then
  [[ -x $old/greedyrun ]] || fail "--old $old: no greedyrun there"
  for c in "${configs[@]}"; do
    [[ $c == greedy* ]] && configs+=("${c/greedy/greedy-old}")
  done
fi
need_root
. "$ROOT/tests/mpi/clients.sh"
[[ " ${configs[*]} " != *" prte "* ]] || ompi5_venv
. "$ROOT/tests/launcher/loopback.sh"
loopback_bench node-cpu
if [[ $program == mpich-hello ]]; then
  # tests/mpi/wireup.c (MPI_Init, an allreduce, a barrier) built with PyPI's MPICH 5.
  "$MPICH5/bin/mpicc" -O1 -o "$work/wireup-mpich5" "$ROOT/tests/mpi/wireup.c" || fail "mpicc failed"
  program=$work/wireup-mpich5
elif [[ $program == ompi-hello ]]; then
  client_build ompi5 "$work"
  program=$work/wireup-ompi5
fi
# Open MPI's runtime and ranks on loopback, under every launcher alike.
ompi=(OPAL_PREFIX="$OMPI5" PRTE_PREFIX="$OMPI5" OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp
  OMPI_MCA_btl_tcp_if_include=lo)
read -ra argv <<<"$program"

CG=/sys/fs/cgroup/cpuacct/greedy-node-cpu.$$
[[ -d /sys/fs/cgroup/cpuacct ]] || fail "no cpuacct cgroup hierarchy at /sys/fs/cgroup/cpuacct"
cleanup_cgroups() {
  for d in "$CG"/*/; do [[ -d $d ]] && rmdir "$d" 2>/dev/null; done
  rmdir "$CG" 2>/dev/null || true
  loopback_cleanup
}
trap cleanup_cgroups EXIT
mkdir -p "$CG"
for c in "${configs[@]}"; do
  mkdir -p "$CG/$c" "$CG/$c-ranks" "$CG/$c-front"
  # The fake remote shell of configuration c: a host name of its own (a UTS namespace named
  # for the host: prted takes the node's name from it, and Open MPI's ranks under prteds that
  # share one name exchange wrong data), into its cgroup, then the daemon. prted comes as a
  # shell command line ("VAR=…;export VAR;…/prted …"), not an argv.
  exe='exec '
  [[ $c != prte ]] || exe=''
  cat >"$work/rsh-$c" <<EOF
#!/bin/sh
exec unshare --uts sh -c 'hostname "\$1"; echo \$\$ >$CG/$c/cgroup.procs; shift; exec sh -c "$exe\$*"' - "\$@"
EOF
  printf '#!/bin/sh\necho $$ >%s/cgroup.procs\nexec "$@"\n' "$CG/$c-ranks" >"$work/rank-$c"
  chmod +x "$work/rsh-$c" "$work/rank-$c"
done
hostlist=$(loopback_hosts "$hosts" 1)
tr , '\n' <<<"$hostlist" >"$work/hosts"
# prterun's hosts by name (the fake shell ignores it): named by their addresses, prterun
# hangs now and then from 12 hosts on.
for i in $(seq "$hosts"); do echo "h$i slots=1"; done >"$work/hosts.prte"

# run CONFIG: one job; its wall ms on stdout.
run() {
  local c=$1 t0 rc=0 greedyrun=$BIN
  local -a cmd
  [[ $c != greedy-old* ]] || greedyrun=$old/greedyrun
  case ${c/-old/} in
    greedy) cmd=("$greedyrun" --rsh "$work/rsh-$c" -H "$hostlist" --progress 0 -n "$hosts") ;;
    greedy-pmi) cmd=("$greedyrun" --rsh "$work/rsh-$c" -H "$hostlist" --progress 0 --pmi pmi1 -n "$hosts") ;;
    greedy-none) cmd=("$greedyrun" --rsh "$work/rsh-$c" -H "$hostlist" --progress 0 --pmi none -n "$hosts") ;;
    greedy-pmix) cmd=("$greedyrun" --rsh "$work/rsh-$c" -H "$hostlist" --progress 0 --pmi pmix -n "$hosts") ;;
    hydra) cmd=("$MPICH5/bin/mpiexec.hydra" -launcher rsh -launcher-exec "$work/rsh-$c"
      -f "$work/hosts" -n "$hosts" -ppn 1) ;;
    prte) cmd=("$OMPI5/bin/prterun" --allow-run-as-root --prtemca plm_ssh_agent "$work/rsh-$c"
      --hostfile "$work/hosts.prte" -n "$hosts" --map-by ppr:1:node) ;;
  esac
  t0=$(ms)
  # A job that hangs (prterun's, above 32 hosts here) fails the sitting after 120 s.
  timeout -k 5 120 env "${ompi[@]}" sh -c 'echo $$ >"$0"; exec "$@"' "$CG/$c-front/cgroup.procs" "${cmd[@]}" "$work/rank-$c" "${argv[@]}" \
    </dev/null >/dev/null 2>"$work/err" || rc=$?
  ((rc == 0)) || fail "$c: exit $rc: $(tail -3 "$work/err")"
  echo $(($(ms) - t0))
}

declare -A walls
for _ in $(seq "$jobs"); do
  for c in "${configs[@]}"; do
    walls[$c]+="$(run "$c") "
  done
done

echo "$hosts hosts, $jobs jobs each, one rank per host running ${argv[*]}:"
echo "| configuration | daemons: CPU ms per host per job | / $label's | ranks: per host | / $label's | front end: per host | whole job: per host | / $label's | median wall ms per job |"
echo "|---|---|---|---|---|---|---|---|---|"
per_host() { awk -v n=$((hosts * jobs)) '{printf "%.2f", $1 / 1e6 / n}' "$1/cpuacct.usage"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.2fx", a / b; else print "—" }'; }
sum() { awk -v a="$1" -v b="$2" -v c="$3" 'BEGIN {printf "%.2f", a + b + c}'; }
# figures CONFIG: its daemons', ranks', front end's and whole job's CPU per host
figures() {
  local d r f
  d=$(per_host "$CG/$1") r=$(per_host "$CG/$1-ranks") f=$(per_host "$CG/$1-front")
  echo "$d $r $f $(sum "$d" "$r" "$f")"
}
base=(— — — —)
[[ ! -d $CG/$ref ]] || read -ra base <<<"$(figures "$ref")"
for c in "${configs[@]}"; do
  read -r cpu ranks front all <<<"$(figures "$c")"
  wall=$(median <<<"${walls[$c]}")
  echo "| $c | $cpu | $(ratio "$cpu" "${base[0]}") | $ranks | $(ratio "$ranks" "${base[1]}") | $front | $all | $(ratio "$all" "${base[3]}") | $wall |"
done
