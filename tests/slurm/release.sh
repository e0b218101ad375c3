# Sourced by the Slurm tests that take `--release R` (mpi.sh, charm.sh, topology.sh,
# mpi-bench.sh, packaging/deb.sh). release_select R sets RELEASE=R and RELEASE_ROOT to that
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
