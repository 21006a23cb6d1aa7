# Decides whether the CUDA backend is built (EREDU_CUDA = ON | OFF | AUTO) and, if so,
# enables the CUDA language. Included from the top-level CMakeLists.txt at file scope,
# because enable_language() must run in the directory common to every CUDA target.
#
# AUTO builds CUDA only where it is known to work and stay cheap: a g++ host build without
# sanitizers or fuzzing (nvcc's host compiler must match, and sanitizer flags do not pass
# through nvcc), with the toolkit and a working nvcc found — also at /usr/local/cuda when
# nvcc is not on PATH. Anything else prints one status line and skips the backend. ON makes
# a missing toolkit an error; OFF never looks.
set(EREDU_CUDA AUTO CACHE STRING "Build the CUDA backend: ON, OFF or AUTO")
set_property(CACHE EREDU_CUDA PROPERTY STRINGS ON OFF AUTO)
string(TOUPPER "${EREDU_CUDA}" _eredu_cuda_mode)
set(EREDU_CUDA_ENABLED OFF)

if(NOT _eredu_cuda_mode STREQUAL "OFF")
  set(_eredu_cuda_why "")
  if(_eredu_cuda_mode STREQUAL "AUTO")
    if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      set(_eredu_cuda_why "the host compiler is ${CMAKE_CXX_COMPILER_ID}, not g++ (use -DEREDU_CUDA=ON to force)")
    elseif(EREDU_SANITIZE)
      set(_eredu_cuda_why "sanitizers (${EREDU_SANITIZE}) are on")
    elseif(EREDU_FUZZ)
      set(_eredu_cuda_why "this is a fuzzing build")
    endif()
  endif()
  if(NOT _eredu_cuda_why)
    if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND)
      set(_eredu_cuda_why "no CUDA toolkit found")
    elseif(NOT CMAKE_CUDA_COMPILER)
      if(CUDAToolkit_NVCC_EXECUTABLE AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
        set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
      elseif(EXISTS "${CUDAToolkit_BIN_DIR}/nvcc")
        set(CMAKE_CUDA_COMPILER "${CUDAToolkit_BIN_DIR}/nvcc")
      else()
        set(_eredu_cuda_why "the CUDA toolkit ${CUDAToolkit_VERSION} has no nvcc")
      endif()
    endif()
  endif()
  if(NOT _eredu_cuda_why)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Explicit, so no device is needed to configure: A100 (80) and H100/H200 (90).
      set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures of the CUDA backend")
    endif()
    if(NOT CMAKE_CUDA_HOST_COMPILER AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
    endif()
    # Every target's CUDA dialect is C++17 unless it says otherwise: without this, a target
    # that links CUDA objects but sets no CUDA_STANDARD (eredu_cuda, with the kernels'
    # objects) inherits the project's CXX_STANDARD 20, which CMake 3.25 knows no nvcc flag
    # for; the Makefile generators then refuse to generate ("requires the language dialect
    # CUDA20"). Ninja happened not to ask.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    set(EREDU_CUDA_ENABLED ON)
    message(STATUS "eredu: CUDA backend on (CUDA ${CUDAToolkit_VERSION}, nvcc ${CMAKE_CUDA_COMPILER}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_eredu_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "eredu: EREDU_CUDA=ON but ${_eredu_cuda_why}")
  else()
    message(STATUS "eredu: CUDA backend skipped: ${_eredu_cuda_why}")
  endif()
endif()
