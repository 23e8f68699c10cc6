# Test-only overlay, from the offline vcpkg's example (tools/vcpkg/example/overlay-ports/fmt):
# vcpkg_port has no registry, so its "fmt" dependency is satisfied by Debian's libfmt-dev.
# Satisfy "fmt" from the operating system instead of building it (no download).
# Requires: apt-get install libfmt-dev   (Debian 12: fmt 9.1.0)
set(VCPKG_POLICY_EMPTY_PACKAGE enabled)

find_file(SYSTEM_FMT_CONFIG NAMES fmt-config.cmake
    PATHS /usr/lib/x86_64-linux-gnu/cmake/fmt /usr/lib/cmake/fmt /usr/local/lib/cmake/fmt /usr/lib64/cmake/fmt
    NO_DEFAULT_PATH)
if(NOT SYSTEM_FMT_CONFIG)
    message(FATAL_ERROR "System fmt not found. Install it first: apt-get install libfmt-dev")
endif()
message(STATUS "Using system fmt: ${SYSTEM_FMT_CONFIG}")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright"
    "fmt is provided by the operating system (libfmt-dev); see /usr/share/doc/libfmt-dev/copyright\n")
