// The one msgpack frame codec of the bulk paths (storage bulk frames, expert-parallel
// frames): a frame is one msgpack array of a fixed number of fields; bins are written from
// the caller's memory and read in place (no copy until the caller asks for one). Bytes come
// from other processes: every failure is an error naming the frame kind and the field.
// Only the two codecs include this header (msgpack stays out of everything else).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <msgpack.hpp>

namespace shoal::runtime {

// What a msgpack::packer writes into. write() is out of line: inlined into a packer's
// constant-size writes, GCC 12 at -O3 warns falsely (-Wstringop-overflow on vector::insert,
// -Warray-bounds on resize) about the vector's growth.
struct frame_sink {
  std::vector<uint8_t> bytes;
  void write(const char* p, size_t n);
};
using frame_packer = msgpack::packer<frame_sink>;

// `count` values of T as one bin (little-endian, as this machine holds them).
template <class T>
void pack_bin_of(frame_packer& pk, const T* data, size_t count) {
  const size_t bytes = count * sizeof(T);
  pk.pack_bin(static_cast<uint32_t>(bytes));
  pk.pack_bin_body(reinterpret_cast<const char*>(data), static_cast<uint32_t>(bytes));
}

// A received frame's fields with checked access. The first failure sticks: later reads
// return nothing and error() names that first one ("<kind> frame field 3 (step) is ...").
class frame_fields {
 public:
  frame_fields(std::span<const uint8_t> bytes, uint32_t count, std::string kind);
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  std::optional<uint64_t> uint(uint32_t i, const char* name);
  // Unsigned field `i`, required to equal `expect` when given, and to be at most `max`.
  bool uint(uint32_t i, const char* name, uint64_t& value, std::optional<uint64_t> expect,
            uint64_t max = UINT64_MAX);
  std::optional<std::string_view> str(uint32_t i, const char* name);
  std::optional<std::span<const uint8_t>> bin(uint32_t i, const char* name);
  // Bin field `i` holding exactly `count` values of T, copied into `out`.
  template <class T>
  bool bin_of(uint32_t i, const char* name, uint64_t count, std::vector<T>& out) {
    auto b = bin(i, name);
    if (!b) return false;
    if (b->size() != count * sizeof(T)) {
      fail(field(i, name) + " has " + std::to_string(b->size()) + " bytes, expected " +
           std::to_string(count * sizeof(T)));
      return false;
    }
    out.resize(count);
    if (count > 0) std::memcpy(out.data(), b->data(), b->size());
    return true;
  }
  // Marks the frame bad: "<kind> frame <why>" (the first failure only).
  void fail(const std::string& why);

 private:
  static std::string field(uint32_t i, const char* name);
  std::string kind_;
  std::string error_;
  msgpack::object_handle handle_;
  const msgpack::object* fields_ = nullptr;
};

}  // namespace shoal::runtime
