// Error values of the model layer. Every failure to read outside input (checkpoint files,
// config.json, tokenizer.json) carries a message that names the file and the field or
// offset, so an operator can fix the input without a debugger.
#pragma once

#include <expected>
#include <string>
#include <string_view>

namespace shoal::model {

enum class errc {
  io,               // file missing, unreadable, mmap failed
  bad_json,         // not JSON, or a field of the wrong type
  missing_field,    // a required field or tensor is absent
  bad_value,        // a field has a value outside its domain
  bad_shape,        // tensor shape differs from what the config implies
  bad_dtype,        // tensor dtype not supported or not allowed here
  truncated,        // file shorter than its header says
  unsupported,      // valid input this build does not handle (e.g. unknown model_type)
};

std::string_view to_string(errc e);

struct error {
  errc code;
  std::string message;  // names the file and the field/offset
};

template <class T>
using result = std::expected<T, error>;

inline std::unexpected<error> fail(errc code, std::string message) {
  return std::unexpected<error>(error{code, std::move(message)});
}

}  // namespace shoal::model
