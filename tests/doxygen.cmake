# Runs Doxygen over the public headers and docs with warnings as errors, writing into
# the build tree. Arguments: -DDOXYGEN=exe -DSOURCE=repository -DOUT=dir
file(READ ${SOURCE}/Doxyfile config)
file(MAKE_DIRECTORY ${OUT})
file(WRITE ${OUT}/Doxyfile "${config}\nOUTPUT_DIRECTORY = ${OUT}\n")
execute_process(COMMAND ${DOXYGEN} ${OUT}/Doxyfile WORKING_DIRECTORY ${SOURCE} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT err STREQUAL "")
  message(FATAL_ERROR "doxygen reported problems (exit ${rc}):\n${err}${out}")
endif()
message(STATUS "doxygen: no warnings")
