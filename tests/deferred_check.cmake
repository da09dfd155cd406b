# cmake -DNM=<nm> -DOBJECT=<umbrella.o> -P deferred_check.cmake
# The object is the umbrella included and not used, compiled with -O0 -fkeep-inline-functions:
# every inline function is emitted, and with it every template it instantiates. The deferred
# definitions of the rollout, staleness and sync blocks (config.hpp, RLPT_DEFER) must not be
# among them: a non-template inline function that calls one makes every including TU instantiate
# it and what it names (the cost that making them templates removed; docs/performance.md).
# Allowed: the manifest's constructor, size and operator[] (other inline code uses them) and
# core's message helpers, templates of an empty pack too.
include("${CMAKE_CURRENT_LIST_DIR}/nm_symbols.cmake")
nm_symbols(syms "${OBJECT}" DEMANGLE)
set(failed "")
set(n 0)
foreach(line IN LISTS syms)
  if(NOT line MATCHES "^[0-9a-f]+ [TtWw] (.*)$")
    continue()
  endif()
  set(sym "${CMAKE_MATCH_1}")
  if(sym MATCHES "basic_manifest<void>::(basic_manifest|size|operator\\[\\])\\(" OR sym MATCHES
                                                                                   "rlpt::v[0-9_]+::detail::(fail|format)<>\\(")
    continue()
  endif()
  # A function of a deferred class (or of a class nested in one), or a deferred free function;
  # their member types may appear in other templates' arguments.
  if(sym MATCHES "basic_[a-z_]+<void>::([a-z_0-9]+::)*(~?[a-z_0-9]+|operator[^ (]*)(<.*>)?\\("
     OR sym MATCHES "rlpt::v[0-9_]+::[a-z_:]*[a-z0-9_]<>\\(")
    string(APPEND failed "  ${sym}\n")
    math(EXPR n "${n} + 1")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "including the umbrella instantiates ${n} deferred definitions (a non-template inline "
                      "function calls them: give it RLPT_DEFER, config.hpp):\n${failed}")
endif()
message(STATUS "the umbrella instantiates no deferred definition")
