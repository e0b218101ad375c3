# Sourced by the Slurm tests that take `--release R` (mpi.sh, charm.sh, topology.sh,
# topology-bench.sh, mpi-bench.sh, packaging/deb.sh). release_select R sets RELEASE=R and RELEASE_ROOT to that
# release's Debian root (slurm-conf/release-root builds it on first use), or to nothing when R
# is the machine's own Slurm. Needs $ROOT.
release_select() {
  RELEASE=$1 RELEASE_ROOT=""
  [[ $RELEASE =~ ^(22\.05|24\.11|26\.05)$ ]] || {
    echo "${0##*/}: --release $RELEASE: expected 22.05, 24.11 or 26.05" >&2
    exit 2
  }
  local v
  v=$(/usr/sbin/slurmd -V 2>/dev/null || true)
  v=${v##* }
  [[ $RELEASE == "${v%.*}" ]] || RELEASE_ROOT=$("$ROOT/slurm-conf/release-root" "$RELEASE") ||
    { echo "${0##*/}: no Debian root for Slurm $RELEASE" >&2; exit 1; }
}

# Builds topology_greedy.so (and greedy-tree, which predicts its splits) against $RELEASE; sets
# TOPOLOGY_SO to the plugin's path. Needs $ROOT, $CARGO_TARGET_DIR and a fail function.
build_topology_plugin() {
  (eval "$("$ROOT/slurm-conf/release-root" --build-env "$RELEASE")" &&
    CARGO_TARGET_DIR=$CARGO_TARGET_DIR/slurm-$RELEASE cargo build -q --release --locked -p greedy-slurm-topology) ||
    fail "building topology_greedy.so for Slurm $RELEASE"
  cargo build -q --locked -p greedy-tree || fail "cargo build greedy-tree"
  TOPOLOGY_SO=$CARGO_TARGET_DIR/slurm-$RELEASE/release/libtopology_greedy.so
}
