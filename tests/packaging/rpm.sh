#!/usr/bin/env bash
# tests/packaging/rpm.sh [--release R]: greedy's RPMs for RHEL-family sites (packaging/greedy.spec),
# built here with Debian's rpm tools against the machine's Slurm headers (libslurm-dev, 22.05)
# or (--release 24.11|26.05) a release root's, and checked without installing them: Debian
# cannot install an EL package, and there is no EL machine here.
#
#   build     packaging/build-rpm makes greedy-VERSION.tar.gz (source and vendored crates) and
#             runs rpmbuild -ta --nodeps on it: greedy-slurm, greedy-tools and the source RPM;
#             cargo ran offline from vendor/ (nothing downloaded)
#   rpmlint   on the spec, the source RPM and the four RPMs, with packaging/greedy.rpmlintrc:
#             no errors and no warnings
#   slurm     greedy-slurm's release names the Slurm version of slurm_version.h and it
#             Requires `slurm = VERSION`; rpm -qpl: mpi_greedy.so and route_greedy.so with
#             greedy-route (22.05) or topology_greedy.so and no route plugin (24.11, 26.05) in
#             /usr/lib64/slurm, greedy(7), mpi_greedy(8); every plugin's plugin_version is the
#             headers' SLURM_VERSION_NUMBER
#   tools     rpm -qpl: greedyrun, greedyd, greedy-tree, their man pages and completions; the
#             packaged greedyrun runs and its man page renders (machine's release only)
#   macros    slurm_plugin_dir moves the plugins (rpmspec, no build)
#
# Env: CARGO_TARGET_DIR (default <repo>/target): build-rpm's output goes to its rpm[-R]/ and
# the vendored build to rpm-build[-R]/, kept for the next run.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
RELEASE="" RELEASE_ROOT=""
[[ ${1:-} != --release ]] || release_select "${2:-}"
TAG=rpm${RELEASE:+ $RELEASE}
for t in rpmbuild rpmlint rpm2cpio cpio readelf; do
  command -v "$t" >/dev/null || fail "$t not found (scripts/install-deps installs rpm, rpmlint)"
done

WORK=$(mktemp -d /var/tmp/greedy-rpm-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The Slurm the RPMs must be built for: the headers build-rpm builds against.
HEADER=$RELEASE_ROOT/usr/include/slurm/slurm_version.h
NUMBER=$(awk '/#define SLURM_VERSION_NUMBER/ { print $3 }' "$HEADER")
[[ $NUMBER == 0x* ]] || fail "no SLURM_VERSION_NUMBER in $HEADER"
SLURM=$(printf '%d.%02d.%d' $((NUMBER >> 16)) $(((NUMBER >> 8) & 255)) $((NUMBER & 255)))
PLUGINDIR=/usr/lib64/slurm # the spec's default, %{_libdir}/slurm: SchedMD's PluginDir

# --- build ------------------------------------------------------------------------------------
t0=$SECONDS
OUT=$CARGO_TARGET_DIR/rpm${RELEASE_ROOT:+-$RELEASE}
mapfile -t RPMS < <("$ROOT/packaging/build-rpm" ${RELEASE_ROOT:+--release "$RELEASE"})
((${#RPMS[@]} == 5)) || fail "build-rpm made ${#RPMS[@]} packages: ${RPMS[*]}"
SLURM_RPM=${RPMS[0]} TOOLS_RPM=${RPMS[1]} LIB_RPM=${RPMS[2]} DEVEL_RPM=${RPMS[3]} SRPM=${RPMS[4]}
[[ $SLURM_RPM == */greedy-slurm-*.rpm && $TOOLS_RPM == */greedy-tools-*.rpm && $LIB_RPM == */libgreedy0-*.rpm &&
  $DEVEL_RPM == */greedy-devel-*.rpm && $SRPM == */greedy-*.src.rpm ]] ||
  fail "build-rpm printed ${RPMS[*]}"
! grep -Eq '^[[:space:]]*(Updating|Downloading|Downloaded) ' "$OUT/rpmbuild.log" ||
  fail "cargo used the network in rpmbuild: $(grep -E '(Updating|Downloading|Downloaded) ' "$OUT/rpmbuild.log" | head -3)"
grep -q '^directory = "vendor"' < <(tar -xzOf "$OUT"/greedy-*.tar.gz --wildcards '*/packaging/greedy.spec') ||
  fail "the tarball's spec sets up no source replacement"
n=$(tar -tzf "$OUT"/greedy-*.tar.gz | grep -c '^greedy-[0-9.]*/vendor/[^/]*/Cargo.toml$')
((n > 0)) || fail "the tarball has no vendored crates"
pass "packaging/build-rpm: $(basename -a "${RPMS[@]}" | tr '\n' ' ')in $((SECONDS - t0)) s; $n crates vendored, none downloaded"

# --- rpmlint ----------------------------------------------------------------------------------
set +e
LINT=$(rpmlint -r "$ROOT/packaging/greedy.rpmlintrc" "$ROOT/packaging/greedy.spec" "$SRPM" "$SLURM_RPM" "$TOOLS_RPM" "$LIB_RPM" "$DEVEL_RPM" 2>&1)
set -e
SUMMARY=$(grep -E '[0-9]+ errors, [0-9]+ warnings' <<<"$LINT") || fail "rpmlint printed no summary: $LINT"
[[ $SUMMARY == *" 0 errors, 0 warnings"* ]] || fail "rpmlint: $LINT"
pass "rpmlint (packaging/greedy.rpmlintrc) on the spec, the source RPM and the four RPMs: ${SUMMARY# }"

# --- greedy-slurm -----------------------------------------------------------------------------
NVR=$(rpm -qp --qf '%{NAME}-%{VERSION}-%{RELEASE}' "$SLURM_RPM" 2>/dev/null)
[[ $NVR == greedy-slurm-*-*.slurm$SLURM ]] || fail "greedy-slurm is not named for Slurm $SLURM: $NVR"
REQ=$(rpm -qpR "$SLURM_RPM" 2>/dev/null)
grep -qx "slurm = $SLURM" <<<"$REQ" || fail "greedy-slurm lacks Requires: slurm = $SLURM: $REQ"
grep -qx 'libpmix.so.2()(64bit)' <<<"$REQ" || fail "greedy-slurm does not require libpmix.so.2: $REQ"
LIST=$(rpm -qpl "$SLURM_RPM" 2>/dev/null)
want=("$PLUGINDIR/mpi_greedy.so" /usr/share/man/man7/greedy.7.gz /usr/share/man/man8/mpi_greedy.8.gz)
not=()
if [[ $SLURM == 22.05.* ]]; then
  want+=("$PLUGINDIR/route_greedy.so" /usr/bin/greedy-route /usr/share/man/man1/greedy-route.1.gz)
  not+=("$PLUGINDIR/topology_greedy.so")
else # no route plugins from 23.11: topology/greedy takes route/greedy's place
  want+=("$PLUGINDIR/topology_greedy.so")
  not+=("$PLUGINDIR/route_greedy.so" /usr/bin/greedy-route)
fi
for f in "${want[@]}"; do grep -qx "$f" <<<"$LIST" || fail "greedy-slurm lacks $f: $LIST"; done
for f in "${not[@]}"; do ! grep -qx "$f" <<<"$LIST" || fail "greedy-slurm for Slurm $SLURM holds $f"; done
n=$(grep -c '\.so$' <<<"$LIST")
((n == 2)) || fail "greedy-slurm holds $n plugins, expected 2: $LIST"

# plugin_version NAME: the plugin_version symbol's 4 bytes (little endian) in the extracted .so
mkdir -p "$WORK/x"
(cd "$WORK/x" && rpm2cpio "$SLURM_RPM" | cpio -idm --quiet && rpm2cpio "$TOOLS_RPM" | cpio -idm --quiet) ||
  fail "rpm2cpio | cpio"
plugin_version() {
  local so=$WORK/x$PLUGINDIR/$1 value ndx addr off
  read -r value ndx < <(readelf --dyn-syms -W "$so" | awk '$8 == "plugin_version" { print $2, $7 }')
  [[ -n ${value:-} ]] || fail "no plugin_version symbol in $1"
  read -r addr off < <(readelf -S -W "$so" | sed 's/\[ */[/' | awk -v n="[$ndx]" '$1 == n { print $4, $5 }')
  echo "0x$(od -An -tx4 -j $((0x$value - 0x$addr + 0x$off)) -N4 "$so" | tr -d ' ')"
}
mapfile -t SOS < <(grep -o '[a-z]*_greedy\.so$' <<<"$LIST")
for so in "${SOS[@]}"; do
  v=$(plugin_version "$so")
  ((v == NUMBER)) || fail "$so was built for Slurm $v, the headers are $NUMBER"
done
pass "$NVR: Requires slurm = $SLURM; ${SOS[*]} (plugin_version $NUMBER) in $PLUGINDIR, man pages"

# --- greedy-tools -----------------------------------------------------------------------------
LIST=$(rpm -qpl "$TOOLS_RPM" 2>/dev/null)
for f in /usr/bin/greedyrun /usr/bin/greedyd /usr/bin/greedy-guard /usr/bin/greedy-tree /usr/share/man/man1/greedyrun.1.gz \
  /usr/share/man/man8/greedyd.8.gz /usr/share/man/man1/greedy-tree.1.gz /usr/share/man/man1/greedy-tree-plan.1.gz \
  /usr/share/bash-completion/completions/greedyrun /usr/share/zsh/site-functions/_greedy-tree \
  /usr/share/fish/vendor_completions.d/greedyd.fish /usr/bin/greedy-stack; do
  grep -qx "$f" <<<"$LIST" || fail "greedy-tools lacks $f: $LIST"
done
grep -qx /usr/lib64/libgreedy.so.0 <(rpm -qpl "$LIB_RPM" 2>/dev/null) || fail "libgreedy0 lacks libgreedy.so.0"
DEVEL=$(rpm -qpl "$DEVEL_RPM" 2>/dev/null)
for f in /usr/include/greedy/libi.h /usr/lib64/libgreedy.so /usr/lib64/pkgconfig/greedy-libi.pc; do
  grep -qx "$f" <<<"$DEVEL" || fail "greedy-devel lacks $f: $DEVEL"
done
! grep -q '_greedy\.so$' <<<"$LIST" || fail "greedy-tools holds a plugin"
if [[ -z $RELEASE_ROOT ]]; then # built against the machine: it runs here
  "$WORK/x/usr/bin/greedyrun" --version >/dev/null || fail "the packaged greedyrun does not run"
  PAGE=$(MANWIDTH=100 man -P cat -l "$WORK/x/usr/share/man/man1/greedyrun.1.gz" 2>&1) || fail "man greedyrun: $PAGE"
  [[ $PAGE == *"EXIT STATUS"* && $PAGE == *--hostfile* ]] || fail "the packaged greedyrun(1) lacks EXIT STATUS or --hostfile"
fi
pass "$(rpm -qp --qf '%{NAME}-%{VERSION}-%{RELEASE}' "$TOOLS_RPM" 2>/dev/null): greedyrun, greedyd, greedy-tree, man pages, completions"

# --- macros -----------------------------------------------------------------------------------
FILES=$(rpmspec -P --define "slurm_include_dir ${HEADER%/*}" --define 'slurm_plugin_dir /opt/slurm/lib64/slurm' \
  "$ROOT/packaging/greedy.spec" 2>/dev/null | sed -n '/^%files slurm/,/^%files tools/p')
grep -qx /opt/slurm/lib64/slurm/mpi_greedy.so <<<"$FILES" || fail "slurm_plugin_dir does not move the plugins: $FILES"
pass "--define 'slurm_plugin_dir /opt/slurm/lib64/slurm' moves the plugins"
echo "$TAG: all passed"
