# libtetra for embedders: one target, tetra::engine (the model families, the CPU backend, the
# tokenizer, the runtime with its batching engine), in the build tree and after
# `cmake --install build --prefix P` through find_package(tetra) with CMAKE_PREFIX_PATH=P.
# The HTTP server and the CLI stay out of it.
set(tetra_engine_libs tetra_core tetra_formats tetra_tokenizer tetra_ops tetra_parallel tetra_model tetra_runtime)
if(TARGET tetra_ops_cuda)  # the CUDA backend, behind ops::make_backend
  list(APPEND tetra_engine_libs tetra_ops_cuda)
endif()
foreach(lib ${tetra_engine_libs})
  if(NOT TARGET ${lib})
    message(STATUS "tetra: ${lib} is not built, so libtetra (tetra::engine) is not packaged")
    return()
  endif()
endforeach()

add_library(tetra_engine INTERFACE)
add_library(tetra::engine ALIAS tetra_engine)
target_link_libraries(tetra_engine INTERFACE ${tetra_engine_libs})
set_target_properties(tetra_engine PROPERTIES EXPORT_NAME engine)  # tetra::engine when installed

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS ${tetra_engine_libs} tetra_engine EXPORT tetraTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# Headers keep their module paths ("runtime/engine.h"), under include/tetra.
foreach(dir core formats tokenizer ops parallel model runtime)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/${dir} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tetra
          FILES_MATCHING PATTERN "*.h" PATTERN "cuda" EXCLUDE)
endforeach()
install(EXPORT tetraTargets NAMESPACE tetra:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tetra)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tetraConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/tetraConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tetra)
install(FILES ${PROJECT_BINARY_DIR}/tetraConfig.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tetra)
