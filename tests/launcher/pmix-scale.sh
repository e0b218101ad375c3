#!/usr/bin/env bash
# A PMIx job on N hosts (default 600) through greedyrun (issue 19), every agent on this machine
# at a loopback address of its own (127.1.x.y; a fake remote shell ignores the host name and
# starts the agent here): N PMIx servers, N × P ranks of tests/mpi/pmix_maps, a libpmix client
# that checks the node and process maps (PMIx_Resolve_nodes/_peers against PMIX_LOCAL_SIZE),
# fences with data and reads the key of the rank farthest from it. Passes when every rank
# reports once and greedyrun exits 0, and leaves no process behind.
#
# With --release R: greedyrun and greedyd built against release R's libpmix and run inside its
# Debian root (slurm-conf/release-chroot). PMIx 7 (26.05) compresses maps of a few hundred
# hosts into binary blobs, which greedy registers as PMIX_REGEX.
#
# All agents share this machine's cores: the figures printed are the CPU's, not the tree's.
# usage: tests/launcher/pmix-scale.sh [--hosts N] [--ppn P] [--release R]   (needs root for R)
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
hosts=600 ppn=1 release=""
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --ppn) ppn=$2; shift 2 ;;
    --release) release=$2; shift 2 ;;
    *) echo "usage: $0 [--hosts N] [--ppn P] [--release R]" >&2; exit 2 ;;
  esac
done
((hosts >= 1 && hosts <= 50000)) || fail "--hosts $hosts: 1..50000"
. "$ROOT/tests/launcher/loopback.sh"
. "$ROOT/tests/mpi/pmix_maps.sh"
RELEASE_ROOT=""
[[ -z $release ]] || release_select "$release"
cd "$ROOT"
if [[ -n $RELEASE_ROOT ]]; then
  build --slurm "$RELEASE" --release -p greedy-launcher
  in_root() { "$ROOT/slurm-conf/release-chroot" "$RELEASE_ROOT" "$ROOT" "$CARGO_TARGET_DIR" -- "$@"; }
else
  build --release -p greedy-launcher
  in_root() { "$@"; }
fi

# /var/tmp: a release root sees it at the same path.
work=$(mktemp -d /var/tmp/greedy-pmix-scale.XXXXXX)
trap 'rm -rf "$work"' EXIT
# libpmix.so.2 keeps its ABI across 4.2, 5.0 and 7.0: built once, it runs on each release's.
# shellcheck disable=SC2046 # pkg-config's words are separate flags
gcc -O1 -o "$work/pmix_maps" tests/mpi/pmix_maps.c $(pkg-config --cflags --libs pmix) ||
  fail "building pmix_maps"
loopback_rsh "$work"
list=$(loopback_hosts "$hosts")
size=$((hosts * ppn))

t0=${EPOCHREALTIME/./}
rc=0
in_root timeout 600 "$BIN/greedyrun" --rsh "$work/localsh" --progress 0 -H "$list" --ppn "$ppn" \
  -n "$size" --map-by node "$work/pmix_maps" "$hosts" >"$work/out" 2>"$work/err" || rc=$?
t1=${EPOCHREALTIME/./}
((rc == 0)) || fail "greedyrun exited $rc: $(grep -v '^maps ' "$work/out" "$work/err" | head -5)"
bad=$(pmix_maps_verdict "$work/out" "$size" "$hosts")
[[ -z $bad ]] || fail "$bad"
sleep 0.5
left=$(pgrep -f "$work/" || true)
[[ -z $left ]] || fail "left behind: $(echo "$left" | head -3 | xargs ps -o pid=,args= -p)"
echo "pmix-scale: PASS: $hosts hosts x $ppn ranks${RELEASE_ROOT:+ (the libpmix of Slurm $RELEASE)} in $(((t1 - t0) / 1000)) ms"
