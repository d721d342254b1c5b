// The vision encoder of MODEL.md §2, a small ViT: an RGB image (width and height multiples of
// vision.patch_size, at most vision.image_size) → patches → linear patch embedding + learned
// position embedding → vision.layers pre-norm blocks (LayerNorm, full bidirectional
// attention over the image's patches, GELU MLP of width 4·Dv) → LayerNorm → 2-layer projector
// (Linear Dv→d, GELU, Linear d→d). Its rows, one per patch in row-major patch order, replace
// the image's placeholder tokens in the prompt (forward_item::inputs). Names and the exact
// arithmetic: model/README.md "Vision".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/weights.hpp"

namespace shoal::model {

// Placeholder tokens (= patches) of a width × height image.
int64_t image_tokens(const vision_config& v, int64_t width, int64_t height);

// Empty when the image fits the encoder (sides positive multiples of patch_size, at most
// image_size, rgb.size() == width·height·3); else what is wrong.
std::string check_image(const vision_config& v, int64_t width, int64_t height, size_t rgb_bytes);

// (image_tokens, hidden_size) rows for `rgb` ((height, width, 3) bytes, row-major); pixels
// enter as v / 127.5 − 1. One image per call: attention never crosses images. With
// batch_invariant the GEMMs are the fixed-order kernels (same rows whatever else runs).
// The image must pass check_image (asserted).
std::vector<float> encode_image(const model_weights& w, std::span<const uint8_t> rgb, int64_t width,
                                int64_t height, bool batch_invariant);

}  // namespace shoal::model
