// Operating errors of storage/ (erasure codec, chunk store, GC): one `errc` per module as in
// STYLE.md, plus `error`, which carries the code and a message naming the field, chunk or
// offset at fault. Bytes in storage come from other processes and disks, so every check on
// them ends here as a value, never as a crash.
#pragma once

#include <cstdint>
#include <string>

namespace shoal::storage {

// Append new codes at the end of their group and add them to to_string(errc) in error.cpp;
// nothing persists or transmits the numeric values, only the names.
enum class errc : uint8_t {
  // -- parameters and chunk bytes (erasure.hpp) --
  bad_params,     // codec k/m outside what the code supports, or a chunk index out of range
  bad_format,     // not a shoal chunk: wrong magic, unknown version, header fields out of range
  bad_size,       // a length disagrees with the buffer or with k (truncated, trailing, absurd)
  bad_checksum,   // header or payload crc32c mismatch (the bytes were damaged)
  mismatch,       // chunks of different codecs or different blocks given to one decode
  unrecoverable,  // fewer than k valid chunks: the block cannot be rebuilt
  // -- chunk store codes go below --
};
const char* to_string(errc e);

struct error {
  errc code = errc::bad_format;
  std::string message;
};

// "bad_checksum: chunk 3: payload crc32c 0x... != header 0x..."
std::string to_string(const error& e);

}  // namespace shoal::storage
