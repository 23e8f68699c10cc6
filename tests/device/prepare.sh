#!/usr/bin/env bash
# Fetches what the GPU machine lacks for the device check, on a machine with Debian's
# package registry (no root needed): fmt, doctest and Google Benchmark, downloaded with
# `apt-get download` and unpacked with `dpkg -x` under one ignored folder of this
# checkout (never into /). The folder is a few MiB, so it travels with the working tree
# to a machine that reaches no registry; tests/device/check.sh finds it there.
#
#   bash tests/device/prepare.sh [DIR]     (default build/device-deps)
#
# Exit 0: DIR is ready (or already was). Exit 77: the registry cannot be reached and DIR
# is not ready (the CTest test reports that as skipped, not passed). Other: a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-build/device-deps}"
packages=(libfmt-dev libfmt9 doctest-dev libbenchmark-dev libbenchmark1debian)
stamp="$dir/READY"
if [[ -e $stamp && "$(cat "$stamp")" == "${packages[*]}" ]]; then
  echo "prepare: $dir is ready"
  exit 0
fi
command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
  { echo "prepare: needs apt-get and dpkg (Debian or Ubuntu) to fetch ${packages[*]}" >&2; exit 77; }
rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/root"
# apt-get download writes into the current directory; as root it warns that the _apt
# user cannot write there, which is harmless (it downloads unsandboxed).
(cd "$dir/debs" && apt-get download -q "${packages[@]}" 2>&1 | grep -v "unsandboxed") || true
if (($(ls "$dir/debs"/*.deb 2>/dev/null | wc -l) != ${#packages[@]})); then
  echo "prepare: apt-get download of ${packages[*]} failed (is Debian's registry reachable? try apt-get update)" >&2
  rm -rf "$dir"
  exit 77
fi
for deb in "$dir/debs"/*.deb; do dpkg -x "$deb" "$dir/root"; done
rm -rf "$dir/debs" "$dir/root/usr/share/doc" "$dir/root/usr/share/lintian"

# fmt as a header-only package: Debian's fmt::fmt links libfmt.so.9, built against
# Debian 12's C and C++ runtimes, which the GPU machine's may be older than. With
# FMT_HEADER_ONLY nothing of it is needed at run time. Paths are relative to the file:
# the folder moves with the working tree.
mkdir -p "$dir/fmt-header-only"
version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$dir"/root/usr/lib/*/cmake/fmt/fmt-config-version.cmake)
cat >"$dir/fmt-header-only/fmt-config.cmake" <<CMAKE
# Written by tests/device/prepare.sh: {fmt} $version from Debian's libfmt-dev, header-only.
if(NOT TARGET fmt::fmt)
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${CMAKE_CURRENT_LIST_DIR}/../root/usr/include"
                                            INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1")
  add_library(fmt::fmt-header-only ALIAS fmt::fmt)
endif()
set(fmt_VERSION $version)
CMAKE
cat >"$dir/fmt-header-only/fmt-config-version.cmake" <<CMAKE
set(PACKAGE_VERSION $version)
set(PACKAGE_VERSION_COMPATIBLE TRUE)
if(PACKAGE_FIND_VERSION AND PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
endif()
CMAKE
echo "${packages[*]}" >"$stamp"
echo "prepare: $dir holds $(du -sh "$dir" | cut -f1) (${packages[*]})"
