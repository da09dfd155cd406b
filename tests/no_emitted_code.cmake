# cmake -DNM=<nm> -DOBJECTS="a.o|b.o|..." -P no_emitted_code.cmake
# Each object is a header-check TU: one public header, included and not used. None may define an
# rlpt function: everything a header defines is inline or a template, emitted only where it is
# called. A function compiled into every including TU costs each one its code generation (an
# out-of-class virtual function without RLPT_INLINE on its declaration did: its class's vtable
# and every virtual function with it, config.hpp).
include("${CMAKE_CURRENT_LIST_DIR}/nm_symbols.cmake")
string(REPLACE "|" ";" objects "${OBJECTS}")
set(failed "")
foreach(obj IN LISTS objects)
  nm_symbols(syms "${obj}" DEMANGLE)
  foreach(line IN LISTS syms)
    if(line MATCHES "^[0-9a-f]+ [TtWw] (.*rlpt::.*)$")
      get_filename_component(name "${obj}" NAME)
      string(APPEND failed "  ${name}: ${CMAKE_MATCH_1}\n")
    endif()
  endforeach()
endforeach()
if(failed)
  message(FATAL_ERROR "header-check TUs that include a header and use nothing define rlpt functions:\n${failed}")
endif()
list(LENGTH objects n)
message(STATUS "${n} header TUs: no rlpt function emitted")
