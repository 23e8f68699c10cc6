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
# is checked. ninja-build: vcpkg's portfiles build with it. python3-venv: the venv below.
# nlohmann-json3-dev: checkpoints. python3-torch, python3-dev: the checkpoint tool's test
# and the Python package (dos.torch), tested against Debian's torch 1.13.
# libopenmpi-dev, openmpi-bin: dos::mpi and the tests under mpiexec.
packages=(cmake make g++ libfmt-dev doctest-dev libbenchmark-dev libtorch-dev doxygen python3 clang pkg-config
          ninja-build python3-venv python3-dev nlohmann-json3-dev python3-torch libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "dos: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc)

# build/venv: Debian's python3 with its site packages (torch 1.13) visible, plus Conan
# (the conan_create test), the Python package's build tools and pytest from PyPI
# (installed once), and dos built from this checkout (incrementally, in build/python).
# Never touches the system Python. The tests build the extension without the CUDA
# backend (no GPU here; nvcc would add minutes); a plain `pip install .` includes it.
python_env() {
  local venv=build/venv
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
  [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -c "import scikit_build_core, nanobind, pytest, conans" 2>/dev/null ||
    "$venv/bin/pip" install -q "scikit-build-core>=0.10" "nanobind>=2.0" pytest "conan>=2.0,<3"
  "$venv/bin/pip" install -q --no-build-isolation --config-settings=cmake.define.DOS_WITH_CUDA=OFF .
}
case "${1:-}" in
  quickstart)
    cmake --preset release >/dev/null
    cmake --build --preset release -j "$jobs" --target quickstart
    build/release/examples/quickstart
    ;;
  test)
    # CI gives this 90 minutes on 2 cores. The tests run two at a time (none is timed),
    # and the sanitizer presets compile at -O1 -g1: at -O2 -g the ASan + UBSan build
    # alone took about 46 minutes on such a machine, at -O1 -g1 about 16.
    python_env
    cmake --preset release -DDOS_PYTHON_TESTS="$PWD/build/venv/bin/python"
    cmake --build --preset release -j "$jobs"
    ctest --preset release -j "$jobs"
    cmake --preset asan
    cmake --build --preset asan -j "$jobs"
    ctest --preset asan -j "$jobs"
    cmake --preset tsan
    cmake --build --preset tsan -j "$jobs"
    ctest --preset tsan -j "$jobs"
    ;;
  *)
    echo "usage: bash cmake/dev.sh quickstart|test" >&2
    exit 2
    ;;
esac
