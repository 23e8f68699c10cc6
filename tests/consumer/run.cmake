# Installs the dos tree at DOS_SOURCE into a scratch prefix, then configures, builds
# and runs tests/consumer against it with find_package(dos CONFIG). Header-only: the
# nvcc-built dos::cuda is left out so the check needs no build step.
file(REMOVE_RECURSE "${WORK}")
macro(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test failed at: ${ARGN}")
  endif()
endmacro()
run_step(${CMAKE_COMMAND} -S ${DOS_SOURCE} -B ${WORK}/dos-build -G ${GENERATOR} -DDOS_BUILD_TESTS=OFF
         -DDOS_BUILD_EXAMPLES=OFF -DDOS_BUILD_BENCHMARKS=OFF -DDOS_INSTALL=ON -DDOS_WITH_CUDA=OFF)
run_step(${CMAKE_COMMAND} --install ${WORK}/dos-build --prefix ${WORK}/prefix)
file(GLOB_RECURSE config "${WORK}/prefix/*/dosConfig.cmake")
if(NOT config)
  message(FATAL_ERROR "the install did not lay out dosConfig.cmake")
endif()
run_step(${CMAKE_COMMAND} -S ${DOS_SOURCE}/tests/consumer -B ${WORK}/consumer-build -G ${GENERATOR}
         -DCMAKE_PREFIX_PATH=${WORK}/prefix)
run_step(${CMAKE_COMMAND} --build ${WORK}/consumer-build)
run_step(${WORK}/consumer-build/consumer)
