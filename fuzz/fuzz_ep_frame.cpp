// libFuzzer target: expert-parallel frames (runtime/expert_parallel) as a rank decodes them
// from a peer: dispatch (token rows and the experts they go to) and combine (expert outputs).
// The first byte picks the frame kind and the receiving rank of a 4-rank group of 16 experts.
// A dispatch frame that decodes only routes rows it carries to experts this rank owns, at most
// top_k per row; a combine frame that decodes has exactly the rows asked for.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "runtime/ep/expert_parallel.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::runtime;
  if (size < 1) return 0;
  const std::vector<uint8_t> bytes(data + 1, data + size);
  const int32_t rank = (data[0] >> 1) & 3;
  constexpr int64_t hidden = 8, n_experts = 16, top_k = 2;
  static const ep_placement placement = ep_placement::contiguous(2, n_experts, 4);
  ep_frame_limits limits;
  limits.max_rows = 64;
  if (data[0] & 1) {
    constexpr int64_t pairs = 3;
    auto c = decode_combine(bytes, 7, 1, 2, hidden, pairs);
    if (c && c->size() != static_cast<size_t>(pairs * hidden)) std::abort();
    if (!c && c.error().empty()) std::abort();
    return 0;
  }
  auto d = decode_dispatch(bytes, 7, 1, 2, placement, rank, hidden, top_k, limits);
  if (!d) {
    if (d.error().empty()) std::abort();
    return 0;
  }
  if (d->epoch != 0 || d->ready > 1) std::abort();
  if (d->rows < 0 || d->rows > limits.max_rows || d->xn.size() != static_cast<size_t>(d->rows * hidden) ||
      d->pair_row.size() != d->pair_expert.size())
    std::abort();
  std::vector<int> per_row(static_cast<size_t>(d->rows), 0);
  for (size_t i = 0; i < d->pair_row.size(); ++i) {
    if (d->pair_row[i] < 0 || d->pair_row[i] >= d->rows) std::abort();
    if (!placement.holds(1, rank, d->pair_expert[i])) std::abort();
    if (++per_row[static_cast<size_t>(d->pair_row[i])] > top_k) std::abort();
  }
  return 0;
}
