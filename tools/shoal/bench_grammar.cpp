// `shoal bench grammar`: the structured-output token mask's cost per token over a real
// vocabulary (DeepSeek-V3's 129k tokens by default). For each schema of the suite it compiles
// the grammar, then runs random walks under the mask (eos half the time it is allowed, tokens
// with punctuation favoured so walks end). Masks whose contexts were all cached (what a server
// sees once a schema has been served) are timed apart from those that walked the vocabulary
// for a context first.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <random>

#include "model/tokenizer.hpp"
#include "runtime/structured/grammar.hpp"
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

// One walk; appends each mask's seconds to `hit_s` (every context already cached) or `miss_s`
// (a context walked the vocabulary first).
void walk(const std::shared_ptr<runtime::compiled_grammar>& g, std::mt19937& rng, int max_tokens, std::vector<double>& hit_s,
          std::vector<double>& miss_s) {
  const auto& v = *g->vocab;
  runtime::grammar_matcher m(g);
  std::vector<uint64_t> mask((static_cast<size_t>(v.size()) + 63) / 64);
  std::vector<int32_t> ids;
  std::vector<double> weights;
  for (int s = 0; s < max_tokens && !m.terminated(); ++s) {
    const uint64_t walks = g->cache_walks;
    const double t0 = now_s();
    m.fill_mask(mask);
    (g->cache_walks == walks ? hit_s : miss_s).push_back(now_s() - t0);
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
  const double v0 = now_s();
  auto vocab = runtime::make_token_vocab(*tok, tok->vocab_size(), tok->eos_id());
  const double vocab_s = now_s() - v0;
  std::mt19937 rng(a.seed);
  std::vector<double> hit, miss, compile_s;
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
    for (int w = 0; w < a.walks; ++w) walk(*g, rng, a.max_tokens, hit, miss);
    positions += (*g)->cache.size();
  }
  auto us = [](double s) { return 1e6 * s; };
  auto mean = [](const std::vector<double>& v) {
    double t = 0;
    for (double x : v) t += x;
    return v.empty() ? 0.0 : t / static_cast<double>(v.size());
  };
  fmt::print("vocabulary: {} tokens, read and sorted in {:.1f} ms\n", vocab->size(), 1e3 * vocab_s);
  fmt::print("{} schemas, {} walks each: compile median {:.2f} ms; {} mask contexts walked\n", schemas.size(), a.walks,
             1e3 * median(compile_s), positions);
  fmt::print("mask per token, contexts cached ({} masks): mean {:.1f} us, p50 {:.1f} us, p99 {:.1f} us (goal: 50 us)\n",
             hit.size(), us(mean(hit)), us(percentile(hit, 0.5)), us(percentile(hit, 0.99)));
  fmt::print("mask per token, a context walked first ({} masks): mean {:.1f} ms, p50 {:.1f} ms\n", miss.size(),
             1e3 * mean(miss), 1e3 * percentile(miss, 0.5));
  std::vector<double> all = hit;
  all.insert(all.end(), miss.begin(), miss.end());
  fmt::print("mask per token, all: mean {:.1f} us\n", us(mean(all)));
  nlohmann::json rec = machine_facts();
  rec.update({{"bench", "grammar"},
              {"vocab", vocab->size()},
              {"schemas", schemas.size()},
              {"walks", a.walks},
              {"compile_ms_p50", 1e3 * median(compile_s)},
              {"contexts", positions},
              {"hit_masks", hit.size()},
              {"mask_us_mean", us(mean(hit))},
              {"mask_us_p50", us(percentile(hit, 0.5))},
              {"mask_us_p99", us(percentile(hit, 0.99))},
              {"miss_masks", miss.size()},
              {"miss_mask_ms_mean", 1e3 * mean(miss)},
              {"all_mask_us_mean", us(mean(all))}});
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
  c->add_option("--walks", a->walks, "random walks per schema")->capture_default_str();
  c->add_option("--max-tokens", a->max_tokens, "tokens per walk at most")->capture_default_str();
  c->add_option("--seed", a->seed, "walk seed")->capture_default_str();
  c->add_option("--out", a->out, "JSONL records")->capture_default_str();
  c->callback([a] { set_exit_code(run_grammar_bench(*a)); });
}

}  // namespace shoal::tools
