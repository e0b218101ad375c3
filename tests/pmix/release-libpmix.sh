#!/usr/bin/env bash
# greedy-sys's PMIx server test (sys/tests/pmix_server.rs: init, maps, registration,
# setup_fork, finalize) against the libpmix of Slurm release R's Debian root, which greedy's
# plugin and greedyd use there: PMIx 5.0 (24.11) and 7.0 (26.05), where 4.2 is the machine's.
# PMIx 7 compresses node and process maps of a few hundred hosts into binary blobs, which the
# test registers and reads back. The test is built against the root's headers and library
# (slurm-conf/release-root --build-env) and runs inside the root (slurm-conf/release-chroot).
#
# usage: tests/pmix/release-libpmix.sh --release R   (R: 22.05, 24.11 or 26.05; needs root)
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
[[ ${1:-} == --release && -n ${2:-} ]] || { echo "usage: $0 --release R" >&2; exit 2; }
release_select "$2"
cd "$ROOT"
if [[ -z $RELEASE_ROOT ]]; then
  cargo test -q --locked -p greedy-sys --features pmix --test pmix_server -- --nocapture ||
    fail "pmix_server on the machine's libpmix"
  exit 0
fi
# `cargo test --no-run` names the test binary on stderr: "Executable tests/pmix_server.rs (PATH)".
built=$( (eval "$(slurm-conf/release-root --build-env "$RELEASE")" &&
  CARGO_TARGET_DIR=$CARGO_TARGET_DIR/slurm-$RELEASE cargo test --locked -p greedy-sys \
    --features pmix --test pmix_server --no-run) 2>&1) || fail "building the test for Slurm $RELEASE: $built"
bin=$(sed -n 's/.*Executable tests\/pmix_server.rs (\(.*\))$/\1/p' <<<"$built")
[[ -x $bin ]] || fail "no test binary in: $built"
[[ $bin == /* ]] || bin=$ROOT/$bin
"$ROOT/slurm-conf/release-chroot" "$RELEASE_ROOT" "$ROOT" "$CARGO_TARGET_DIR" -- "$bin" --nocapture ||
  fail "pmix_server on Slurm $RELEASE's libpmix"
echo "release-libpmix: PASS (Slurm $RELEASE's libpmix)"
