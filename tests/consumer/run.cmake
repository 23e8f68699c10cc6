# The installed package, as a downstream project sees it. Run by CTest as
#   cmake -DDOS_SOURCE=<repo> -DWORK=<scratch> -DGENERATOR=<gen> -DDOS_BUILD_DIR=<this build>
#         -DDOS_CUDA_FOUND=ON|OFF -DDOS_MPI_FOUND=ON|OFF -DPKG_CONFIG=<pkg-config or empty> -DCXX=<c++ compiler> -P run.cmake
# 1. dos configured without CUDA, installed: tests/consumer builds and runs with
#    find_package(dos CONFIG), and with pkg-config; asking for the cuda component fails
#    and says why; an unknown component fails and names it.
# 2. where this build has dos::cuda: this build tree is installed (its dos::cuda is
#    already compiled), the consumer of dos::cuda builds and runs, and dos::dos alone
#    is found with the CUDA toolkit hidden from CMake.
foreach(var DOS_SOURCE WORK GENERATOR DOS_BUILD_DIR CXX)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")

macro(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test failed (exit ${rc}) at: ${ARGN}")
  endif()
endmacro()

# Configures tests/consumer/components with find_package(dos CONFIG <args>) against
# <prefix>; <expect> is "ok" or "fail"; the output must match every regex after it.
function(probe name prefix args expect)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${DOS_SOURCE}/tests/consumer/components -B ${WORK}/probe-${name}
                          -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} "-DDOS_FIND_ARGS=${args}" ${PROBE_EXTRA}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # CMake wraps the reasons it prints: match against the text with whitespace collapsed.
  string(REGEX REPLACE "[ \t\r\n]+" " " all "${out}${err}")
  if((expect STREQUAL "ok" AND NOT rc EQUAL 0) OR (expect STREQUAL "fail" AND rc EQUAL 0))
    message(FATAL_ERROR "probe ${name}: find_package(dos CONFIG ${args}) should ${expect} but exited ${rc}:\n${all}")
  endif()
  foreach(regex IN LISTS ARGN)
    if(NOT all MATCHES "${regex}")
      message(FATAL_ERROR "probe ${name}: output does not match '${regex}':\n${all}")
    endif()
  endforeach()
  message(STATUS "probe ${name}: find_package(dos CONFIG ${args}) -> ${expect}, as expected")
endfunction()

# 1. Header-only.
set(prefix ${WORK}/prefix)
run_step(${CMAKE_COMMAND} -S ${DOS_SOURCE} -B ${WORK}/dos-build -G ${GENERATOR} -DDOS_BUILD_TESTS=OFF
         -DDOS_BUILD_EXAMPLES=OFF -DDOS_BUILD_BENCHMARKS=OFF -DDOS_INSTALL=ON -DDOS_WITH_CUDA=OFF)
run_step(${CMAKE_COMMAND} --install ${WORK}/dos-build --prefix ${prefix})
file(GLOB_RECURSE config "${prefix}/*/dosConfig.cmake")
if(NOT config)
  message(FATAL_ERROR "the install did not lay out dosConfig.cmake")
endif()
file(GLOB_RECURSE cuda_targets "${prefix}/*/dosCudaTargets.cmake")
if(cuda_targets)
  message(FATAL_ERROR "a package built with DOS_WITH_CUDA=OFF installed ${cuda_targets}")
endif()
run_step(${CMAKE_COMMAND} -S ${DOS_SOURCE}/tests/consumer -B ${WORK}/consumer-build -G ${GENERATOR}
         -DCMAKE_PREFIX_PATH=${prefix})
run_step(${CMAKE_COMMAND} --build ${WORK}/consumer-build)
run_step(${WORK}/consumer-build/consumer)

probe(required_cuda_missing ${prefix} "REQUIRED;COMPONENTS;cuda" fail "not in the dos package at .*/lib/cmake/dos: it was built without a CUDA toolkit")
probe(optional_cuda_missing ${prefix} "REQUIRED;OPTIONAL_COMPONENTS;cuda" ok
      "dos_FOUND=1 dos_cuda_FOUND=FALSE targets=\\[dos::dos\\]")
probe(unknown_component ${prefix} "REQUIRED;COMPONENTS;cuda;bogus" fail "dos has no component 'bogus'")

# dos::mpi: in this install where this build found MPI (its consumer builds and runs as
# a singleton MPI process); an install configured without MPI says why it lacks it.
if(DOS_MPI_FOUND)
  run_step(${CMAKE_COMMAND} -S ${DOS_SOURCE}/tests/consumer -B ${WORK}/consumer-mpi-build -G ${GENERATOR}
           -DCMAKE_PREFIX_PATH=${prefix} -DDOS_CONSUMER_MPI=ON)
  run_step(${CMAKE_COMMAND} --build ${WORK}/consumer-mpi-build)
  # Open MPI refuses root unless told; CI runs as root.
  set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
  set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
  run_step(${WORK}/consumer-mpi-build/consumer_mpi)
  probe(required_mpi_present ${prefix} "REQUIRED;COMPONENTS;mpi" ok "targets=\\[dos::dos,dos::mpi\\] dos_mpi_FOUND=TRUE")
  probe(mpi_not_loaded_unasked ${prefix} "REQUIRED" ok "targets=\\[dos::dos\\] dos_mpi_FOUND= ")
  run_step(${CMAKE_COMMAND} -S ${DOS_SOURCE} -B ${WORK}/dos-build-nompi -G ${GENERATOR} -DDOS_BUILD_TESTS=OFF
           -DDOS_BUILD_EXAMPLES=OFF -DDOS_BUILD_BENCHMARKS=OFF -DDOS_INSTALL=ON -DDOS_WITH_CUDA=OFF -DDOS_WITH_MPI=OFF)
  run_step(${CMAKE_COMMAND} --install ${WORK}/dos-build-nompi --prefix ${WORK}/prefix-nompi)
  probe(required_mpi_missing ${WORK}/prefix-nompi "REQUIRED;COMPONENTS;mpi" fail "it was built without MPI")
else()
  message(STATUS "this build has no dos::mpi: its consumer is not built")
endif()
set(PROBE_EXTRA -DDOS_FIND_VERSION=99.0)
probe(version_too_new ${prefix} "REQUIRED" fail "dosConfig.cmake, version: [0-9]+[.][0-9]+[.][0-9]+")
unset(PROBE_EXTRA)

# The same install through pkg-config, compiled with nothing but the standard and what
# dos.pc says (relocatable: the prefix is nowhere near CMAKE_INSTALL_PREFIX).
file(GLOB_RECURSE pc_file "${prefix}/*/dos.pc")
if(NOT pc_file)
  message(FATAL_ERROR "the install did not lay out dos.pc")
endif()
get_filename_component(pc_dir "${pc_file}" DIRECTORY)
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs dos RESULT_VARIABLE rc OUTPUT_VARIABLE flags
                  ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --cflags --libs dos failed: ${err}")
  endif()
  file(REAL_PATH "${pc_dir}" pc_dir)
  if(NOT flags MATCHES "-I${pc_dir}/[./]*include")
    message(FATAL_ERROR "dos.pc's include path is not under the install prefix ${prefix}: ${flags}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run_step(${CXX} -std=c++20 ${DOS_SOURCE}/tests/consumer/main.cpp ${flags} -o ${WORK}/consumer-pkg-config)
  run_step(${WORK}/consumer-pkg-config)
else()
  message(STATUS "pkg-config not found: dos.pc not checked")
endif()

# 2. With dos::cuda.
if(DOS_CUDA_FOUND)
  set(prefix ${WORK}/prefix-cuda)
  run_step(${CMAKE_COMMAND} --install ${DOS_BUILD_DIR} --prefix ${prefix})
  run_step(${CMAKE_COMMAND} -S ${DOS_SOURCE}/tests/consumer -B ${WORK}/consumer-cuda-build -G ${GENERATOR}
           -DCMAKE_PREFIX_PATH=${prefix} -DDOS_CONSUMER_CUDA=ON)
  run_step(${CMAKE_COMMAND} --build ${WORK}/consumer-cuda-build)
  run_step(${WORK}/consumer-cuda-build/consumer)
  run_step(${WORK}/consumer-cuda-build/consumer_cuda)
  probe(required_cuda_present ${prefix} "REQUIRED;COMPONENTS;cuda" ok "dos_FOUND=1 dos_cuda_FOUND=TRUE targets=\\[dos::dos,dos::cuda,CUDA::cudart\\]")
  # dos::dos from a CUDA build, on a machine without a toolkit: CMake may not look for one.
  set(PROBE_EXTRA -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
  probe(no_toolkit_needed ${prefix} "REQUIRED" ok "dos_FOUND=1 dos_cuda_FOUND= targets=\\[dos::dos\\]")
  probe(no_toolkit_for_cuda ${prefix} "REQUIRED;COMPONENTS;cuda" fail "needs the CUDA toolkit \\(CUDA::cudart\\), which was not found")
  unset(PROBE_EXTRA)
else()
  message(STATUS "this build has no dos::cuda: its consumer is not built")
endif()
