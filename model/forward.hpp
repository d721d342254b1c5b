// The forward pass of both architectures over a batch of sequences, each contributing a run
// of new tokens. The caches it reads and writes belong to the caller (runtime/): paged blocks
// of compressed entries, and per-stream rings of raw entries for the sliding window. The
// model knows nothing of requests or scheduling; it only honours the positions it is given.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/kv_format.hpp"
#include "model/weights.hpp"

namespace shoal::model {

// Attention streams: encoder layers 0..n_enc−1, then (shoal_flash) the shared decoder cache
// projection n_enc, decoder layers n_enc+1…, then MTP layers. deepseek_v3 has only "encoder"
// streams (window 1, ratio 1: plain causal attention).
struct stream_layout {
  int64_t n_enc = 0, n_dec = 0, n_mtp = 0;
  bool flash = false;
  int64_t dec_kv() const { return n_enc; }
  int64_t decoder(int64_t j) const { return n_enc + 1 + j; }
  int64_t mtp(int64_t k) const { return n_enc + (flash ? 1 + n_dec : 0) + k; }
  int64_t count() const { return mtp(n_mtp); }
};
stream_layout streams_of(const model_config& c);

// Smallest ring a sequence may use: the window minus one, and a compress run minus one.
int64_t min_ring_tokens(const model_config& c);
// Decoder tail for exact results: decoder (and MTP) layers at the last position depend on
// the last (n_dec + n_mtp) × W positions only, so prefill runs them there alone.
int64_t exact_decoder_tail(const model_config& c);

// Cache storage of one sequence.
struct sequence_cache {
  // Block ids in `pages`: block i covers positions [i·bs, (i+1)·bs), (cache_layers, bs/m)
  // entries in the pages' format.
  std::vector<int32_t> blocks;
  kv_pages* pages = nullptr;
  int64_t ring_tokens = 0;
  // Per stream: (ring_tokens) slots of ring_slot_bytes(), each an entry in ring_form (the
  // pages' form) followed by its compress logit as 4 fp32 bytes.
  std::vector<std::vector<uint8_t>> rings;
  kv_format ring_form;
  std::vector<int64_t> ring_floor;        // per stream: raw entries below this position are not visible
  int64_t computed = 0;                   // positions [0, computed) are in the caches

  // Rings of `ring_tokens` slots in form `dtype`, no blocks, nothing computed.
  void init(const model_config& c, int64_t ring_tokens, kv_dtype dtype = kv_dtype::fp32);
  size_t ring_slot_bytes() const { return ring_form.entry_bytes() + sizeof(float); }
  uint8_t* ring_slot(int64_t stream, int64_t pos);
  const uint8_t* ring_slot(int64_t stream, int64_t pos) const;
  // The entry and compress logit (entry_dim + 1 floats) of the slot holding pos: widened / stored.
  void ring_read(int64_t stream, int64_t pos, float* entry) const;
  void ring_write(int64_t stream, int64_t pos, const float* entry);
  // The stored entry `index` of cache layer `layer` in block i.
  uint8_t* block_entry(int64_t i, int64_t layer, int64_t index);
  const uint8_t* block_entry(int64_t i, int64_t layer, int64_t index) const;
};

// Input rows that replace token embeddings: an image's encoder rows (model/vision.hpp) at its
// placeholder tokens. Positions pos … pos + count − 1 take rows of `values` ((count, d)
// floats); the tokens there still feed the MTP modules' embeddings.
struct input_rows {
  int64_t pos = 0;
  int64_t count = 0;
  const float* values = nullptr;
};

struct forward_item {
  sequence_cache* cache = nullptr;
  std::span<const int32_t> tokens;   // at positions cache->computed …
  int64_t dec_from = 0;              // decoder layers run at positions ≥ dec_from
  int64_t blocks_valid_until = 0;    // runs ending before this are already in the blocks (replay)
  bool logits = false;               // logits of the run's last `logit_rows` positions wanted
  bool hidden = false;               // decoder-stack output rows wanted (pre-norm), for MTP
  std::span<const input_rows> inputs;  // may cover positions outside this run (ignored there)
  int64_t logit_rows = 1;            // ≥ 1, ≤ the run's decoder rows (speculative verification)
};

// Routed experts of a MoE layer computed elsewhere (expert parallelism, runtime/expert_parallel).
// Every MoE FFN invocation point of the model has a stable "MoE slot": slot s is layer index
// first_k_dense_replace + s, counting the main layers 0…L−1 and then MTP module k as layer
// L + k (encoder, flash decoder and MTP layers alike). forward() reaches its slots in
// increasing order, each at most once (also with zero rows: a slot of the flash decoder is
// reached even when no item has decoder rows); mtp_last() uses MTP module 0's slot, so
// forward() then mtp_last() in one step still reaches slots in increasing order.
class moe_exchange {
 public:
  virtual ~moe_exchange() = default;
  // out (rows, d) += Σ over each row's k experts in ascending expert id of
  // weights[i, j] · SwiGLU_{ids[i, j]}(xn[i]), summed exactly as the local path does (axpy per
  // expert, ascending id) so results are bit-identical in batch-invariant mode. `out` already
  // holds the shared expert's output. May throw to abort the forward pass: the items' caches
  // are then partly written and the caller must discard those sequences (the one exception
  // that crosses model code, see runtime::ep_error).
  virtual void routed_experts(const model_weights& w, int64_t moe_slot,
                              const float* xn,       // (rows, d) post-attention-normed input
                              int64_t rows,
                              const int32_t* ids,    // (rows, k) top-k expert ids
                              const float* weights,  // (rows, k) gate weights
                              bool batch_invariant,
                              float* out) = 0;       // (rows, d), accumulated into
};

struct forward_options {
  bool batch_invariant = false;  // fixed-order GEMMs: row results independent of the batch
  bool naive_attention = false;  // expand latents through kv_b (prefill form) instead of absorbing
  moe_exchange* moe = nullptr;   // routed experts elsewhere; nullptr = all experts local
};

// Number of MoE slots (see moe_exchange): MoE layers among the main layers and MTP modules.
int64_t moe_slot_count(const model_config& c);
// The MoE slot of layer index `layer` (0…L−1 main, L + k MTP module k); −1 for a dense layer.
int64_t moe_slot_of_layer(const model_config& c, int64_t layer);
// The layer weights behind MoE slot `moe_slot`.
const layer_weights& moe_slot_layer(const model_weights& w, int64_t moe_slot);
// out (rows, d) = SwiGLU of routed expert `expert` of MoE slot `moe_slot` over xn (rows, d),
// with the kernels of the local path (bit-identical rows in batch-invariant mode). Run it
// on one thread per expert as ffn does (from inside a parallel_for part).
// Places experts on `parts` threads: those with rows, largest first, each on the least loaded
// part (rows[e] = rows routed to expert e). Each expert then runs whole on one thread, so its
// GEMMs are unsplit single-threaded calls. Returns the expert indices per part.
std::vector<std::vector<int64_t>> assign_experts(const std::vector<size_t>& rows, int64_t parts);
// out (rows, d) += Σ_j weights[i, j] · expert_out(i, j) per row in ascending expert id (the fixed
// order that makes a row's routed sum independent of its batch and of where experts ran);
// expert_out(i, j) points at the (d) output of row i's j-th expert, rows in parallel.
void sum_in_expert_order(int64_t rows, int64_t k, int64_t d,
                         const int32_t* ids,      // (rows, k)
                         const float* weights,    // (rows, k)
                         const std::function<const float*(int64_t i, int64_t j)>& expert_out, float* out);
void routed_expert(const model_weights& w, int64_t moe_slot, int64_t expert, const float* xn,
                   int64_t rows, bool batch_invariant, float* out);

struct forward_output {
  std::vector<float> logits;          // (Σ logit_rows of items with logits, V), in item order
  std::vector<std::vector<float>> hidden;  // per item: (rows run through the decoder, d)
  std::vector<int64_t> hidden_from;   // per item: position of the first hidden row
};

// Runs the batch: writes every stream's raw entries to the rings, completed compressed runs
// to the blocks, and advances each cache's `computed` by its token count.
forward_output forward(const model_weights& w, std::span<forward_item> items,
                       const forward_options& options);

// Draft logits of MTP module 0 at the last position of `tokens` and the confidence head's
// output there, computed over a whole sequence whose main-model hidden states `hidden`
// (rows for positions hidden_from … n−1, pre-norm) and caches are given.
struct mtp_output {
  std::vector<float> logits;  // (V)
  float confidence = 0.0f;    // NaN without a confidence head
};
mtp_output mtp_last(const model_weights& w, std::span<const int32_t> tokens,
                    const std::vector<float>& hidden, int64_t hidden_from,
                    const sequence_cache& cache, const forward_options& options);

// Chained MTP drafting (DSpark), for a batch of sequences. Each item's `tokens` are the
// sequence t_0 … t_n (t_n the newest token, not yet in the caches: cache.computed = n) and
// `hidden` the main model's hidden rows (pre-norm) of positions hidden_from … n−1. Depth k
// (0-based) runs MTP module min(k, modules − 1) over those positions, pairing the previous
// depth's output rows (the main model's for k = 0) with tokens u_{i+k+1}, u = tokens followed
// by the drafts chosen so far; its attention sees its own rows from hidden_from on (and, in
// shoal_flash, the shared decoder block cache). At the last row the depth's head gives draft
// logits and the confidence head the draft's acceptance probability (conditional on the
// earlier drafts; NaN without a head); choose(item, k, logits (V), confidence) returns the
// draft token. Depth 0 with hidden_from as given equals mtp_last. The caches are only read.
struct mtp_chain_item {
  std::span<const int32_t> tokens;
  const float* hidden = nullptr;  // (n − hidden_from, d)
  int64_t hidden_from = 0;
  const sequence_cache* cache = nullptr;
};
struct mtp_draft {
  int32_t token = -1;
  float confidence = 0.0f;
};
using draft_chooser = std::function<int32_t(size_t item, int64_t depth, std::span<const float> logits, float confidence)>;
std::vector<std::vector<mtp_draft>> mtp_chain(const model_weights& w, std::span<const mtp_chain_item> items,
                                              int64_t depth, const draft_chooser& choose,
                                              const forward_options& options);

// Incremental chained drafting: each depth keeps its own ring of MTP entries, so a step
// computes per depth only the rows that became final since the last step (their tokens are
// all accepted now) and the few that still depend on drafts — about accepted + depth rows
// instead of a whole window. Depth k at position i pairs the previous depth's output there
// with token u_{i+k+1} as mtp_chain does, and attends to its own entries from the state's
// floor on within `window` positions (shoal_flash: the model's window plus the shared decoder
// block cache; deepseek_v3: the last `window` entries, no compressed part). With a window
// covering every position since the floor, the drafts equal mtp_chain's from that floor.
struct mtp_state {
  bool valid = false;
  int64_t ring_tokens = 0, window = 0;
  std::vector<std::vector<uint8_t>> rings;  // per depth: (ring_tokens) ring slots of the cache's form
  std::vector<int64_t> floor;             // per depth: no entry below this position is read
  std::vector<int64_t> frontier;          // per depth: its entries below this are final
  std::vector<std::vector<float>> out;    // per depth: output rows of final positions [out_from, frontier)
  std::vector<int64_t> out_from;
};
struct mtp_step_item {
  std::span<const int32_t> tokens;  // t_0 … t_n, t_n the newest (cache.computed = n)
  const float* hidden = nullptr;    // main-model rows of positions hidden_from … n − 1
  int64_t hidden_from = 0;
  const sequence_cache* cache = nullptr;
  mtp_state* state = nullptr;       // reset (floor = hidden_from) when invalid or out of reach
};
std::vector<std::vector<mtp_draft>> mtp_chain_step(const model_weights& w, std::span<const mtp_step_item> items,
                                                   int64_t depth, int64_t window, const draft_chooser& choose,
                                                   const forward_options& options);

// Convenience for tests and tools: the whole sequence in one pass over a private cache in
// format `kv`; returns the last position's logits (and MTP output when the model has MTP).
struct full_result {
  std::vector<float> logits;
  mtp_output mtp;
};
full_result forward_full(const model_weights& w, std::span<const int32_t> tokens,
                         const forward_options& options = {}, std::span<const input_rows> inputs = {},
                         kv_dtype kv = kv_dtype::fp32);

}  // namespace shoal::model
