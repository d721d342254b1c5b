// CRC32C through ISA-L (crc32c.hpp). ISA-L's crc32_iscsi runs the raw register without the
// standard pre/post inversion, so the standard CRC is ~crc32_iscsi(p, n, ~seed).
#include "storage/crc32c.hpp"

#include <isa-l/crc.h>

#include <algorithm>

namespace shoal::storage {

uint32_t crc32c(const void* data, size_t n, uint32_t seed) {
  constexpr size_t max_piece = size_t{1} << 30;  // crc32_iscsi's length is an int
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));  // ISA-L only reads it
  uint32_t reg = ~seed;
  while (n > 0) {
    const size_t piece = std::min(n, max_piece);
    reg = crc32_iscsi(p, static_cast<int>(piece), reg);
    p += piece;
    n -= piece;
  }
  return ~reg;
}

}  // namespace shoal::storage
