// Names of the model layer's error codes, for logs and error replies. The message carried
// beside the code (see error.hpp) says which file and field failed; this only names the kind.
#include "model/error.hpp"

namespace shoal::model {

std::string_view to_string(errc e) {
  switch (e) {
    case errc::io: return "io";
    case errc::bad_json: return "bad_json";
    case errc::missing_field: return "missing_field";
    case errc::bad_value: return "bad_value";
    case errc::bad_shape: return "bad_shape";
    case errc::bad_dtype: return "bad_dtype";
    case errc::truncated: return "truncated";
    case errc::unsupported: return "unsupported";
  }
  return "unknown";
}

}  // namespace shoal::model
