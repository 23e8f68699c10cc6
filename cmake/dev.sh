#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (run as root) and builds dos, then:
#   bash cmake/dev.sh quickstart   runs the quickstart example (the main job)
#   bash cmake/dev.sh test         runs every test: the optimised build, then the
#                                  AddressSanitizer + UBSan build, then the engine's
#                                  tests under ThreadSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."

# libtorch-dev: the torch adapter's tests and train_gpt (skipped where absent).
# doxygen and python3: the documentation and layering checks.
# clang: the stand-alone header tests compile with g++ and clang++. pkg-config: dos.pc
# is checked. ninja-build: vcpkg's portfiles build with it. python3-venv: Conan, below.
# nlohmann-json3-dev: checkpoints. python3-torch: the checkpoint tool's test.
packages=(cmake make g++ libfmt-dev doctest-dev libbenchmark-dev libtorch-dev doxygen python3 clang pkg-config
          ninja-build python3-venv nlohmann-json3-dev python3-torch)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "dos: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Conan 2 from PyPI, for the conan_create test, in a virtual environment of its own
# (never the system Python); build/venv is what tests/packaging looks for.
install_conan() {
  local venv=build/venv
  if [[ ! -x $venv/bin/conan ]]; then
    echo "dos: installing Conan 2 into $venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "conan>=2.0,<3"
  fi
}

jobs=$(nproc)
case "${1:-}" in
  quickstart)
    cmake --preset release >/dev/null
    cmake --build --preset release -j "$jobs" --target quickstart
    build/release/examples/quickstart
    ;;
  test)
    install_conan
    cmake --preset release
    cmake --build --preset release -j "$jobs"
    ctest --preset release
    cmake --preset asan
    cmake --build --preset asan -j "$jobs"
    ctest --preset asan
    cmake --preset tsan
    cmake --build --preset tsan -j "$jobs"
    ctest --preset tsan
    ;;
  *)
    echo "usage: bash cmake/dev.sh quickstart|test" >&2
    exit 2
    ;;
esac
