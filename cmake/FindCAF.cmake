# Finds the C++ Actor Framework (CAF 0.17, Debian's libcaf-dev), which ships no CMake config file.
# Looks for caf/all.hpp and the caf_core / caf_io libraries (caf_openssl when present), reads
# CAF_VERSION from caf/config.hpp (1706 = 0.17.6) and defines the imported targets CAF::core,
# CAF::io and, when found, CAF::openssl. Sets CAF_FOUND, CAF_VERSION, CAF_INCLUDE_DIR.
include(FindPackageHandleStandardArgs)

find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY NAMES caf_core)
find_library(CAF_IO_LIBRARY NAMES caf_io)
find_library(CAF_OPENSSL_LIBRARY NAMES caf_openssl)
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY)

# CAF_VERSION is MAJOR * 10000 + MINOR * 100 + PATCH.
if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" caf_version_line
       REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CAF_VERSION ([0-9]+).*" "\\1" caf_version_number "${caf_version_line}")
  if(caf_version_number)
    math(EXPR caf_major "${caf_version_number} / 10000")
    math(EXPR caf_minor "(${caf_version_number} / 100) % 100")
    math(EXPR caf_patch "${caf_version_number} % 100")
    set(CAF_VERSION "${caf_major}.${caf_minor}.${caf_patch}")
  endif()
endif()

set(CAF_openssl_FOUND FALSE)
if(CAF_OPENSSL_LIBRARY)
  set(CAF_openssl_FOUND TRUE)
endif()
set(CAF_core_FOUND FALSE)
set(CAF_io_FOUND FALSE)
if(CAF_CORE_LIBRARY)
  set(CAF_core_FOUND TRUE)
endif()
if(CAF_IO_LIBRARY)
  set(CAF_io_FOUND TRUE)
endif()

find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY
  VERSION_VAR CAF_VERSION
  HANDLE_COMPONENTS)

if(CAF_FOUND)
  find_package(Threads REQUIRED)
  if(NOT TARGET CAF::core)
    add_library(CAF::core UNKNOWN IMPORTED)
    set_target_properties(CAF::core PROPERTIES
      IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES Threads::Threads)
  endif()
  if(NOT TARGET CAF::io)
    add_library(CAF::io UNKNOWN IMPORTED)
    set_target_properties(CAF::io PROPERTIES
      IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::core)
  endif()
  if(CAF_OPENSSL_LIBRARY AND NOT TARGET CAF::openssl)
    add_library(CAF::openssl UNKNOWN IMPORTED)
    set_target_properties(CAF::openssl PROPERTIES
      IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::io)
  endif()
endif()
