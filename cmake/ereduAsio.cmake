# eredu::asio: standalone Asio (Debian's libasio-dev, header-only) with the definitions eredu's
# headers are compiled with. An IMPORTED target, so that it is never exported: the build
# includes this file from the top-level CMakeLists.txt, and the installed package from
# ereduConfig.cmake, and both get the same definitions (a consumer must see Asio configured
# as the library was).
if(TARGET eredu::asio)
  return()
endif()
find_package(Threads REQUIRED)
find_path(EREDU_ASIO_INCLUDE_DIR asio.hpp REQUIRED DOC "directory of standalone Asio's asio.hpp")
# The build tree needs it in every directory (EREDU_ASIO_GLOBAL=GLOBAL); a consumer, like
# every imported target of a package, in the directory that found the package.
add_library(eredu::asio INTERFACE IMPORTED ${EREDU_ASIO_GLOBAL})
set_target_properties(eredu::asio PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${EREDU_ASIO_INCLUDE_DIR}"
  # Asio 1.22 only detects coroutines on clang through <experimental/coroutine>; clang 14
  # implements C++20 coroutines with libstdc++'s <coroutine> fine once told so.
  INTERFACE_COMPILE_DEFINITIONS
    "ASIO_STANDALONE;ASIO_NO_DEPRECATED;$<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_CO_AWAIT=1>;$<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_STD_COROUTINE=1>"
  INTERFACE_LINK_LIBRARIES Threads::Threads)
