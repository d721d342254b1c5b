// Conformance of every registered compute backend (model/backend.hpp), run over each one
// present: logits equal the CPU reference pass, chunked == whole, cache == recompute and batch
// invariance (bitwise in batch-invariant mode), in every KV format; plus its expert calls. A
// device backend joins by registering itself.
#include <doctest/doctest.h>

#include "model/backend.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;

namespace {

const std::vector<model::kv_dtype> formats = {model::kv_dtype::fp32, model::kv_dtype::bf16, model::kv_dtype::fp8};

// A sequence over pages the backend made.
struct backend_sequence {
  std::shared_ptr<model::kv_pages> pages;
  model::sequence_cache cache;
  backend_sequence(model::compute_backend& b, int64_t positions, model::kv_dtype kv) {
    const auto& c = b.weights().config;
    const int64_t blocks = positions / c.block_size + 1;
    pages = b.create_kv(model::kv_format_of(c, kv), static_cast<int32_t>(blocks));
    cache.init(c, model::min_ring_tokens(c) + 1, kv);
    cache.pages = pages.get();
    for (int64_t i = 0; i < blocks; ++i) cache.blocks.push_back(static_cast<int32_t>(i));
  }
};

// Last-position logits of `tokens` computed in chunks of the given sizes.
std::vector<float> chunked(model::compute_backend& b, const std::vector<int32_t>& tokens, const std::vector<int64_t>& sizes,
                           model::kv_dtype kv) {
  const auto& c = b.weights().config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  backend_sequence s(b, n, kv);
  const int64_t dec_from = std::max<int64_t>(0, n - model::exact_decoder_tail(c));
  std::vector<float> logits;
  for (int64_t pos = 0, i = 0; pos < n; ++i) {
    const int64_t len = i < static_cast<int64_t>(sizes.size()) ? std::min(sizes[i], n - pos) : n - pos;
    model::forward_item it{&s.cache, std::span<const int32_t>(tokens).subspan(pos, len), dec_from, 0, pos + len == n, false, {}};
    auto out = b.forward(std::span<model::forward_item>(&it, 1), {true, false});
    pos += len;
    if (pos == n) logits = out.logits;
  }
  return logits;
}

template <class Fn>
void for_each_backend(const char* preset, Fn&& fn) {
  auto w = test::tiny_model(preset);
  for (const std::string& name : model::backend_names()) {
    auto b = model::make_backend(name, w);
    REQUIRE_MESSAGE(b, (b ? "" : b.error().message));
    CAPTURE(name);
    CAPTURE(preset);
    fn(**b, *w);
  }
}

}  // namespace

TEST_CASE("backend conformance: logits equal the CPU reference pass, chunked == whole, in every KV format") {
  for (const char* preset : {"tiny", "v3-tiny"})
    for_each_backend(preset, [&](model::compute_backend& b, const model::model_weights& w) {
      auto tokens = test::random_tokens(53, 8);
      for (auto kv : formats) {
        CAPTURE(model::to_string(kv));
        const auto ref = model::forward_full(w, tokens, {true, false}, {}, kv);
        const auto got = b.forward_full(tokens, {true, false}, kv);
        CHECK(test::rel_diff(got.logits, ref.logits) < 1e-5);
        const auto whole = chunked(b, tokens, {53}, kv);
        CHECK(test::rel_diff(whole, ref.logits) < 1e-5);
        for (auto split : std::vector<std::vector<int64_t>>{{1, 52}, {16, 16, 21}, {5, 9, 30, 9}})
          CHECK(chunked(b, tokens, split, kv) == whole);
      }
    });
}

TEST_CASE("backend conformance: decoding with the cache equals recomputing, a batch equals its items alone") {
  for (const char* preset : {"tiny", "v3-tiny"})
    for_each_backend(preset, [&](model::compute_backend& b, const model::model_weights& w) {
      const auto& c = w.config;
      for (auto kv : formats) {
        CAPTURE(model::to_string(kv));
        // Three sequences decoded together, token by token, against each recomputed alone.
        std::vector<std::vector<int32_t>> seqs = {test::random_tokens(40, 1), test::random_tokens(25, 2),
                                                  test::random_tokens(33, 3)};
        std::vector<std::unique_ptr<backend_sequence>> caches;
        std::vector<model::forward_item> items;
        for (auto& s : seqs) {
          caches.push_back(std::make_unique<backend_sequence>(b, static_cast<int64_t>(s.size()), kv));
          items.push_back({&caches.back()->cache, std::span<const int32_t>(s).first(20), 0, 0, true, false, {}});
        }
        b.forward(items, {true, false});
        for (int64_t t = 20; t < 25; ++t) {
          for (size_t i = 0; i < seqs.size(); ++i)
            items[i] = {&caches[i]->cache, std::span<const int32_t>(seqs[i]).subspan(static_cast<size_t>(t), 1), 0, 0,
                        true, false, {}};
          auto out = b.forward(items, {true, false});
          for (size_t i = 0; i < seqs.size(); ++i) {
            auto alone = b.forward_full(std::span<const int32_t>(seqs[i]).first(static_cast<size_t>(t + 1)), {true, false}, kv);
            CAPTURE(t);
            CAPTURE(i);
            CHECK(std::vector<float>(out.logits.begin() + static_cast<std::ptrdiff_t>(i * c.vocab_size),
                                     out.logits.begin() + static_cast<std::ptrdiff_t>((i + 1) * c.vocab_size)) == alone.logits);
          }
        }
      }
    });
}

TEST_CASE("backend conformance: another rank's routed experts equal the local kernels, experts load and drop") {
  for_each_backend("v3-tiny", [&](model::compute_backend& b, const model::model_weights& w) {
    const auto& c = w.config;
    const int64_t d = c.hidden_size, slot = 0;
    std::vector<float> in(static_cast<size_t>(5 * d)), want(in.size()), got(in.size()), got2(in.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((i * 37 % 101) - 50) / 50.0f;
    model::routed_expert(w, slot, 3, in.data(), 5, true, want.data());
    std::vector<model::expert_job> jobs = {{3, in.data(), 5, got.data()}, {7, in.data(), 2, got2.data()}};
    b.run_experts(slot, jobs, true);
    CHECK(got == want);
    std::vector<float> want7(static_cast<size_t>(2 * d));
    model::routed_expert(w, slot, 7, in.data(), 2, true, want7.data());
    CHECK(std::vector<float>(got2.begin(), got2.begin() + 2 * d) == want7);
    // Drop expert 3, then load it back: the weights go and return.
    model::expert_weights kept = model::moe_slot_layer(w, slot).ffn.experts[3];
    b.drop_expert(slot, 3);
    CHECK(model::moe_slot_layer(b.weights(), slot).ffn.experts[3].gate_up.bytes() == 0);
    b.load_expert(slot, 3, kept);
    std::fill(got.begin(), got.end(), 0.0f);
    b.run_experts(slot, std::span<const model::expert_job>(jobs.data(), 1), true);
    CHECK(got == want);
  });
}

TEST_CASE("backends: cpu is always registered, an unknown one is refused naming those there are") {
  auto names = model::backend_names();
  CHECK(std::find(names.begin(), names.end(), "cpu") != names.end());
  auto w = test::tiny_model("v3-tiny");
  auto b = model::make_backend("tpu", w);
  REQUIRE_FALSE(b);
  CHECK(b.error().code == model::errc::unsupported);
  CHECK(b.error().message.find("no compute backend 'tpu' in this build (cpu") != std::string::npos);
  CHECK_FALSE(model::register_backend("cpu", nullptr));  // the name is taken
}

TEST_CASE("build_plan: positions, block tables, the slots compressed runs go to, and logit rows") {
  auto w = test::tiny_model("tiny");  // ratio 4, block 16 (4 runs a block)
  const auto& c = w->config;
  REQUIRE(c.ratio() == 4);
  REQUIRE(c.block_size == 16);
  test::dense_cache a(c, 2, model::min_ring_tokens(c) + 1), b(c, 3, model::min_ring_tokens(c) + 1);
  a.cache.blocks = {5, 9};
  b.cache.blocks = {2, 4, 6};
  b.cache.computed = 14;
  std::vector<int32_t> ta(6, 1), tb(5, 1);
  std::vector<model::forward_item> items = {{&a.cache, ta, 0, 0, true, false, {}, 2}, {&b.cache, tb, 0, 0, false, false, {}}};
  auto p = model::build_plan(c, items);
  CHECK(p.rows() == 11);
  CHECK(p.row_begin == std::vector<int64_t>{0, 6, 11});
  CHECK(p.positions == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 14, 15, 16, 17, 18});
  CHECK(p.table_begin == std::vector<int64_t>{0, 2, 5});
  CHECK(p.block_table == std::vector<int32_t>{5, 9, 2, 4, 6});
  // Runs end at positions 3 (run 0), 15 (run 3), and none other here.
  CHECK(p.slot_block == std::vector<int32_t>{-1, -1, -1, 5, -1, -1, -1, 2, -1, -1, -1});
  CHECK(p.slot_index == std::vector<int32_t>{-1, -1, -1, 0, -1, -1, -1, 3, -1, -1, -1});
  CHECK(p.logit_rows == std::vector<int64_t>{4, 5});
}
