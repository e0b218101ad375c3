#!/usr/bin/env bash
# tests/packaging/deb.sh [--release R]: greedy installed the way a site installs it, as Debian
# packages, on the machine's Slurm or (--release 24.11|26.05) on a cluster of that release, whose
# hosts all run from its Debian root (testcluster up --release): there the packages are built
# with build-debs --release R and installed into that root; `greedyrun`, the man pages and the
# `release` case are checked on the machine's release only.
#
#   build     packaging/build-debs builds greedy-slurm and greedy-tools
#   refuse    a greedy-slurm built for another slurmd version: `dpkg -i` refuses it, naming
#             both versions, and leaves nothing installed
#   install   on a 4-host emulated Slurm cluster with no greedy plugin of its own, `dpkg -i`
#             both, `scontrol reconfigure`: srun --mpi=list shows greedy, one Open MPI and one
#             MPICH job run under srun --mpi=greedy, greedyrun starts a job over ssh, and
#             `man greedyrun` / `man mpi_greedy` / `man greedy` render from the installed files
#   remove    dpkg -r, then --purge: every file gone; after a reconfigure srun --mpi=list no
#             longer shows greedy and srun --mpi=pmix still runs an Open MPI job
#   release   the packaged mpi_greedy.so with its plugin_version patched to 23.02.7, in the
#             cluster's PluginDir: srun --mpi=list, srun --mpi=greedy and slurmd each log a line
#             naming both releases, srun fails without a signal, every slurmd keeps running and
#             the next --mpi=pmix job runs
#
# The packages are removed and the cluster taken down on every exit (trap): the machine is left
# as found. The emulated hosts share this machine's root filesystem, so the plugins installed in
# Debian's PluginDir are the ones their slurmd load.
# Env: CARGO_TARGET_DIR (default <repo>/target), GREEDY_MPICH5 (default /var/tmp/greedy-mpich5).
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=4
FAKE_RELEASE=0x170207 # 23.02.7: a release this machine's Slurm is not
RELEASE="" RELEASE_ROOT=""
[[ ${1:-} != --release ]] || release_select "${2:-}"
TAG=deb${RELEASE:+ $RELEASE}

# system CMD...: runs CMD on the system the packages go to: this machine, or the release root
# (seeing the repo and the target dir). FS is that system's / as seen from here.
system() {
  if [[ -n $RELEASE_ROOT ]]; then
    "$ROOT/slurm-conf/release-chroot" "$RELEASE_ROOT" "$ROOT" "$CARGO_TARGET_DIR" -- "$@"
  else
    "$@"
  fi
}
FS=$RELEASE_ROOT
need_root
need_shared_target
# build-debs builds against the installed Slurm (testcluster would install it only at `up`).
if [[ -z $RELEASE_ROOT ]] && ! dpkg-query -W -f='${db:Status-Abbrev}' slurmd 2>/dev/null | grep -q '^ii'; then
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends slurmd slurmctld slurm-client munge >/dev/null || fail "installing Slurm"
fi
PLUGINDIR=$(system dpkg -L slurm-wlm-basic-plugins | grep '/mpi_pmi2.so$')
PLUGINDIR=$(dirname "${PLUGINDIR%%$'\n'*}")
# A release root is ours (a run killed mid-way may have left the packages there); the machine's
# greedy is not ours to touch: one someone installed by hand.
if [[ -n $RELEASE_ROOT ]]; then
  system dpkg --purge greedy-slurm greedy-tools >/dev/null 2>&1 || true
fi
for p in greedy-slurm greedy-tools; do
  ! system dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^[a-z]i' ||
    fail "$p is already installed on this machine; remove it first"
done
[[ ! -e $FS$PLUGINDIR/mpi_greedy.so && ! -e $FS/usr/bin/greedyrun ]] ||
  fail "a greedy plugin or greedyrun is already installed by hand ($FS$PLUGINDIR, $FS/usr/bin)"

WORK=$(mktemp -d /var/tmp/greedy-deb-test.XXXXXX)
INSTALLED=0 # we ran dpkg -i: purge on exit
OURS=0      # the cluster is ours: take it down on exit
cleanup() {
  if ((INSTALLED)); then
    system dpkg --purge greedy-slurm greedy-tools >/dev/null 2>&1 || true
  fi
  if ((OURS)); then
    "$TC" down >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- build ------------------------------------------------------------------------------------
t0=$SECONDS
mapfile -t DEBS < <("$ROOT/packaging/build-debs" ${RELEASE:+--release "$RELEASE"})
((${#DEBS[@]} == 2)) || fail "build-debs made ${#DEBS[@]} packages: ${DEBS[*]}"
SLURM_DEB=$(system dpkg-query -W -f='${Version}' slurmd)
[[ ${DEBS[0]} == *"+slurm${SLURM_DEB%%-*}_"* ]] || fail "greedy-slurm is not named for Slurm ${SLURM_DEB%%-*}: ${DEBS[0]}"

DEPENDS=$(dpkg-deb -f "${DEBS[0]}" Depends)
[[ $DEPENDS == *"slurmd (= $SLURM_DEB)"* ]] || fail "greedy-slurm Depends lacks slurmd (= $SLURM_DEB): $DEPENDS"
pass "packaging/build-debs: $(basename -a "${DEBS[@]}" | tr '\n' ' ')in $((SECONDS - t0)) s; Depends: $DEPENDS"

# --- refuse: built for another slurmd ---------------------------------------------------------
"$ROOT/packaging/build-debs" ${RELEASE:+--release "$RELEASE"} --out "$WORK/other" --slurm-deb-version 22.05.7-1 >/dev/null
INSTALLED=1
set +e
OUT=$(system dpkg -i "$WORK"/other/greedy-slurm_*.deb 2>&1)
RC=$?
set -e
((RC != 0)) || fail "dpkg -i of a package for slurmd 22.05.7-1 succeeded"
[[ $OUT == *"built for Slurm 22.05.7-1, but slurmd $SLURM_DEB is installed"* ]] ||
  fail "dpkg -i refused, but not naming both versions: $OUT"
st=$(system dpkg-query -W -f='${db:Status-Abbrev}' greedy-slurm 2>/dev/null || true)
[[ $st != ?i* && ! -e $FS$PLUGINDIR/mpi_greedy.so ]] ||
  fail "the refused package left state '$st' or files behind"
system dpkg --purge greedy-slurm >/dev/null 2>&1 || true
INSTALLED=0
pass "dpkg -i of greedy-slurm built for slurmd 22.05.7-1 refused: $(grep -m1 'built for' <<<"$OUT")"

# --- MPI test programs (tests/slurm/mpi.sh's: $WIREUP for MPICH, $OMPI for Open MPI) ----------
. "$ROOT/tests/slurm/mpi-build.sh"

# --- cluster: no greedy plugin of its own; an extra, empty PluginDir for the release phase -----
FAKEDIR=$WORK/plugins
mkdir -p "$FAKEDIR"
cluster_up --nodes "$NODES" --slurm --plugindir "$FAKEDIR" ${RELEASE:+--release "$RELEASE"}
OURS=1
trap cleanup EXIT # cluster_up's trap only takes the cluster down; ours also removes the packages
eval "$("$TC" env)"
SLOG=$(dirname "$SLURM_CONF")/../log
cd "$GREEDY_TC_SCRATCH"

# run NAME TIMEOUT SRUN-ARGS...: sets RC, OUT (stdout), ERR (stderr)
run() {
  local name=$1 limit=$2
  shift 2
  set +e
  timeout -k 5 "$limit" srun "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null
  RC=$?
  set -e
  OUT=$(cat "$WORK/$name.out")
  ERR=$(cat "$WORK/$name.err")
}
# reconfigure yes|no: slurmd unloads and reloads every MPI plugin (mpi_g_daemon_reconfig,
# slurmd.c:1238 and slurm_mpi.c:578@slurm-22-05-8-1), asynchronously: wait until every slurmd
# has (yes) or has not (no) $PLUGINDIR/mpi_greedy.so mapped, and every node is idle.
reconfigure() {
  local pid n
  scontrol reconfigure || fail "scontrol reconfigure"
  for _ in $(seq 100); do
    n=0
    for pid in $(pgrep -x slurmd); do
      grep -q " $FS$PLUGINDIR/mpi_greedy.so$" "/proc/$pid/maps" 2>/dev/null && n=$((n + 1))
    done
    if [[ ($1 == yes && $n == "$NODES") || ($1 == no && $n == 0) ]] &&
      [[ $(sinfo -h -o '%T' | sort -u) == idle ]]; then
      return 0
    fi
    sleep 0.2
  done
  fail "after scontrol reconfigure, $n slurmd have mpi_greedy.so loaded (wanted: $1); $(sinfo -h -o '%T %N')"
}
slurmds_alive() {
  local n
  n=$(pgrep -xc slurmd || true)
  ((n == NODES)) || fail "$1: $n slurmd running, expected $NODES"
}

# --- install ----------------------------------------------------------------------------------
INSTALLED=1
system dpkg -i "${DEBS[@]}" >"$WORK/install.log" 2>&1 || fail "dpkg -i: $(cat "$WORK/install.log")"
files=("$PLUGINDIR/mpi_greedy.so" /usr/bin/greedyrun /usr/bin/greedyd /usr/bin/greedy-guard /usr/bin/greedy-tree
  /usr/share/bash-completion/completions/greedyrun /usr/share/zsh/vendor-completions/_greedy-tree
  /usr/share/fish/vendor_completions.d/greedyd.fish /usr/bin/greedy-stack /usr/include/greedy/libi.h
  "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/libgreedy.so.0")
# No route plugins from 23.11 (topology/greedy instead); the release roots keep no
# /usr/share/doc (release-root).
if [[ -n $RELEASE_ROOT ]]; then
  files+=("$PLUGINDIR/topology_greedy.so")
else
  files+=("$PLUGINDIR/route_greedy.so" /usr/bin/greedy-route
    /usr/share/doc/greedy-slurm/examples/mpi_greedy.slurm.conf)
fi
for f in "${files[@]}"; do
  [[ -f $FS$f ]] || fail "dpkg -i installed no $f"
done
[[ -z $RELEASE_ROOT || ! ( -e $FS$PLUGINDIR/route_greedy.so || -e $FS/usr/bin/greedy-route ) ]] ||
  fail "route/greedy packaged for Slurm $RELEASE"
system greedyrun --version >/dev/null || fail "the packaged greedyrun does not run"

LIST=$(srun --mpi=list 2>&1)
grep -qw greedy <<<"$LIST" || fail "srun --mpi=list does not show greedy after dpkg -i: $LIST"
reconfigure yes
pass "dpkg -i greedy-slurm greedy-tools; srun --mpi=list shows greedy; scontrol reconfigure"

PPN=(-N"$NODES" -n$((2 * NODES)) --ntasks-per-node=2)
for mpi in ompi mpich; do
  prog=$WIREUP
  [[ $mpi == ompi ]] && prog=$OMPI
  run "greedy-$mpi" 90 "${PPN[@]}" --mpi=greedy env EXPECT_SIZE=$((2 * NODES)) "$prog"
  ((RC == 0)) || fail "$mpi under the installed plugin: srun exited $RC: $ERR $OUT"
  [[ $(grep -c " of $((2 * NODES)): ok" <<<"$OUT") == $((2 * NODES)) ]] ||
    fail "$mpi: expected $((2 * NODES)) ok lines: $OUT $ERR"
  pass "$mpi: srun ${PPN[*]} --mpi=greedy with the packaged plugin: $((2 * NODES))/$((2 * NODES)) ranks ok"
done

if [[ -z $RELEASE_ROOT ]]; then # the hosts' sshd runs the machine's /usr/bin, not the root's
OUT=$(timeout 60 greedyrun -n "$NODES" --hosts "n[1-$NODES]" --pmi none hostname 2>&1) ||
  fail "packaged greedyrun: $OUT"
[[ $(sort <<<"$OUT" | tr '\n' ' ') == "$(seq -f 'n%g' 1 "$NODES" | tr '\n' ' ')" ]] ||
  fail "packaged greedyrun printed: $OUT"
pass "packaged greedyrun (greedyd from /usr/bin on every host): $NODES hosts over ssh"

# A tool built against the installed libgreedy (pkg-config, the header, the soname), run.
read -ra LIBI <<<"$(pkg-config --cflags --libs greedy-libi)" || fail "pkg-config greedy-libi"
cc -Wall -Werror -o "$WORK/hostnames" /usr/share/doc/greedy-tools/examples/hostnames.c "${LIBI[@]}" ||
  fail "cc hostnames.c against the installed libgreedy"
OUT=$(timeout 60 "$WORK/hostnames" rsh ssh n1:1 n2:1 2>&1) || fail "the packaged libgreedy: $OUT"
[[ $(grep -c '^hello [01]/2 on n[12]$' <<<"$OUT") == 2 ]] || fail "hostnames printed: $OUT"
pass "a C tool built with pkg-config greedy-libi against the package gathered from 2 hosts"

# man finds the installed pages by name (MANPATH from /usr/bin); -P cat renders to stdout.
page() { MANWIDTH=100 man -P cat "$@" 2>"$WORK/man.err" || fail "man $*: $(cat "$WORK/man.err")"; }
GR=$(page greedyrun)
for w in --hostfile GREEDY_RSH GREEDY_RANK "EXIT STATUS" 124; do
  [[ $GR == *"$w"* ]] || fail "man greedyrun lacks $w"
done
MG=$(page mpi_greedy)
for w in GreedyProtocol GreedyFenceTimeout mpi.conf SLURM_GREEDY_PROTOCOL PMI_FD PMIX_RANK "EXIT STATUS"; do
  [[ $MG == *"$w"* ]] || fail "man mpi_greedy lacks $w"
done
G7=$(page 7 greedy)
[[ $G7 == *RouteSeq* && $G7 == *GREEDY_CONF* ]] || fail "man 7 greedy lacks the Route keys"
[[ $(page 8 greedyd) == *GREEDY_LOG* ]] || fail "man greedyd lacks GREEDY_LOG"
[[ $(page greedy-tree-plan) == *--topology* ]] || fail "man greedy-tree-plan lacks --topology"
pass "man greedyrun, mpi_greedy, 7 greedy, greedyd, greedy-tree-plan render from the installed files"
fi

# --- remove -----------------------------------------------------------------------------------
system dpkg -r greedy-slurm greedy-tools >"$WORK/remove.log" 2>&1 || fail "dpkg -r: $(cat "$WORK/remove.log")"
system dpkg --purge greedy-slurm greedy-tools >>"$WORK/remove.log" 2>&1 || fail "dpkg --purge: $(cat "$WORK/remove.log")"
INSTALLED=0
for f in "$PLUGINDIR/mpi_greedy.so" "$PLUGINDIR/route_greedy.so" "$PLUGINDIR/topology_greedy.so" \
  /usr/bin/greedyrun /usr/share/man/man8/mpi_greedy.8.gz /usr/share/doc/greedy-slurm; do
  [[ ! -e $FS$f ]] || fail "$f left after dpkg --purge"
done
reconfigure no
LIST=$(srun --mpi=list 2>&1)
! grep -qw greedy <<<"$LIST" || fail "srun --mpi=list still shows greedy after removal: $LIST"
# Slurm's own plugin still runs jobs: pmix with Open MPI, or pmi2 with MPICH where Debian
# builds Slurm without PMIx (26.05).
own=pmix prog=$OMPI
grep -qw pmix <<<"$LIST" || own=pmi2 prog=$WIREUP
run own-after 90 -N2 -n4 --mpi=$own env EXPECT_SIZE=4 "$prog"
((RC == 0)) && [[ $(grep -c " of 4: ok" <<<"$OUT") == 4 ]] ||
  fail "srun --mpi=$own after removal: exit $RC: $ERR $OUT"
slurmds_alive remove
pass "dpkg -r and --purge leave no file; Slurm runs an MPI job with --mpi=$own"
if [[ -n $RELEASE_ROOT ]]; then
  echo "$TAG: all passed (the release case runs on the machine's release only)"
  exit 0
fi

# --- release: a plugin built for another Slurm --------------------------------------------------
# set_plugin_version SO HEX: writes HEX over the plugin_version symbol's 4 bytes (little endian).
set_plugin_version() {
  local so=$1 v=$2 value ndx addr off at
  read -r value ndx < <(readelf --dyn-syms -W "$so" | awk '$8 == "plugin_version" { print $2, $7 }')
  [[ -n ${value:-} ]] || fail "no plugin_version symbol in $so"
  read -r addr off < <(readelf -S -W "$so" | sed 's/\[ */[/' | awk -v n="[$ndx]" '$1 == n { print $4, $5 }')
  at=$((0x$value - 0x$addr + 0x$off))
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $(((v >> 8) & 255)) $(((v >> 16) & 255)) $(((v >> 24) & 255)))" |
    dd of="$so" bs=1 seek="$at" conv=notrunc status=none
  [[ $(od -An -tx4 -j "$at" -N4 "$so" | tr -d ' ') == $(printf '%08x' "$v") ]] ||
    fail "patching plugin_version in $so"
}
dpkg-deb -x "${DEBS[0]}" "$WORK/pkg"
cp "$WORK/pkg$PLUGINDIR/mpi_greedy.so" "$FAKEDIR/mpi_greedy.so"
set_plugin_version "$FAKEDIR/mpi_greedy.so" "$FAKE_RELEASE"
BOTH="built for Slurm 23.02.7 but this is Slurm 22.05.8"
LIST=$(srun --mpi=list 2>&1)
[[ $LIST == *"$BOTH"* ]] || fail "srun --mpi=list with a 23.02.7 plugin does not name both releases: $LIST"
! grep -qw '^srun: greedy' <<<"$LIST" || fail "srun --mpi=list lists the 23.02.7 plugin: $LIST"
run release 60 -N2 -n2 --mpi=greedy true
((RC != 0 && RC < 128)) || fail "srun --mpi=greedy with a 23.02.7 plugin: exit $RC (expected a refusal, no signal): $ERR"
[[ $ERR == *"$BOTH"* ]] || fail "srun --mpi=greedy with a 23.02.7 plugin does not name both releases: $ERR"
REFUSED_RC=$RC
reconfigure no
# slurmd peeks at every mpi_*.so when it reloads them; wait for its two lines.
for _ in $(seq 100); do
  grep -q "mpi/greedy: this plugin was $BOTH" "$SLOG"/slurmd-n1.log && break
  sleep 0.2
done
grep -q "Incompatible Slurm plugin $FAKEDIR/mpi_greedy.so version (23.02.7)" "$SLOG"/slurmd-n1.log ||
  fail "slurmd did not log Slurm's own refusal"
grep -q "mpi/greedy: this plugin was $BOTH" "$SLOG"/slurmd-n1.log || fail "slurmd did not log both releases"
slurmds_alive release
run pmix-release 90 -N2 -n4 --mpi=pmix env EXPECT_SIZE=4 "$OMPI"
((RC == 0)) || fail "srun --mpi=pmix beside the 23.02.7 plugin: exit $RC: $ERR"
pass "mpi_greedy.so patched to 23.02.7: srun --mpi=list, srun (refused, exit $REFUSED_RC) and slurmd log '$BOTH'; slurmd keeps running, --mpi=pmix runs"
echo "$TAG:   srun:   $(grep -m1 "$BOTH" "$WORK/release.err")"
echo "$TAG:   slurmd: $(grep -m1 'Incompatible Slurm plugin' "$SLOG"/slurmd-n1.log | cut -c1-160)"
echo "$TAG:   slurmd: $(grep -m1 "$BOTH" "$SLOG"/slurmd-n1.log | cut -c1-160)"
echo "$TAG: all passed"
