#!/usr/bin/env bash
# CTest's conan_create: `conan create` of the checkout, offline, then test_package.
#   conan_create.sh CONAN SOURCE WORK VERSION [cuda]
# CONAN is cmake/dev.sh's virtual environment's conan (exit 77, "skipped", where it is
# absent). Everything Conan writes goes under WORK: a private CONAN_HOME whose profile
# comes from `conan profile detect`, with C++20 and {fmt} declared a platform
# requirement (Debian's libfmt-dev), and no remote at all, so nothing is downloaded.
# The tree at SOURCE is only read: test_package is copied under WORK and built there.
set -euo pipefail
if (($# < 4)); then
  echo "usage: conan_create.sh CONAN SOURCE WORK VERSION [cuda]" >&2
  exit 2
fi
conan=$1 source=$2 work=$3 version=$4 cuda=${5:-}
if [[ ! -x $conan ]]; then
  echo "SKIPPED: conan not found at '$conan'; bash cmake/dev.sh installs it (Conan 2 from PyPI in build/venv)"
  exit 77
fi
fmt_version=$(dpkg-query -W -f='${Version}' libfmt-dev 2>/dev/null | sed 's/[+~-].*//') || true
if [[ -z $fmt_version ]]; then
  echo "conan_create: Debian's libfmt-dev is not installed; the profile takes {fmt} from the system" >&2
  exit 1
fi

rm -rf "$work"
mkdir -p "$work"
export CONAN_HOME=$work/home
"$conan" profile detect --name default >"$work/detect.log" 2>&1 || { cat "$work/detect.log"; exit 1; }
profile=$CONAN_HOME/profiles/default
# dos needs C++20; detect picks the compiler's default (gnu17 for g++ 12).
sed -i 's/^compiler.cppstd=.*/compiler.cppstd=20/' "$profile"
printf '\n[platform_requires]\nfmt/%s\n' "$fmt_version" >>"$profile"
# No remotes: a requirement the profile does not satisfy fails instead of downloading.
"$conan" remote remove '*' >/dev/null 2>&1 || true
if [[ -n $("$conan" remote list --format=json 2>/dev/null | tr -d '[:space:][]') ]]; then
  echo "conan_create: could not remove Conan's remotes" >&2
  exit 1
fi
cp -r "$source/test_package" "$work/test_package"
rm -rf "$work/test_package/build" "$work/test_package/CMakeUserPresets.json"

options=()
[[ $cuda == cuda ]] && options=(-o "dos/*:cuda=True")
"$conan" create "$source" --test-folder "$work/test_package" --build=missing "${options[@]}" \
  --format=json >"$work/graph.json" 2> >(tee "$work/create.log" >&2)

# The package is the version CMakeLists.txt sets, and header-only by default.
ref=$(grep -o "\"ref\": \"dos/[^\"]*\"" "$work/graph.json" | head -1 | sed 's/.*"dos\//dos\//; s/"$//')
if [[ $ref != "dos/$version"* ]]; then
  echo "conan_create: created '$ref', expected dos/$version (project(VERSION) in CMakeLists.txt)" >&2
  exit 1
fi
if [[ $cuda != cuda ]] && ! grep -q '"package_type": "header-library"' "$work/graph.json"; then
  echo "conan_create: dos/$version is not a header-library package" >&2
  exit 1
fi
for line in "from Conan: p\[0\] = [0-9.]*, ok"; do
  if ! grep -q "$line" "$work/create.log"; then
    echo "conan_create: test_package did not print '$line'" >&2
    exit 1
  fi
done
echo "conan_create: $ref created offline, test_package ran"
