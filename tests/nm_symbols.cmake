# include()d by the object checks that run in script mode (-P): deferred_check.cmake,
# no_emitted_code.cmake, objective/clone_check.cmake.
# nm_symbols(<out> <object> [DEMANGLE]): the defined symbols of <object> as nm lists them, one list
# entry per line ("address type name"); fails the check when nm does.
function(nm_symbols out object)
  set(flags --defined-only)
  if("${ARGN}" STREQUAL "DEMANGLE")
    list(PREPEND flags -C)
  endif()
  execute_process(COMMAND "${NM}" ${flags} "${object}" OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(REPLACE "\n" ";" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
