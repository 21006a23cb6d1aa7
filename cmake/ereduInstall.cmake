# Installs eredu's libraries, headers, CMake package and pkg-config files (included from the
# top-level CMakeLists.txt). What a consumer gets is described in docs/package.md:
#   find_package(eredu REQUIRED)                    eredu::eredu (core, io, engine, cpu, app), eredu::synth
#   find_package(eredu REQUIRED COMPONENTS cuda)    also eredu::cuda (needs the CUDA toolkit)
#   find_package(eredu REQUIRED COMPONENTS mpi)     also eredu::mpi (needs MPI)
#   find_package(eredu REQUIRED COMPONENTS nccl)    also eredu::nccl, eredu::cuda, eredu::mpi (needs all three)
#   pkg-config --cflags --libs eredu [eredu-synth] [eredu-cuda] [eredu-mpi] [eredu-nccl]
# Exported: the libraries only. eredu_build_flags (warnings, -Werror, sanitizers) is linked
# as $<BUILD_INTERFACE:...> and never leaves the build tree; eredu::asio is an imported
# target that ereduConfig.cmake recreates from cmake/ereduAsio.cmake.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(EREDU_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/eredu)

install(TARGETS eredu eredu_core eredu_io eredu_engine eredu_cpu eredu_app eredu_synth EXPORT eredu-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY core/include/ engine/include/ io/include/ backends/cpu/include/ app/include/ tools/synth/include/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT eredu-targets NAMESPACE eredu:: DESTINATION ${EREDU_INSTALL_CMAKEDIR})
# eredu::cuda in an export set of its own, included only when a consumer asks for the cuda
# component: a consumer without the CUDA toolkit can still use everything else.
if(EREDU_CUDA_ENABLED)
  install(TARGETS eredu_cuda EXPORT eredu-cuda-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY backends/cuda/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT eredu-cuda-targets NAMESPACE eredu:: DESTINATION ${EREDU_INSTALL_CMAKEDIR})
endif()
# eredu::mpi (collectives for CPU ranks) likewise in its own export set, included only for the
# mpi component: MPI is then a dependency of that component alone.
if(EREDU_MPI_ENABLED)
  install(TARGETS eredu_mpi EXPORT eredu-mpi-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY backends/mpi/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT eredu-mpi-targets NAMESPACE eredu:: DESTINATION ${EREDU_INSTALL_CMAKEDIR})
endif()
# eredu::nccl (collectives for GPU ranks) needs both of the above; NCCL itself is the imported
# target eredu::libnccl, which ereduConfig.cmake recreates from cmake/ereduNCCL.cmake.
if(EREDU_NCCL_ENABLED)
  install(TARGETS eredu_nccl EXPORT eredu-nccl-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY backends/nccl/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT eredu-nccl-targets NAMESPACE eredu:: DESTINATION ${EREDU_INSTALL_CMAKEDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/ereduNCCL.cmake DESTINATION ${EREDU_INSTALL_CMAKEDIR})
endif()
configure_package_config_file(cmake/ereduConfig.cmake.in ${PROJECT_BINARY_DIR}/ereduConfig.cmake
                              INSTALL_DESTINATION ${EREDU_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ereduConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ereduConfig.cmake ${PROJECT_BINARY_DIR}/ereduConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/ereduAsio.cmake
        DESTINATION ${EREDU_INSTALL_CMAKEDIR})

# --- pkg-config ---
# Relocatable, like the CMake package: the prefix is found from the .pc file's own place, so
# `cmake --install --prefix P` (not only CMAKE_INSTALL_PREFIX) gives working files.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(EREDU_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _eredu_pc_up "/eredu/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/eredu")
  string(REGEX REPLACE "/$" "" _eredu_pc_up "${_eredu_pc_up}")
  set(EREDU_PC_PREFIX "\${pcfiledir}/${_eredu_pc_up}")
endif()
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(EREDU_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(EREDU_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
# Static libraries carry no record of their own dependencies: their consumers link liburing,
# libxxhash, libcrypto and libcurl (eredu::io's reader, digests and remote sources) themselves, so they are public
# requirements unless eredu is built shared.
set(_eredu_pc_io_deps "liburing >= 2.0, libxxhash, libcrypto >= 3, libcurl >= 7.80")
if(BUILD_SHARED_LIBS)
  set(EREDU_PC_REQUIRES "fmt >= 9, tbb")
  set(EREDU_PC_REQUIRES_PRIVATE "${_eredu_pc_io_deps}")
else()
  set(EREDU_PC_REQUIRES "fmt >= 9, tbb, ${_eredu_pc_io_deps}")
  set(EREDU_PC_REQUIRES_PRIVATE "")
endif()
set(EREDU_PC_ASIO_CFLAGS "")
if(NOT EREDU_ASIO_INCLUDE_DIR STREQUAL "/usr/include")
  set(EREDU_PC_ASIO_CFLAGS " -I${EREDU_ASIO_INCLUDE_DIR}")
endif()
set(EREDU_PC_FILES eredu eredu-synth)
if(EREDU_CUDA_ENABLED)
  list(APPEND EREDU_PC_FILES eredu-cuda)
  set(EREDU_PC_CUDA_INCLUDE "${CUDAToolkit_INCLUDE_DIRS}")
  list(JOIN EREDU_PC_CUDA_INCLUDE " -I" EREDU_PC_CUDA_INCLUDE)
  set(EREDU_PC_CUDA_LIBDIR "${CUDAToolkit_LIBRARY_DIR}")
endif()
if(EREDU_MPI_ENABLED)
  # MPI's own pkg-config names differ between implementations (ompi-cxx, mpich), so the .pc
  # carries what FindMPI found: its include directories, definitions and libraries.
  list(APPEND EREDU_PC_FILES eredu-mpi)
  set(EREDU_PC_MPI_CFLAGS "")
  foreach(dir IN LISTS MPI_CXX_INCLUDE_DIRS)
    string(APPEND EREDU_PC_MPI_CFLAGS " -I${dir}")
  endforeach()
  foreach(def IN LISTS MPI_CXX_COMPILE_DEFINITIONS)
    string(APPEND EREDU_PC_MPI_CFLAGS " -D${def}")
  endforeach()
  foreach(opt IN LISTS MPI_CXX_COMPILE_OPTIONS)
    string(APPEND EREDU_PC_MPI_CFLAGS " ${opt}")
  endforeach()
  list(JOIN MPI_CXX_LIBRARIES " " EREDU_PC_MPI_LIBS)
endif()
if(EREDU_NCCL_ENABLED)
  list(APPEND EREDU_PC_FILES eredu-nccl)
  get_filename_component(EREDU_PC_NCCL_LIBDIR "${EREDU_NCCL_LIBRARY}" DIRECTORY)
endif()
foreach(pc IN LISTS EREDU_PC_FILES)
  configure_file(cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
