// An image of a prompt as the engine tracks it: where its placeholder tokens are, its
// content hash (the extra key of the blocks it is in: ARCHITECTURE.md "Keys") and its pixels,
// already fit to the encoder's patches (runtime/vision/image.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/block_key.hpp"
#include "runtime/base/transport.hpp"

namespace shoal::model {
struct vision_config;
}

namespace shoal::runtime {

struct rgb_image;

struct prompt_image {
  int64_t pos = 0;     // first placeholder token
  int64_t count = 0;   // placeholder tokens (= patches)
  std::array<uint64_t, 2> hash{};         // image_content_hash of `pixels` (lo, hi)
  std::shared_ptr<const rgb_image> pixels;
  // Where a vision-encoder worker left this image's encoder rows ((count, hidden_size) floats,
  // registered with its transport); an empty owner when none did. An engine with a transport
  // reads them instead of running the encoder (a failed read: it encodes the pixels itself).
  remote_memory rows;
  // The same placement, hash, rows and pixels (no pixels and an empty image alike).
  friend bool operator==(const prompt_image& a, const prompt_image& b);
};

// Empty when `images` fit `prompt` and the encoder: in order, not overlapping, inside the
// prompt, each over `count` copies of the image token with count = its patches, pixels
// present, fit to the encoder and hashing to `hash`; else what is wrong (the images come from
// another process: the hash is recomputed).
// The keys of `images` (runtime/base/image_key.hpp), and the chain keys of a prompt with them
// (runtime/core/block_pool.hpp chain_keys).
std::vector<image_key> image_keys(std::span<const prompt_image> images);
std::vector<block_key> chain_keys(std::span<const int32_t> tokens, int block_size,
                                  std::span<const prompt_image> images);

std::string check_prompt_images(const model::vision_config& v, std::span<const int32_t> prompt,
                                std::span<const prompt_image> images);

}  // namespace shoal::runtime
