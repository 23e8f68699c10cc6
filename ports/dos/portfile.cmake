# Overlay port: the source is this repository, never a download.
#   DOS_SOURCE_DIR (environment) names another checkout; by default the port builds the
#   tree it lives in (ports/dos/../..), which is what `--overlay-ports=<repo>/ports` means.
# A port for the vcpkg registry would instead fetch a release:
#   vcpkg_from_github(OUT_SOURCE_PATH SOURCE_PATH REPO <owner>/dos REF "v${VERSION}" SHA512 <...>)
if(DEFINED ENV{DOS_SOURCE_DIR})
  set(SOURCE_PATH "$ENV{DOS_SOURCE_DIR}")
else()
  get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
endif()
if(NOT EXISTS "${SOURCE_PATH}/include/dos/optimizer.hpp" OR NOT EXISTS "${SOURCE_PATH}/CMakeLists.txt")
  message(FATAL_ERROR "dos: no dos source tree at '${SOURCE_PATH}' (from DOS_SOURCE_DIR or the port's location); "
                      "set DOS_SOURCE_DIR to a dos checkout")
endif()

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    cuda DOS_WITH_CUDA
)
if("cuda" IN_LIST FEATURES)
  set(require_cuda ON)
else()
  set(require_cuda OFF)
  # Header-only: one configuration is the whole package.
  set(VCPKG_BUILD_TYPE release)
endif()

# DOS_REQUIRE_CUDA: the cuda feature promises dos::cuda, so a missing toolkit fails the
# build instead of installing a package without it.
vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DDOS_REQUIRE_CUDA=${require_cuda}
    -DDOS_BUILD_TESTS=OFF
    -DDOS_BUILD_EXAMPLES=OFF
    -DDOS_BUILD_BENCHMARKS=OFF
    -DDOS_INSTALL=ON
    -DDOS_WITH_TORCH=OFF
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH lib/cmake/dos)
vcpkg_fixup_pkgconfig()

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug/include" "${CURRENT_PACKAGES_DIR}/debug/share")

# The repository has no license file yet; say so rather than invent one.
if(EXISTS "${SOURCE_PATH}/LICENSE")
  vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
else()
  file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright"
       "dos ${VERSION}: the source tree carries no license file yet; ask its authors before redistributing.\n")
endif()
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
