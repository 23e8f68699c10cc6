#!/usr/bin/env bash
# CTest's vcpkg_port: installs the overlay port ports/dos with an offline vcpkg, its
# source taken from this checkout (DOS_SOURCE_DIR), then builds and runs
# tests/consumer through vcpkg's toolchain file (classic mode).
#   vcpkg_port.sh VCPKG_ROOT SOURCE WORK
# VCPKG_ROOT is read only (CI: ../shared/tools/vcpkg beside the checkout); where it is
# absent the test is skipped (exit 77). Everything vcpkg writes goes under WORK, fresh
# each run: vcpkg's package hash does not cover a local source tree, so a reused
# install root would keep a stale build. Only the header-only port (no cuda feature) is
# installed here.
set -euo pipefail  # pipefail: `vcpkg install | tee` fails when vcpkg does
if (($# != 3)); then
  echo "usage: vcpkg_port.sh VCPKG_ROOT SOURCE WORK" >&2
  exit 2
fi
root=$1 source=$2 work=$3
if [[ ! -x $root/vcpkg || ! -f $root/env.sh ]]; then
  echo "SKIPPED: no offline vcpkg at '$root' (vcpkg and env.sh); set DOS_VCPKG_ROOT to one"
  exit 77
fi
for tool in ninja cmake; do
  command -v "$tool" >/dev/null || { echo "vcpkg_port: vcpkg needs $tool on PATH (Debian: ninja-build, cmake)" >&2; exit 1; }
done
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=/dev/null
. "$root/env.sh"   # offline: system cmake/ninja, no metrics, no binary cache, downloads blocked
export DOS_SOURCE_DIR=$source
dirs=(--x-install-root="$work/installed" --x-packages-root="$work/packages"
      --x-buildtrees-root="$work/buildtrees" --downloads-root="$work/downloads")
if ! "$root/vcpkg" install dos --classic --overlay-ports="$source/ports" \
     --overlay-ports="$source/tests/packaging/vcpkg-overlay" "${dirs[@]}" 2>&1 | tee "$work/install.log"; then
  for log in "$work"/buildtrees/dos/*.log; do
    [[ -f $log ]] && { echo "=== $log"; tail -n 40 "$log"; }
  done
  exit 1
fi
# vcpkg only warns about post-build check problems; a port fit for the registry has none.
if grep -q "post-build check problem" "$work/install.log"; then
  echo "vcpkg_port: vcpkg's post-build checks found problems in ports/dos (above)" >&2
  exit 1
fi
installed=$work/installed/x64-linux
for f in share/dos/dosConfig.cmake share/dos/dosConfigVersion.cmake share/dos/usage share/dos/copyright \
         include/dos/optimizer.hpp include/dos/version.hpp; do
  [[ -f $installed/$f ]] || { echo "vcpkg_port: the port did not install $f" >&2; exit 1; }
done
cmake -S "$source/tests/consumer" -B "$work/consumer-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$VCPKG_ROOT/scripts/buildsystems/vcpkg.cmake" -DVCPKG_MANIFEST_MODE=OFF \
  -DVCPKG_INSTALLED_DIR="$work/installed" -DVCPKG_TARGET_TRIPLET=x64-linux | tee "$work/consumer-configure.log"
# The consumer must have found the port's package, not some other dos.
grep -q "dos [0-9.]* from $installed/share/dos" "$work/consumer-configure.log" || {
  echo "vcpkg_port: the consumer did not find dos in $installed/share/dos" >&2; exit 1; }
cmake --build "$work/consumer-build"
"$work/consumer-build/consumer"
echo "vcpkg_port: dos installed from $source by vcpkg, consumer built with its toolchain and ran"
