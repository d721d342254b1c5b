// An image's key in a prompt: where its placeholder tokens are and its content hash, the extra
// key of the blocks it spans (ARCHITECTURE.md "Keys"). runtime/vision/prompt_image.hpp carries
// the pixels beside it.
#pragma once

#include <array>
#include <cstdint>

namespace shoal::runtime {

struct image_key {
  int64_t pos = 0;                  // first placeholder token
  int64_t count = 0;                // placeholder tokens
  std::array<uint64_t, 2> hash{};   // image_content_hash (lo, hi)
};

}  // namespace shoal::runtime
