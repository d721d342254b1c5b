// Names of storage/ error codes (error.hpp), used in logs and in replies to other processes.
#include "storage/error.hpp"

namespace shoal::storage {

const char* to_string(errc e) {
  switch (e) {
    case errc::bad_params: return "bad_params";
    case errc::bad_format: return "bad_format";
    case errc::bad_size: return "bad_size";
    case errc::bad_checksum: return "bad_checksum";
    case errc::mismatch: return "mismatch";
    case errc::unrecoverable: return "unrecoverable";
  }
  return "?";
}

std::string to_string(const error& e) {
  std::string out = to_string(e.code);
  if (!e.message.empty()) out += ": " + e.message;
  return out;
}

}  // namespace shoal::storage
