# Copies include/ as a user vendoring rlpt would, then builds with one plain compiler call given
# only rlpt's include/ and fmt: the core blocks (the umbrella) build without Eigen.
file(REMOVE_RECURSE "${WORK_DIR}")
file(COPY "${RLPT_SOURCE_DIR}/include" DESTINATION "${WORK_DIR}/third_party/rlpt")
execute_process(
  COMMAND "${CXX}" -std=c++20 -I "${WORK_DIR}/third_party/rlpt/include"
          "${MAIN}" -o "${WORK_DIR}/consumer" -lfmt
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "vendored build failed (${rc})")
endif()
execute_process(COMMAND "${WORK_DIR}/consumer" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "vendored consumer exited with ${rc}")
endif()
