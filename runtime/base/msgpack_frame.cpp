#include "runtime/base/msgpack_frame.hpp"

namespace shoal::runtime {

void frame_sink::write(const char* p, size_t n) {
  if (n == 0) return;  // an empty bin body comes with a null pointer
  const size_t at = bytes.size();
  bytes.resize(at + n);
  std::memcpy(bytes.data() + at, p, n);
}

frame_fields::frame_fields(std::span<const uint8_t> bytes, uint32_t count, std::string kind) : kind_(std::move(kind)) {
  if (bytes.empty()) {
    fail("is empty");
    return;
  }
  try {
    // Bins stay in `bytes`; a small structure: one array of scalars and bins, no maps, depth 2.
    auto ref_bins = [](msgpack::type::object_type t, size_t, void*) { return t == msgpack::type::BIN; };
    msgpack::unpack_limit limit(64, 0, 256, bytes.size(), 0, 2);
    size_t off = 0;
    handle_ = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size(), off, ref_bins, nullptr, limit);
    if (off != bytes.size()) {
      fail("has " + std::to_string(bytes.size() - off) + " trailing byte(s)");
      return;
    }
  } catch (const std::exception& e) {
    fail(std::string("is not valid msgpack (") + e.what() + ")");
    return;
  }
  const msgpack::object& o = handle_.get();
  if (o.type != msgpack::type::ARRAY)
    fail("is not a msgpack array of " + std::to_string(count) + " fields");
  else if (o.via.array.size != count)
    fail("has " + std::to_string(o.via.array.size) + " fields, expected " + std::to_string(count));
  else
    fields_ = o.via.array.ptr;
}

std::string frame_fields::field(uint32_t i, const char* name) {
  return "field " + std::to_string(i) + " (" + name + ")";
}

void frame_fields::fail(const std::string& why) {
  if (ok()) error_ = kind_ + " frame " + why;
}

std::optional<uint64_t> frame_fields::uint(uint32_t i, const char* name) {
  if (!ok()) return std::nullopt;
  if (fields_[i].type != msgpack::type::POSITIVE_INTEGER) {
    fail(field(i, name) + " is not an unsigned integer");
    return std::nullopt;
  }
  return fields_[i].via.u64;
}

bool frame_fields::uint(uint32_t i, const char* name, uint64_t& value, std::optional<uint64_t> expect, uint64_t max) {
  auto v = uint(i, name);
  if (!v) return false;
  value = *v;
  if (expect && value != *expect) {
    fail(field(i, name) + " is " + std::to_string(value) + ", expected " + std::to_string(*expect));
    return false;
  }
  if (value > max) {
    fail(field(i, name) + " is " + std::to_string(value) + ", above the limit " + std::to_string(max));
    return false;
  }
  return true;
}

std::optional<std::string_view> frame_fields::str(uint32_t i, const char* name) {
  if (!ok()) return std::nullopt;
  if (fields_[i].type != msgpack::type::STR) {
    fail(field(i, name) + " is not a string");
    return std::nullopt;
  }
  return std::string_view(fields_[i].via.str.ptr, fields_[i].via.str.size);
}

std::optional<std::span<const uint8_t>> frame_fields::bin(uint32_t i, const char* name) {
  if (!ok()) return std::nullopt;
  if (fields_[i].type != msgpack::type::BIN) {
    fail(field(i, name) + " is not a bin");
    return std::nullopt;
  }
  return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(fields_[i].via.bin.ptr), fields_[i].via.bin.size);
}

}  // namespace shoal::runtime
