// Encoding, naming and POSIX helpers for chunk files (format in chunk_file.hpp). Kept apart from
// the store so the format can be tested byte for byte and read by tools without a store.
#include "storage/chunk_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <isa-l/crc.h>

namespace shoal::storage {

namespace {

template <class T>
void put_at(std::byte* base, size_t off, T v) {
  std::memcpy(base + off, &v, sizeof v);
}
template <class T>
T get_at(const std::byte* base, size_t off) {
  T v;
  std::memcpy(&v, base + off, sizeof v);
  return v;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<uint64_t> parse_hex(std::string_view s) {
  uint64_t v = 0;
  for (char c : s) {
    const int d = hex_digit(c);
    if (d < 0) return std::nullopt;
    v = (v << 4) | uint64_t(d);
  }
  return v;
}

}  // namespace

std::string to_string(const chunk_key& k) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx-%02x", (unsigned long long)k.block.hi,
                (unsigned long long)k.block.lo, unsigned(k.index));
  return buf;
}

uint32_t crc32c(std::span<const std::byte> bytes) {
  return ~crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<std::byte*>(bytes.data())),
                      int(bytes.size()), ~0u);
}

std::array<std::byte, file_header_bytes> encode_header(const chunk_header& h) {
  std::array<std::byte, file_header_bytes> b{};
  std::byte* p = b.data();
  put_at<uint32_t>(p, 0, file_magic);
  put_at<uint16_t>(p, 4, file_version);
  put_at<uint8_t>(p, 6, uint8_t(h.cls));
  put_at<uint8_t>(p, 7, h.key.index);
  put_at<uint64_t>(p, 8, h.key.block.hi);
  put_at<uint64_t>(p, 16, h.key.block.lo);
  put_at<int64_t>(p, 24, h.put_ms);
  put_at<uint64_t>(p, 32, h.payload_bytes);
  put_at<uint32_t>(p, 40, h.payload_crc);
  put_at<uint32_t>(p, 44, crc32c(std::span(b).first(44)));
  return b;
}

std::optional<chunk_header> decode_header(std::span<const std::byte, file_header_bytes> b) {
  const std::byte* p = b.data();
  if (get_at<uint32_t>(p, 0) != file_magic || get_at<uint16_t>(p, 4) != file_version)
    return std::nullopt;
  if (get_at<uint32_t>(p, 44) != crc32c(b.first(44))) return std::nullopt;
  const auto cls = traffic_class_from_byte(get_at<uint8_t>(p, 6));
  if (!cls) return std::nullopt;
  chunk_header h;
  h.cls = *cls;
  h.key.index = get_at<uint8_t>(p, 7);
  h.key.block.hi = get_at<uint64_t>(p, 8);
  h.key.block.lo = get_at<uint64_t>(p, 16);
  h.put_ms = get_at<int64_t>(p, 24);
  h.payload_bytes = get_at<uint64_t>(p, 32);
  h.payload_crc = get_at<uint32_t>(p, 40);
  return h;
}

std::string shard_dir(const std::string& root, int shard) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%02x", unsigned(shard));
  return root + "/chunks/" + buf;
}

int shard_of(const chunk_key& k) { return int(k.block.hi >> 56); }

std::string chunk_path(const std::string& root, const chunk_key& k) {
  return shard_dir(root, shard_of(k)) + "/" + to_string(k) + std::string(chunk_suffix);
}

std::optional<chunk_key> parse_chunk_name(std::string_view name) {
  // 32 hex + '-' + 2 hex + ".chk"
  if (name.size() != 35 + chunk_suffix.size() || !name.ends_with(chunk_suffix) || name[32] != '-')
    return std::nullopt;
  const auto hi = parse_hex(name.substr(0, 16));
  const auto lo = parse_hex(name.substr(16, 16));
  const auto idx = parse_hex(name.substr(33, 2));
  if (!hi || !lo || !idx) return std::nullopt;
  return chunk_key{runtime::block_key{.lo = *lo, .hi = *hi}, uint8_t(*idx)};
}

namespace {

// Repeats `op` (::read or ::write) until all `n` bytes moved: 0, errno, or EIO when it moved 0.
template <class Ptr, class Op>
int move_all(int fd, Ptr p, size_t n, Op op) {
  size_t done = 0;
  while (done < n) {
    const ssize_t k = op(fd, p + done, n - done);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (k == 0) return EIO;
    done += size_t(k);
  }
  return 0;
}

}  // namespace

int write_all(int fd, std::span<const std::byte> bytes) { return move_all(fd, bytes.data(), bytes.size(), ::write); }

int read_all(int fd, std::span<std::byte> bytes) { return move_all(fd, bytes.data(), bytes.size(), ::read); }

int fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

}  // namespace shoal::storage
