// Structured output: one grammar engine for regular expressions, JSON schemas and EBNF. Each
// source compiles to a context-free grammar over bytes (rules of alternatives of sequences of
// byte classes and rule references; UTF-8 code point sets become byte-class sequences), which a
// pushdown matcher runs: a state is the set of live stacks, each stack a chain of return
// positions hash-consed in an arena, its top always a byte class. The token mask over a
// vocabulary is computed per state from a per-position cache (as XGrammar does): for the top
// position of each stack, the tokens a walk of the sorted vocabulary accepts without leaving
// the position's rule are valid whatever the stack below holds, the ones it rejects before
// leaving are invalid, and only the rest ("uncertain") are checked against the whole stack.
// Accepted tokens are kept as a history so speculative decoding can roll back.
//
// Written by hand: Debian has no grammar-constrained decoding library (XGrammar, llguidance and
// outlines-core are not packaged), and PCRE2's partial matching cannot give a per-token mask.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "model/tokenizer.hpp"
#include "runtime/structured/constraint.hpp"

namespace shoal::runtime {

// A compile error: what is wrong and where (byte offset into the source and its line and
// column; for a JSON schema the JSON pointer of the offending schema).
struct grammar_error {
  std::string message;
  std::string where;  // "line 3, column 7", "offset 12" or "/properties/age"
  std::string text() const { return where.empty() ? message : message + " at " + where; }
};

// The compiled grammar: flat elements, each alternative ending with an `end` element.
struct grammar {
  enum class kind : uint8_t { bytes, rule, end };
  struct element {
    kind k;
    uint32_t arg;  // bytes: class index; rule: rule index
  };
  using byte_class = std::array<uint64_t, 4>;
  std::vector<element> elements;
  std::vector<byte_class> classes;
  std::vector<std::vector<uint32_t>> alts;  // rule → start positions of its alternatives
  std::vector<std::string> names;           // rule → name (for errors and dumps)
  uint32_t root = 0;
  static bool has(const byte_class& c, uint8_t b) { return (c[b >> 6] >> (b & 63)) & 1; }
};

// Building rules by hand (the three front ends use it). Rule bodies refer to rules by index,
// so rules may be referred to before their alternatives are added.
class grammar_builder {
 public:
  struct item {
    grammar::kind k;
    uint32_t arg;
  };
  using sequence = std::vector<item>;
  uint32_t rule(std::string name);  // a new rule with no alternative yet
  void alt(uint32_t rule, sequence s);
  static item ref(uint32_t rule) { return {grammar::kind::rule, rule}; }
  item cls(const grammar::byte_class& c);
  item byte(uint8_t b);
  void append_literal(sequence& out, std::string_view bytes);
  sequence literal(std::string_view bytes);
  // A rule matching one code point of `ranges` (inclusive; any order, overlaps allowed;
  // surrogates never match), UTF-8 encoded.
  uint32_t codepoints(std::vector<std::pair<uint32_t, uint32_t>> ranges, std::string name);
  // A rule matching `body` repeated [min, max] times (max < 0: unbounded).
  uint32_t repeat(uint32_t body, int64_t min, int64_t max, const std::string& name);
  uint32_t choice(std::vector<sequence> alts, std::string name);
  // Copies every rule of a compiled grammar in (names prefixed); returns its root's new index.
  uint32_t embed(const grammar& g, const std::string& prefix);
  size_t rules() const { return alts_.size(); }
  bool defined(uint32_t r) const { return !alts_[r].empty(); }
  // Checks (every rule has an alternative, no left recursion, not too large) and flattens.
  std::optional<grammar_error> finish(uint32_t root, grammar& out) const;

 private:
  std::vector<std::vector<sequence>> alts_;
  std::vector<std::string> names_;
  std::vector<grammar::byte_class> classes_;
  std::unordered_map<std::string, uint32_t> class_index_;
};

// Front ends. JSON schemas: object, array, string, number, integer, boolean, null, enum,
// const, required, properties, additionalProperties, items, minItems/maxItems,
// minLength/maxLength, pattern, anyOf, oneOf (as anyOf), local $ref; other keywords are
// refused by name, annotations (title, description, ...) pass.
std::optional<grammar_error> compile_json_schema(std::string_view schema_json, grammar& out);
std::optional<grammar_error> compile_json_object(grammar& out);  // any JSON object
std::optional<grammar_error> compile_regex(std::string_view pattern, grammar& out);
std::optional<grammar_error> compile_ebnf(std::string_view text, grammar& out);
// Tool calls in the DeepSeek-V3 format (runtime/structured/tool_calls.hpp writes the source).
std::optional<grammar_error> compile_tool_calls(std::string_view source, grammar& out);
std::optional<grammar_error> compile(const constraint_spec& spec, grammar& out);

// How a grammar names an added (special) token of the vocabulary: 0xFF, which no UTF-8 text
// holds, then the token's text. make_token_vocab gives each added token these bytes, so only
// a grammar that spells them out (the tool-call grammar) lets the token through; every other
// front end matches UTF-8 text only.
std::string special_token_bytes(std::string_view token_text);

// The vocabulary as bytes: every token's bytes, and which tokens a grammar never emits
// (added/special tokens, empty ones). Tokens are kept sorted by bytes for the mask walk.
class token_vocab {
 public:
  // bytes[id]: the token's bytes; special[id]: never produced by a grammar.
  token_vocab(std::vector<std::string> bytes, std::vector<bool> special, int32_t eos_id);
  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t eos_id() const { return eos_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }

 private:
  friend class grammar_matcher;
  friend struct compiled_grammar;
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  int32_t eos_;
  std::vector<int32_t> sorted_;      // ids of grammar-usable tokens by bytes
  std::vector<uint32_t> lcp_;        // lcp_[i]: common prefix of sorted_[i − 1] and sorted_[i]
};

// A tokenizer's vocabulary as token_vocab: ids [0, vocab_size) (ids the tokenizer lacks are
// empty, never produced), added tokens as special_token_bytes of their text, tokens holding a
// 0xFF byte (never part of UTF-8 text) never produced, `eos_id` the end of a match.
std::shared_ptr<const token_vocab> make_token_vocab(const model::tokenizer& tok, int32_t vocab_size, int32_t eos_id);

// A grammar with its per-position mask caches over one vocabulary (filled as positions are
// met). Not thread-safe: one engine's step loop uses it.
struct compiled_grammar {
  compiled_grammar(grammar g, std::shared_ptr<const token_vocab> vocab);
  grammar g;
  std::shared_ptr<const token_vocab> vocab;
  struct position_mask {
    std::vector<uint64_t> accepted;  // bitset over token ids
    std::vector<int32_t> uncertain;  // sorted-vocabulary order
  };
  std::unordered_map<std::string, position_mask> cache;  // by context: the top frames' positions
  uint64_t cache_walks = 0;                              // contexts computed
};

// Compiles `spec` for `vocab`; errors as compile() gives them.
std::variant<std::shared_ptr<compiled_grammar>, grammar_error> compile_for(const constraint_spec& spec,
                                                                          std::shared_ptr<const token_vocab> vocab);

// One request's position in its grammar.
class grammar_matcher {
 public:
  explicit grammar_matcher(std::shared_ptr<compiled_grammar> g);
  ~grammar_matcher();
  grammar_matcher(grammar_matcher&&) noexcept;
  grammar_matcher& operator=(grammar_matcher&&) noexcept;

  // Advances over one token (false, state unchanged, when the grammar refuses it). The
  // eos token is accepted only where the grammar can end, and ends the match.
  bool accept_token(int32_t id);
  bool accept_bytes(std::string_view bytes);  // the same over raw bytes (tests, prefill)
  // Undoes the last n accepted tokens (n ≤ history()).
  void rollback(size_t n);
  size_t history() const;
  // Bitset over the vocabulary (size (vocab + 63) / 64) of the tokens accept_token would take.
  void fill_mask(std::span<uint64_t> mask);
  bool can_end() const;       // the bytes so far are a whole match
  bool terminated() const;    // eos accepted, or a whole match that nothing can extend
  // Sets the logits of refused tokens to −inf (logits over the vocabulary; longer is fine,
  // the extra ids are refused). Returns how many tokens are left.
  size_t apply_mask(std::span<float> logits);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace shoal::runtime
