// `shoal bench grammar`: the structured-output token mask's cost per token over a real
// vocabulary (DeepSeek-V3's 129k tokens by default). For each schema of the suite it compiles
// the grammar, then runs random walks under the mask (eos half the time it is allowed, tokens
// with punctuation favoured so walks end): the first walk fills the per-position caches (cold), the
// later ones reuse them (warm, what a server serving the same schema again sees).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <random>

#include "model/tokenizer.hpp"
#include "runtime/grammar.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

struct grammar_args {
  std::string tokenizer = "../shared/tokenizers/deepseek-v3/tokenizer.json";
  std::string schemas = "tests/runtime/data/json_schemas.json";
  int walks = 3;
  int max_tokens = 2000;
  uint32_t seed = 1;
  std::string out = "bench/results/grammar.jsonl";
};

// Tokens with ASCII punctuation (closing quotes and brackets, '@', '.') but no opening bracket
// are favoured so walks end.
bool closes(const std::string& b) {
  return b.find_first_of("{[") == std::string::npos &&
         std::any_of(b.begin(), b.end(), [](char c) { return std::ispunct(static_cast<unsigned char>(c)) != 0; });
}

// One walk; appends each mask's seconds to `mask_s`.
void walk(const std::shared_ptr<runtime::compiled_grammar>& g, std::mt19937& rng, int max_tokens, std::vector<double>& mask_s) {
  const auto& v = *g->vocab;
  runtime::grammar_matcher m(g);
  std::vector<uint64_t> mask((static_cast<size_t>(v.size()) + 63) / 64);
  std::vector<int32_t> ids;
  std::vector<double> weights;
  for (int s = 0; s < max_tokens && !m.terminated(); ++s) {
    const double t0 = now_s();
    m.fill_mask(mask);
    mask_s.push_back(now_s() - t0);
    ids.clear();
    weights.clear();
    bool eos = false;
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint64_t bits = mask[w]; bits; bits &= bits - 1) {
        const auto t = static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
        if (t == v.eos_id()) eos = true;
        else {
          ids.push_back(t);
          weights.push_back(closes(v.bytes(t)) ? 40.0 : 1.0);
        }
      }
    if (!eos && ids.empty()) return;
    const int32_t pick = eos && (ids.empty() || std::bernoulli_distribution(0.5)(rng))
                           ? v.eos_id()
                           : ids[std::discrete_distribution<size_t>(weights.begin(), weights.end())(rng)];
    m.accept_token(pick);
  }
}

int run_grammar_bench(const grammar_args& a) {
  auto tok = model::tokenizer::load(a.tokenizer);
  if (!tok) {
    fmt::print(stderr, "shoal bench grammar: {}\n", tok.error().message);
    return 1;
  }
  std::ifstream f(a.schemas);
  if (!f) {
    fmt::print(stderr, "shoal bench grammar: cannot read {}\n", a.schemas);
    return 1;
  }
  const auto schemas = nlohmann::ordered_json::parse(f, nullptr, false);
  if (!schemas.is_array()) {
    fmt::print(stderr, "shoal bench grammar: {} is not a JSON array of schemas\n", a.schemas);
    return 1;
  }
  std::vector<std::string> bytes;
  std::vector<bool> special;
  for (int32_t i = 0; i < tok->vocab_size(); ++i) {
    bytes.push_back(tok->decode_token(i));
    special.push_back(tok->is_added(i));
  }
  const double v0 = now_s();
  auto vocab = std::make_shared<const runtime::token_vocab>(std::move(bytes), std::move(special), tok->eos_id());
  const double vocab_s = now_s() - v0;
  std::mt19937 rng(a.seed);
  std::vector<double> cold, warm, compile_s, fill_s;
  uint64_t positions = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    const double c0 = now_s();
    auto r = runtime::compile_for({runtime::constraint_kind::json_schema, schemas[i].dump()}, vocab);
    compile_s.push_back(now_s() - c0);
    auto* g = std::get_if<std::shared_ptr<runtime::compiled_grammar>>(&r);
    if (!g) {
      fmt::print(stderr, "shoal bench grammar: schema {}: {}\n", i, std::get<runtime::grammar_error>(r).text());
      return 1;
    }
    std::vector<double> first;
    walk(*g, rng, a.max_tokens, first);
    double total = 0;
    for (double s : first) total += s;
    fill_s.push_back(total);
    cold.insert(cold.end(), first.begin(), first.end());
    for (int w = 1; w < a.walks; ++w) walk(*g, rng, a.max_tokens, warm);
    positions += (*g)->cache.size();
  }
  auto us = [](double s) { return 1e6 * s; };
  double warm_mean = 0;
  for (double s : warm) warm_mean += s;
  warm_mean /= std::max<size_t>(warm.size(), 1);
  fmt::print("vocabulary: {} tokens, sorted in {:.1f} ms\n", vocab->size(), 1e3 * vocab_s);
  fmt::print("{} schemas: compile median {:.2f} ms; {} mask positions cached, first walk per schema median {:.1f} ms\n",
             schemas.size(), 1e3 * median(compile_s), positions, 1e3 * median(fill_s));
  fmt::print("mask per token, warm ({} masks): mean {:.1f} us, p50 {:.1f} us, p99 {:.1f} us (goal: 50 us)\n", warm.size(),
             us(warm_mean), us(percentile(warm, 0.5)), us(percentile(warm, 0.99)));
  fmt::print("mask per token, cold ({} masks, caches filling): p50 {:.1f} us, p99 {:.1f} us\n", cold.size(),
             us(percentile(cold, 0.5)), us(percentile(cold, 0.99)));
  nlohmann::json rec = machine_facts();
  rec.update({{"bench", "grammar"},
              {"vocab", vocab->size()},
              {"schemas", schemas.size()},
              {"compile_ms_p50", 1e3 * median(compile_s)},
              {"first_walk_ms_p50", 1e3 * median(fill_s)},
              {"positions", positions},
              {"warm_masks", warm.size()},
              {"mask_us_mean", us(warm_mean)},
              {"mask_us_p50", us(percentile(warm, 0.5))},
              {"mask_us_p99", us(percentile(warm, 0.99))},
              {"cold_mask_us_p50", us(percentile(cold, 0.5))},
              {"cold_mask_us_p99", us(percentile(cold, 0.99))}});
  append_jsonl(a.out, rec);
  fmt::print("record appended to {}\n", a.out);
  return 0;
}

}  // namespace

void add_grammar_bench(CLI::App& bench) {
  auto a = std::make_shared<grammar_args>();
  auto* c = bench.add_subcommand("grammar", "structured output: token-mask time per token over a real vocabulary");
  c->add_option("--tokenizer", a->tokenizer, "tokenizer.json")->capture_default_str();
  c->add_option("--schemas", a->schemas, "JSON array of schemas")->capture_default_str();
  c->add_option("--walks", a->walks, "random walks per schema (the first fills the caches)")->capture_default_str();
  c->add_option("--max-tokens", a->max_tokens, "tokens per walk at most")->capture_default_str();
  c->add_option("--seed", a->seed, "walk seed")->capture_default_str();
  c->add_option("--out", a->out, "JSONL records")->capture_default_str();
  c->callback([a] { set_exit_code(run_grammar_bench(*a)); });
}

}  // namespace shoal::tools
