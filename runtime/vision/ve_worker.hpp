// A vision-encoder worker's state (the ve role; actors/ve_actors.hpp is its actor): it runs
// the encoder over the images a VE balancer sends and keeps each image's rows registered
// with its transport, in an embedding cache bounded in bytes (least recently used out
// first), so a prefill engine reads them one-sidedly and a repeated image skips the encoder.
// Rows evicted before an engine read them fail that read's checksum or key: the engine then
// encodes the image itself (runtime::engine::add_request).
#pragma once

#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/vision/embedding_cache.hpp"
#include "runtime/vision/prompt_image.hpp"
#include "runtime/base/transport.hpp"

namespace shoal::model {
struct model_weights;
}

namespace shoal::runtime {

struct ve_worker_counters {
  uint64_t jobs = 0, images_encoded = 0, patches_encoded = 0, cache_hits = 0;
  double encode_s = 0;
  embedding_cache_stats cache;
};

class ve_worker {
 public:
  // weights: a checkpoint with a vision encoder (asserted); bulk: where the rows are
  // registered. batch_invariant as the engines it serves (the same rows as theirs).
  ve_worker(std::shared_ptr<const model::model_weights> weights, std::shared_ptr<transport> bulk,
            int64_t cache_bytes, bool batch_invariant);

  // Checks every image first (pixels fit the encoder, hash matches them: they come from
  // another process) and names the first bad one; then the rows' ranges, one per image, in
  // order. Nothing is encoded or kept for a refused job.
  // A refused image is the request's fault (bad_input: answer it with an error); a failed
  // registration is this worker's (another worker may take the job).
  struct encode_error {
    bool bad_input = true;
    std::string message;
  };
  std::expected<std::vector<remote_memory>, encode_error> encode(std::span<const prompt_image> images);
  ve_worker_counters stats() const;

 private:
  std::shared_ptr<const model::model_weights> weights_;
  std::shared_ptr<transport> bulk_;
  bool batch_invariant_;
  embedding_cache cache_;
  // The registration of every cached entry (dropped with the entry).
  std::map<embedding_cache::key, std::pair<embedding_cache::rows, std::unique_ptr<registered_memory>>> regs_;
  ve_worker_counters counters_;
};

}  // namespace shoal::runtime
