# Finds the Debian-packaged dependencies shoal uses. Heavy ones (CAF, Beast) are only
# looked up by the folders that need them.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(doctest REQUIRED)
find_package(CLI11 QUIET)
# msgpack-c (Debian libmsgpack-cxx-dev, header-only): config msgpack-config.cmake under
# lib/<arch>/cmake/msgpackc-cxx, target msgpackc-cxx. Frames the EP payloads (runtime/).
find_package(msgpack CONFIG REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(ISAL REQUIRED IMPORTED_TARGET libisal)
if(NOT TARGET CLI11::CLI11)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()
find_package(Python3 COMPONENTS Interpreter)
