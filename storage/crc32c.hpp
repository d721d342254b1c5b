// CRC32C (Castagnoli, the iSCSI polynomial) over bytes, through ISA-L's crc32_iscsi: the
// checksum of every erasure chunk header and payload and of any other storage record that
// crosses a process or touches a disk.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal::storage {

// Standard CRC32C: crc32c("123456789", 9) == 0xE3069283. `seed` is the crc32c of the bytes
// before these ones, so crc32c(b, nb, crc32c(a, na)) == crc32c of a followed by b. Any
// length (ISA-L takes an int; longer inputs are fed in pieces).
uint32_t crc32c(const void* data, size_t n, uint32_t seed = 0);

}  // namespace shoal::storage
