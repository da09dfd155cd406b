# SPDX-License-Identifier: Apache-2.0
# Install rules, exported targets (install tree and build tree), package config, pkg-config.
include(CMakePackageConfigHelpers)

set(RLPT_CMAKE_DIR "${CMAKE_INSTALL_DATADIR}/cmake/rlpt"
  CACHE STRING "Where rlpt's CMake package files are installed, relative to the prefix")

set(_rlpt_components core)
if(TARGET rlpt_cuda)
  list(APPEND _rlpt_components cuda)
endif()
if(TARGET rlpt_nccl)
  list(APPEND _rlpt_components nccl)
endif()

# One export set per component, so a consumer without CUDA never loads CUDA targets.
set(_rlpt_export_core rlpt)
set(_rlpt_export_cuda rlpt_cuda)
set(_rlpt_export_nccl rlpt_nccl)

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
    install(TARGETS ${_rlpt_export_${comp}} EXPORT rlpt-${comp}-targets
      FILE_SET HEADERS DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
    install(EXPORT rlpt-${comp}-targets NAMESPACE rlpt:: DESTINATION "${RLPT_CMAKE_DIR}")
  endforeach()
  install(FILES
    "${PROJECT_BINARY_DIR}/rlpt-config.cmake"
    "${PROJECT_BINARY_DIR}/rlpt-config-version.cmake"
    "${CMAKE_CURRENT_LIST_DIR}/FindNCCL.cmake"
    DESTINATION "${RLPT_CMAKE_DIR}")

  configure_file("${CMAKE_CURRENT_LIST_DIR}/rlpt.pc.in" "${PROJECT_BINARY_DIR}/rlpt.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/rlpt.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")
  install(FILES LICENSE README.md DESTINATION "${CMAKE_INSTALL_DOCDIR}")
endif()
