#include "runtime/vision/ve_worker.hpp"

#include <chrono>

#include "kernels/assert.hpp"
#include "model/vision.hpp"
#include "model/weights.hpp"
#include "runtime/vision/image.hpp"

namespace shoal::runtime {

ve_worker::ve_worker(std::shared_ptr<const model::model_weights> weights, std::shared_ptr<transport> bulk,
                     int64_t cache_bytes, bool batch_invariant)
    : weights_(std::move(weights)), bulk_(std::move(bulk)), batch_invariant_(batch_invariant), cache_(cache_bytes) {
  SHOAL_ASSERT(weights_ && weights_->config.vision.present && bulk_);
}

std::expected<std::vector<remote_memory>, ve_worker::encode_error> ve_worker::encode(std::span<const prompt_image> images) {
  const model::vision_config& v = weights_->config.vision;
  auto refuse = [](std::string why) { return std::unexpected(encode_error{true, std::move(why)}); };
  if (images.empty()) return refuse("no images to encode");
  for (size_t i = 0; i < images.size(); ++i) {
    const prompt_image& im = images[i];
    const std::string which = "image " + std::to_string(i + 1);
    if (!im.pixels) return refuse(which + " has no pixels");
    if (auto e = model::check_image(v, im.pixels->width, im.pixels->height, im.pixels->rgb.size()); !e.empty())
      return refuse(which + ": " + e);
    if (im.count != model::image_tokens(v, im.pixels->width, im.pixels->height))
      return refuse(which + " spans " + std::to_string(im.count) + " tokens, not its patches");
    if (image_content_hash(*im.pixels) != im.hash)
      return refuse(which + ": its pixels do not hash to the hash it carries");
  }
  ++counters_.jobs;
  std::vector<remote_memory> out;
  for (const prompt_image& im : images) {
    embedding_cache::rows rows = cache_.get(im.hash);
    if (rows) {
      ++counters_.cache_hits;
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      rows = std::make_shared<const std::vector<float>>(
          model::encode_image(*weights_, im.pixels->rgb, im.pixels->width, im.pixels->height, batch_invariant_));
      counters_.encode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++counters_.images_encoded;
      counters_.patches_encoded += static_cast<uint64_t>(im.count);
      cache_.put(im.hash, rows);
      // Entries the cache let go take their registrations with them (an entry larger than the
      // whole cache is not kept: it stays registered until the next image is encoded).
      std::erase_if(regs_, [&](const auto& kv) { return !cache_.contains(kv.first); });
    }
    auto& reg = regs_[im.hash];
    if (!reg.second) {
      auto r = bulk_->register_memory(std::as_bytes(std::span<const float>(*rows)));
      if (!r) return std::unexpected(encode_error{false, "cannot register the rows of an image: " + r.error()});
      reg = {rows, std::move(*r)};
    }
    out.push_back(reg.second->describe(0, rows->size() * sizeof(float)));
  }
  return out;
}

ve_worker_counters ve_worker::stats() const {
  ve_worker_counters c = counters_;
  c.cache = cache_.stats();
  return c;
}

}  // namespace shoal::runtime
