#include "runtime/vision/prompt_image.hpp"

#include "model/config.hpp"
#include "model/vision.hpp"
#include "runtime/vision/image.hpp"

namespace shoal::runtime {

bool operator==(const prompt_image& a, const prompt_image& b) {
  const rgb_image none;
  return a.pos == b.pos && a.count == b.count && a.hash == b.hash && a.rows == b.rows &&
         (a.pixels ? *a.pixels : none) == (b.pixels ? *b.pixels : none);
}

std::vector<image_key> image_keys(std::span<const prompt_image> images) {
  std::vector<image_key> keys;
  keys.reserve(images.size());
  for (const auto& im : images) keys.push_back(image_key{im.pos, im.count, im.hash});
  return keys;
}

std::vector<block_key> chain_keys(std::span<const int32_t> tokens, int block_size,
                                  std::span<const prompt_image> images) {
  const std::vector<image_key> keys = image_keys(images);
  return chain_keys(tokens, block_size, std::span<const image_key>(keys));
}

std::string check_prompt_images(const model::vision_config& v, std::span<const int32_t> prompt,
                                std::span<const prompt_image> images) {
  if (images.empty()) return "";
  if (!v.present) return "the model has no vision encoder; the request carries " + std::to_string(images.size()) + " images";
  int64_t end = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const prompt_image& im = images[i];
    const std::string which = "image " + std::to_string(i + 1);
    if (!im.pixels) return which + " has no pixels";
    if (auto e = model::check_image(v, im.pixels->width, im.pixels->height, im.pixels->rgb.size()); !e.empty())
      return which + ": " + e;
    const int64_t n = model::image_tokens(v, im.pixels->width, im.pixels->height);
    if (im.count != n) return which + " spans " + std::to_string(im.count) + " tokens; its " + std::to_string(n) + " patches need as many";
    if (im.pos < end || im.pos + im.count > static_cast<int64_t>(prompt.size()))
      return which + " at tokens [" + std::to_string(im.pos) + ", " + std::to_string(im.pos + im.count) +
             ") overlaps the image before it or runs past the prompt (" + std::to_string(prompt.size()) + " tokens)";
    for (int64_t t = im.pos; t < im.pos + im.count; ++t)
      if (prompt[static_cast<size_t>(t)] != v.image_token_id)
        return which + ": prompt token " + std::to_string(t) + " is " + std::to_string(prompt[static_cast<size_t>(t)]) +
               ", not the image token " + std::to_string(v.image_token_id);
    if (image_content_hash(*im.pixels) != im.hash) return which + ": its pixels do not hash to the hash it carries";
    end = im.pos + im.count;
  }
  return "";
}

}  // namespace shoal::runtime
