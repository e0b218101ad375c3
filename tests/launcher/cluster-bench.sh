# Sourced by the benchmarks that take the emulated cluster (tests/launcher/session-bench.sh,
# tasks-cluster-bench.sh): needs ROOT and a fail function; builds greedyrun and the delayer
# (release), sets TC, BIN (the release directory) and GREEDY_NETDELAY, and brings in
# cluster_up and wait_sshd (tests/cluster/claim.sh).
TC="$ROOT/slurm-conf/testcluster"
export GREEDY_TC_QUIET=1
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build -q --release --locked -p greedy-launcher -p greedy-netdelay || fail "building greedyrun"
BIN=$CARGO_TARGET_DIR/release
export GREEDY_NETDELAY=${GREEDY_NETDELAY:-$BIN/greedy-netdelay}
# shellcheck source=../cluster/claim.sh
. "$ROOT/tests/cluster/claim.sh"
