# SPDX-License-Identifier: Apache-2.0
# Install rules, exported targets (install tree and build tree), package config, pkg-config.
include(CMakePackageConfigHelpers)

set(RLPT_CMAKE_DIR "${CMAKE_INSTALL_DATADIR}/cmake/rlpt"
  CACHE STRING "Where rlpt's CMake package files are installed, relative to the prefix")

# core always; the others where their dependencies were found (CMakeLists.txt).
set(_rlpt_components core)
foreach(comp IN ITEMS compiled lm_head auth ucx cuda cuda_lm_head nccl)
  if(TARGET rlpt_${comp})
    list(APPEND _rlpt_components ${comp})
  endif()
endforeach()

# One export set per component, so a consumer never loads targets (and their dependencies:
# Eigen, OpenSSL, UCX, CUDA, cuBLAS, NCCL) of a component it did not ask for. The compiled
# component is a library file; the others are header-only.
set(_rlpt_export_core rlpt)
foreach(comp IN ITEMS compiled lm_head auth ucx cuda cuda_lm_head nccl)
  set(_rlpt_export_${comp} rlpt_${comp})
endforeach()

configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/rlpt-config.cmake.in"
  "${PROJECT_BINARY_DIR}/rlpt-config.cmake"
  INSTALL_DESTINATION "${RLPT_CMAKE_DIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/rlpt-config-version.cmake"
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)

# Build tree: find_package(rlpt) works with rlpt_DIR pointing at the build directory.
foreach(comp IN LISTS _rlpt_components)
  export(TARGETS ${_rlpt_export_${comp}} NAMESPACE rlpt::
    FILE "${PROJECT_BINARY_DIR}/rlpt-${comp}-targets.cmake")
endforeach()
configure_file("${CMAKE_CURRENT_LIST_DIR}/FindNCCL.cmake" "${PROJECT_BINARY_DIR}/FindNCCL.cmake" COPYONLY)

if(RLPT_INSTALL)
  foreach(comp IN LISTS _rlpt_components)
    if(comp STREQUAL "compiled")
      install(TARGETS rlpt_compiled EXPORT rlpt-compiled-targets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
    else()
      install(TARGETS ${_rlpt_export_${comp}} EXPORT rlpt-${comp}-targets
        FILE_SET HEADERS DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
    endif()
    install(EXPORT rlpt-${comp}-targets NAMESPACE rlpt:: DESTINATION "${RLPT_CMAKE_DIR}")
  endforeach()
  install(FILES
    "${PROJECT_BINARY_DIR}/rlpt-config.cmake"
    "${PROJECT_BINARY_DIR}/rlpt-config-version.cmake"
    "${CMAKE_CURRENT_LIST_DIR}/FindNCCL.cmake"
    DESTINATION "${RLPT_CMAKE_DIR}")

  # The prefix relative to the .pc file, so that `cmake --install --prefix` elsewhere still holds.
  if(IS_ABSOLUTE "${CMAKE_INSTALL_DATADIR}")
    set(RLPT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  else()
    file(RELATIVE_PATH _rlpt_pc_up "/${CMAKE_INSTALL_DATADIR}/pkgconfig" "/")
    string(REGEX REPLACE "/$" "" _rlpt_pc_up "${_rlpt_pc_up}")
    set(RLPT_PC_PREFIX "\${pcfiledir}/${_rlpt_pc_up}")
  endif()
  configure_file("${CMAKE_CURRENT_LIST_DIR}/rlpt.pc.in" "${PROJECT_BINARY_DIR}/rlpt.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/rlpt.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")
  if(TARGET rlpt_lm_head)
    configure_file("${CMAKE_CURRENT_LIST_DIR}/rlpt-lm-head.pc.in" "${PROJECT_BINARY_DIR}/rlpt-lm-head.pc" @ONLY)
    install(FILES "${PROJECT_BINARY_DIR}/rlpt-lm-head.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")
  endif()
  install(FILES LICENSE README.md DESTINATION "${CMAKE_INSTALL_DOCDIR}")
endif()
