# shellcheck shell=bash
# Sourced by tests/mpi4py/suite.sh after tests/lib.sh and tests/mpi/clients.sh: mpi4py's own
# test suite, pinned to the wheel clients.sh installs (mpi4py 4.1.2), from PyPI's sdist.
# mpi4py_tests: sets M4T to the sdist's test/ directory, downloading the sdist once into
# $M4CACHE (default /var/tmp/greedy-mpi4py, which every emulated host sees too) and checking
# it against the SHA-256 pinned here before extracting it. pip builds the sdist's metadata
# to download it, which takes minutes the first time; later runs use the cache.
M4VERSION=4.1.2
M4SHA256=56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02
M4CACHE=${GREEDY_MPI4PY_CACHE:-/var/tmp/greedy-mpi4py}

mpi4py_tests() {
  local sdist=$M4CACHE/mpi4py-$M4VERSION.tar.gz
  M4T=$M4CACHE/mpi4py-$M4VERSION/test
  [[ -f $M4T/main.py ]] && return 0
  impi_venv
  mkdir -p "$M4CACHE"
  if [[ ! -f $sdist ]]; then
    echo "${0##*/}: downloading mpi4py $M4VERSION's sdist into $M4CACHE (pip builds its metadata: minutes)"
    "$IMPI/bin/pip" download -q --no-binary :all: --no-deps -d "$M4CACHE" "mpi4py==$M4VERSION" ||
      fail "pip download mpi4py==$M4VERSION"
  fi
  echo "$M4SHA256  $sdist" | sha256sum -c --quiet - || fail "$sdist: not PyPI's mpi4py $M4VERSION (SHA-256)"
  tar -xzf "$sdist" -C "$M4CACHE" "mpi4py-$M4VERSION/test" || fail "extracting $sdist"
}
