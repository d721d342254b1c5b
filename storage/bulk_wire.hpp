// Inside the bulk data path: what its codec, server and client share (not for other users;
// bulk.hpp is the interface).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "storage/bulk.hpp"

namespace shoal::storage {

constexpr uint64_t max_reply_frame = 1ull << 30;  // what a client accepts from a node

std::string errno_text(int e);
uint32_t get_be32(const uint8_t* p);
// Writes the 4-byte length, `head`, then `tail` (the bin body) from one gathered iovec, no
// copy; false on any error (errno set).
bool send_frame(int fd, std::span<const uint8_t> head, std::span<const uint8_t> tail);
// A reply's head: everything up to its payload's bin body (sent after it, uncopied).
std::vector<uint8_t> encode_reply_head(const bulk_reply& r, size_t payload_bytes);

}  // namespace shoal::storage
