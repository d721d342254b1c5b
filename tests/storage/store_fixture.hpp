// Shared fixtures of the storage tests: a temp directory removed on scope exit, a fake clock, keys
// and payloads derived from keys (so a checker can tell what any writer must have written).
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "storage/chunk_store.hpp"

namespace shoal::storage::test {

struct temp_dir {
  std::string path;
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "shoal-chunks-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

// Shared so a store's clock stays valid however the test copies options around.
struct fake_clock {
  std::shared_ptr<int64_t> t = std::make_shared<int64_t>(1'000'000);
  std::function<int64_t()> fn() const {
    return [t = t] { return *t; };
  }
  void advance(int64_t ms) const { *t += ms; }
  int64_t now() const { return *t; }
};

inline chunk_key key_of(uint64_t i, uint8_t index = 0) {
  // Spread over shards: the top byte of hi varies with i.
  return chunk_key{{.lo = i, .hi = (i * 0x9E3779B97F4A7C15ull) ^ (i << 56)}, index};
}

// Deterministic bytes for (key, version): splitmix64 stream.
inline std::vector<std::byte> payload_of(const chunk_key& k, uint64_t version, size_t n) {
  std::vector<std::byte> out(n);
  uint64_t x = k.block.hi ^ (k.block.lo * 31) ^ (uint64_t(k.index) << 8) ^ (version * 0x632BE59BD9B4E019ull);
  for (size_t i = 0; i < n; ++i) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    out[i] = std::byte(z ^ (z >> 31));
  }
  return out;
}

inline store_options options_for(const temp_dir& d, const fake_clock& c, uint64_t capacity) {
  store_options o;
  o.root = d.path;
  o.capacity_bytes = capacity;
  o.now_ms = c.fn();
  o.sync = sync_policy::never;  // fast; the crash and durability cases ask for always
  return o;
}

inline std::unique_ptr<chunk_store> open_ok(const store_options& o) {
  auto r = chunk_store::open(o);
  if (!r) std::abort();
  return std::move(*r);
}

// Number of files under root whose name starts with prefix (e.g. ".tmp-").
inline int count_files(const std::string& root, const std::string& prefix) {
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.is_regular_file() && e.path().filename().string().starts_with(prefix)) ++n;
  return n;
}

}  // namespace shoal::storage::test
