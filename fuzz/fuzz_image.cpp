// libFuzzer target: an image as the gateway receives it in a chat message: a data URL
// (runtime/image decode_data_url), then the PNG or JPEG inside (decode_image), then the
// resize to the encoder's patches. The first byte picks whether the input is the URL text or
// the file's bytes. A decoded image has the size its header gave, within the pixel limit.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "runtime/vision/image.hpp"

namespace {

void check_image(std::span<const uint8_t> bytes, const shoal::runtime::image_limits& limits) {
  using namespace shoal::runtime;
  auto img = decode_image(bytes, limits);
  if (!img) {
    if (img.error().message.empty()) std::abort();
    return;
  }
  if (img->width <= 0 || img->height <= 0 || img->width * img->height > limits.max_pixels ||
      img->rgb.size() != static_cast<size_t>(img->width * img->height * 3))
    std::abort();
  auto [w, h] = fit_to_patches(img->width, img->height, 56, 14);
  if (w > 0 && h > 0) (void)resize_area(*img, w, h);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::runtime;
  if (size < 1) return 0;
  image_limits limits;
  limits.max_bytes = 1 << 20;
  limits.max_pixels = 1 << 18;  // bounds the decode work of one input
  if (data[0] & 1) {
    auto bytes = decode_data_url(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), limits);
    if (!bytes) {
      if (bytes.error().message.empty()) std::abort();
      return 0;
    }
    check_image(*bytes, limits);
  } else {
    check_image(std::span<const uint8_t>(data + 1, size - 1), limits);
  }
  return 0;
}
