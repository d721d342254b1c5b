// Hugging Face byte-level BPE tokenizer: loads tokenizer.json (+ tokenizer_config.json), then
// encodes by matching added tokens first, pre-tokenizing the rest with the configured PCRE2
// splits, and merging each word's bytes by merge rank (words cached). Encoding works on raw bytes
// throughout: the byte-level unicode alphabet only appears when reading the vocab and merges.
#include "model/tokenizer.hpp"
#include "model/byte_level.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace shoal::model {
namespace {

using detail::alphabet;
using detail::bytes_to_symbols;
using detail::symbols_to_bytes;

using json = nlohmann::json;

constexpr int32_t max_token_id = 1 << 24;     // bounds allocations driven by the file
constexpr size_t max_cached_word_bytes = 256;
constexpr size_t max_cache_entries = 1 << 17;

// Length of the UTF-8 sequence at s[i] if it is valid (no overlongs, surrogates or > U+10FFFF),
// else 0.
size_t utf8_char_len(std::string_view s, size_t i) {
  auto c = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  auto cont = [&](size_t k) { return k < s.size() && (c(k) & 0xC0) == 0x80; };
  unsigned char b = c(i);
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (b >= 0xE0 && b <= 0xEF) {  // E0: no overlongs; ED: no surrogates
    bool ok = cont(i + 1) && cont(i + 2) && !(b == 0xE0 && c(i + 1) < 0xA0) &&
              !(b == 0xED && c(i + 1) >= 0xA0);
    return ok ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {  // F0: no overlongs; F4: nothing above U+10FFFF
    bool ok = cont(i + 1) && cont(i + 2) && cont(i + 3) && !(b == 0xF0 && c(i + 1) < 0x90) &&
              !(b == 0xF4 && c(i + 1) >= 0x90);
    return ok ? 4 : 0;
  }
  return 0;
}


using regex_ptr = std::shared_ptr<pcre2_code>;  // shared: tokenizer steps are immutable
using match_data_ptr = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;

// GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true.
constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// One pre-tokenizer step: a regex split, optionally preceded by ByteLevel's prefix space.
struct pre_step {
  regex_ptr regex;  // null: no split
  split_behavior behavior = split_behavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct segment { size_t begin, end; bool is_match; };

struct str_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using string_map = std::unordered_map<std::string, V, str_hash, std::equal_to<>>;  // find(string_view)

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(ss).str();
}

inline uint64_t pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

// Open-addressing table (pair -> rank, result): BPE's inner loop is these lookups, and a node-based
// unordered_map costs a cache miss per probe.
class merge_table {
 public:
  struct rule { int32_t rank, result; };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, slot{empty_key, {0, 0}});
    shift_ = 64 - std::countr_zero(cap);
  }
  void insert_or_assign(uint64_t key, rule r) {  // capacity is fixed by reserve()
    size_t i = index(key);
    while (slots_[i].key != empty_key && slots_[i].key != key) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = {key, r};
  }
  const rule* find(uint64_t key) const {
    for (size_t i = index(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == empty_key) return nullptr;
    }
  }

 private:
  static constexpr uint64_t empty_key = ~uint64_t(0);  // ids are >= 0, so never a real pair
  struct slot { uint64_t key; rule value; };
  size_t index(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<slot> slots_ = std::vector<slot>(2, slot{empty_key, {0, 0}});
  int shift_ = 63;
};

}  // namespace

struct tokenizer::impl {
  std::string file_;
  string_map<int32_t> vocab_;  // byte-level form
  merge_table merges_;
  std::array<int32_t, 256> byte_id_{};  // raw byte -> token id, -1 if absent
  std::vector<std::string> id_bytes_;   // id -> decoded bytes ("" for unused ids)
  bool ignore_merges_ = false;

  string_map<int32_t> added_;  // content -> id
  std::vector<bool> added_ids_;  // by id
  // Byte trie over added-token contents for leftmost-longest matching.
  std::unordered_map<uint64_t, int32_t> trie_edges_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> trie_token_{-1};               // node -> token id or -1
  std::array<bool, 256> trie_first_{};

  std::vector<pre_step> steps_;
  int32_t vocab_size_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  std::string chat_template_;

  mutable std::mutex cache_mutex_;
  mutable string_map<std::vector<int32_t>> cache_;  // word bytes -> ids

  // ---- loading ----
  result<void> load_model(const json& root);
  result<void> load_added_tokens(const json& root);
  result<void> load_pre_tokenizer(const json& root);
  result<pre_step> load_pre_step(const json& node, const std::string& field);
  result<void> check_unsupported(const json& root);
  result<void> load_config(const std::string& config_path);
  result<regex_ptr> compile_regex(std::string_view pattern, bool literal, const std::string& field);
  void add_trie_token(const std::string& content, int32_t id);
  void set_id_bytes(int32_t id, std::string bytes);

  std::unexpected<error> bad(errc code, const std::string& what) const {
    return fail(code, file_ + ": " + what);
  }
  result<bool> get_bool(const json& node, const char* name, bool dflt, const std::string& field) const {
    auto f = node.find(name);
    if (f == node.end() || f->is_null()) return dflt;
    if (f->is_boolean()) return f->get<bool>();
    return bad(errc::bad_json, "field '" + field + "." + name + "' must be a bool");
  }

  // ---- encoding ----
  void encode_text(std::string_view text, std::vector<int32_t>& out, pcre2_match_data* md) const;
  void encode_valid(std::string_view text, std::vector<int32_t>& out, pcre2_match_data* md) const;
  void split_piece(const pre_step& step, std::string_view piece, pcre2_match_data* md,
                   std::vector<segment>& segs, std::vector<std::string_view>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  std::vector<int32_t> merge_word(std::string_view word) const;
};

// ------------------------------------------------------------------------------------------
// Loading

result<regex_ptr> tokenizer::impl::compile_regex(std::string_view pattern, bool literal,
                                                 const std::string& field) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP, which a literal does not need.
  uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &err_off, nullptr);
  if (code == nullptr) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(err, msg.data(), msg.size());
    return bad(errc::bad_value, "field '" + field + "': regex does not compile at offset " +
                                    std::to_string(err_off) + ": " +
                                    reinterpret_cast<const char*>(msg.data()));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure just means the interpreter is used
  return regex_ptr(code, pcre2_code_free);
}

void tokenizer::impl::set_id_bytes(int32_t id, std::string bytes) {
  if (size_t(id) >= id_bytes_.size()) id_bytes_.resize(size_t(id) + 1);
  id_bytes_[size_t(id)] = std::move(bytes);
  vocab_size_ = std::max(vocab_size_, id + 1);
}

result<void> tokenizer::impl::load_model(const json& root) {
  auto it = root.find("model");
  if (it == root.end() || it->is_null()) return bad(errc::missing_field, "missing field 'model'");
  const json& model = *it;
  if (!model.is_object())
    return bad(errc::bad_json, "field 'model' must be an object, not " + std::string(model.type_name()));
  if (auto t = model.find("type"); t != model.end() && !t->is_null()) {
    if (!t->is_string()) return bad(errc::bad_json, "field 'model.type' must be a string");
    if (t->get<std::string>() != "BPE")
      return bad(errc::unsupported, "field 'model.type' is '" + t->get<std::string>() +
                                        "'; only BPE is supported");
  }
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto s = model.find(f);
    if (s != model.end() && !s->is_null() && !(s->is_string() && s->get<std::string>().empty()))
      return bad(errc::unsupported, std::string("field 'model.") + f + "' is not supported");
  }
  auto ignore = get_bool(model, "ignore_merges", false, "model");
  if (!ignore) return std::unexpected(ignore.error());
  ignore_merges_ = *ignore;

  auto v = model.find("vocab");
  if (v == model.end()) return bad(errc::missing_field, "missing field 'model.vocab'");
  if (!v->is_object())
    return bad(errc::bad_json, "field 'model.vocab' must be an object, not " + std::string(v->type_name()));
  vocab_.reserve(v->size());
  for (auto e = v->begin(); e != v->end(); ++e) {
    const json& id = e.value();
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= max_token_id)
      return bad(errc::bad_value, "field 'model.vocab[\"" + e.key() +
                                      "\"]' must be an integer id in [0, 2^24)");
    auto tid = int32_t(id.get<int64_t>());
    vocab_.emplace(e.key(), tid);
    auto raw = symbols_to_bytes(e.key());
    set_id_bytes(tid, raw ? std::move(*raw) : e.key());  // non-byte-level tokens decode as text
  }
  for (int b = 0; b < 256; ++b) {
    auto f = vocab_.find(alphabet().utf8[b]);
    byte_id_[b] = f != vocab_.end() ? f->second : -1;
  }

  auto m = model.find("merges");
  if (m == model.end()) return bad(errc::missing_field, "missing field 'model.merges'");
  if (!m->is_array())
    return bad(errc::bad_json, "field 'model.merges' must be an array, not " + std::string(m->type_name()));
  merges_.reserve(m->size());
  for (size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    std::string field = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const auto& s = e.get_ref<const std::string&>();
      auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return bad(errc::bad_value, "field '" + field + "' must be \"left right\", got \"" + s + "\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return bad(errc::bad_json, "field '" + field + "' must be a string or a pair of strings");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    for (auto [iter, tok] : {std::pair{ia, a}, std::pair{ib, b}, std::pair{ic, a + b}})
      if (iter == vocab_.end())
        return bad(errc::bad_value, "field '" + field + "' needs token \"" + tok +
                                        "\" which is not in model.vocab");
    // Like HF, a repeated pair takes the later rank.
    merges_.insert_or_assign(pair_key(ia->second, ib->second), {int32_t(i), ic->second});
  }
  return {};
}

void tokenizer::impl::add_trie_token(const std::string& content, int32_t id) {
  int32_t node = 0;
  for (unsigned char b : content) {
    auto [it, inserted] = trie_edges_.try_emplace(uint64_t(node) << 8 | b, int32_t(trie_token_.size()));
    if (inserted) trie_token_.push_back(-1);
    node = it->second;
  }
  trie_token_[size_t(node)] = id;
  trie_first_[static_cast<unsigned char>(content[0])] = true;
}

result<void> tokenizer::impl::load_added_tokens(const json& root) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return {};
  if (!it->is_array()) return bad(errc::bad_json, "field 'added_tokens' must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad(errc::bad_json, "field '" + field + "' must be an object");
    auto id = t.find("id");
    auto content = t.find("content");
    if (id == t.end()) return bad(errc::missing_field, "missing field '" + field + ".id'");
    if (content == t.end()) return bad(errc::missing_field, "missing field '" + field + ".content'");
    if (!id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= max_token_id)
      return bad(errc::bad_value, "field '" + field + ".id' must be an integer id in [0, 2^24)");
    if (!content->is_string() || content->get_ref<const std::string&>().empty())
      return bad(errc::bad_json, "field '" + field + ".content' must be a non-empty string");
    const auto& text = content->get_ref<const std::string&>();
    auto tid = int32_t(id->get<int64_t>());
    added_.insert_or_assign(text, tid);
    if (added_ids_.size() <= size_t(tid)) added_ids_.resize(size_t(tid) + 1, false);
    added_ids_[size_t(tid)] = true;
    add_trie_token(text, tid);
    set_id_bytes(tid, text);  // added tokens decode to their content
  }
  return {};
}

result<pre_step> tokenizer::impl::load_pre_step(const json& node, const std::string& field) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string())
    return bad(errc::bad_json, "field '" + field + "' must be an object with a string 'type'");
  std::string type = node["type"].get<std::string>();
  pre_step step;
  if (type == "ByteLevel") {
    auto prefix = get_bool(node, "add_prefix_space", true, field);  // HF's defaults
    if (!prefix) return std::unexpected(prefix.error());
    auto use_regex = get_bool(node, "use_regex", true, field);
    if (!use_regex) return std::unexpected(use_regex.error());
    step.add_prefix_space = *prefix;
    if (*use_regex) {
      auto re = compile_regex(gpt2_pattern, false, field + " (GPT-2 regex)");
      if (!re) return std::unexpected(re.error());
      step.regex = *re;
    }
    return step;
  }
  if (type != "Split")
    return bad(errc::unsupported, "field '" + field + ".type' is '" + type +
                                      "'; supported: Sequence, Split, ByteLevel");
  auto pattern = node.find("pattern");
  if (pattern == node.end()) return bad(errc::missing_field, "missing field '" + field + ".pattern'");
  bool literal = pattern->is_object() && pattern->contains("String");
  const char* kind = literal ? "String" : "Regex";
  if (!pattern->is_object() || !pattern->contains(kind) || !(*pattern)[kind].is_string())
    return bad(errc::bad_json,
               "field '" + field + ".pattern' must be {\"Regex\": str} or {\"String\": str}");
  auto re = compile_regex((*pattern)[kind].get<std::string>(), literal, field + ".pattern");
  if (!re) return std::unexpected(re.error());
  step.regex = *re;
  static const std::unordered_map<std::string, split_behavior> behaviors = {
      {"Removed", split_behavior::removed},
      {"Isolated", split_behavior::isolated},
      {"MergedWithPrevious", split_behavior::merged_with_previous},
      {"MergedWithNext", split_behavior::merged_with_next},
      {"Contiguous", split_behavior::contiguous}};
  auto beh = node.find("behavior");
  if (beh == node.end() || !beh->is_string() || !behaviors.contains(beh->get<std::string>()))
    return bad(errc::bad_value, "field '" + field + ".behavior' must be one of Removed, Isolated, "
                                "MergedWithPrevious, MergedWithNext, Contiguous");
  step.behavior = behaviors.at(beh->get<std::string>());
  auto invert = get_bool(node, "invert", false, field);
  if (!invert) return std::unexpected(invert.error());
  step.invert = *invert;
  return step;
}

result<void> tokenizer::impl::load_pre_tokenizer(const json& root) {
  auto it = root.find("pre_tokenizer");
  if (it == root.end() || it->is_null()) return {};
  if (it->is_object() && it->value("type", json()) == "Sequence") {
    auto list = it->find("pretokenizers");
    if (list == it->end() || !list->is_array())
      return bad(errc::bad_json, "field 'pre_tokenizer.pretokenizers' must be an array");
    for (size_t i = 0; i < list->size(); ++i) {
      auto step = load_pre_step((*list)[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
      if (!step) return std::unexpected(step.error());
      steps_.push_back(std::move(*step));
    }
    return {};
  }
  auto step = load_pre_step(*it, "pre_tokenizer");
  if (!step) return std::unexpected(step.error());
  steps_.push_back(std::move(*step));
  return {};
}

// Normalizers and decoders other than the identity / ByteLevel would change the text in ways
// this implementation does not reproduce, so they are refused rather than silently ignored.
result<void> tokenizer::impl::check_unsupported(const json& root) {
  if (auto n = root.find("normalizer"); n != root.end() && !n->is_null()) {
    bool empty_sequence = n->is_object() && n->value("type", json()) == "Sequence" &&
                          n->contains("normalizers") && (*n)["normalizers"].is_array() &&
                          (*n)["normalizers"].empty();
    if (!empty_sequence)
      return bad(errc::unsupported, "field 'normalizer' is not supported (only null or empty Sequence)");
  }
  if (auto d = root.find("decoder"); d != root.end() && !d->is_null()) {
    if (!d->is_object() || d->value("type", json()) != "ByteLevel")
      return bad(errc::unsupported, "field 'decoder' is not supported (only ByteLevel)");
  }
  return {};
}

result<void> tokenizer::impl::load_config(const std::string& path) {
  auto text = read_file(path);
  if (!text) return fail(errc::io, path + ": cannot read file");
  json cfg = json::parse(*text, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object())
    return fail(errc::bad_json, path + ": not a valid JSON object");
  auto token_of = [&](const char* name, int32_t& id) -> result<void> {
    auto f = cfg.find(name);
    if (f == cfg.end() || f->is_null()) return {};
    const json* content = &*f;
    if (f->is_object()) {
      auto c = f->find("content");
      if (c == f->end())
        return fail(errc::missing_field, path + ": missing field '" + name + ".content'");
      content = &*c;
    }
    if (!content->is_string())
      return fail(errc::bad_json, path + ": field '" + name + "' must be a string or {content}");
    auto t = added_.find(content->get<std::string>());
    if (t != added_.end()) {
      id = t->second;
    } else if (auto v = vocab_.find(content->get<std::string>()); v != vocab_.end()) {
      id = v->second;
    }
    return {};
  };
  if (auto r = token_of("bos_token", bos_id_); !r) return r;
  if (auto r = token_of("eos_token", eos_id_); !r) return r;
  if (auto ct = cfg.find("chat_template"); ct != cfg.end() && !ct->is_null()) {
    if (ct->is_string()) {
      chat_template_ = ct->get<std::string>();
    } else if (ct->is_array()) {  // [{name, template}, ...]: take "default", else the first
      for (const auto& e : *ct) {
        if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
        if (chat_template_.empty() || e.value("name", json()) == "default")
          chat_template_ = e["template"].get<std::string>();
      }
    } else {
      return fail(errc::bad_json, path + ": field 'chat_template' must be a string");
    }
  }
  return {};
}

// ------------------------------------------------------------------------------------------
// Encoding

// Finds added tokens leftmost-longest; the text between them goes through pre-tokenizer + BPE.
void tokenizer::impl::encode_text(std::string_view text, std::vector<int32_t>& out,
                                  pcre2_match_data* md) const {
  size_t plain_begin = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t node = 0, best_id = -1;
    size_t best_end = 0;
    bool may_match = trie_first_[static_cast<unsigned char>(text[i])];  // cheap pre-filter
    for (size_t j = i; may_match && j < text.size(); ++j) {
      auto e = trie_edges_.find(uint64_t(node) << 8 | static_cast<unsigned char>(text[j]));
      if (e == trie_edges_.end()) break;
      node = e->second;
      if (trie_token_[size_t(node)] >= 0) {
        best_id = trie_token_[size_t(node)];
        best_end = j + 1;
      }
    }
    if (best_id < 0) {
      ++i;
      continue;
    }
    encode_valid(text.substr(plain_begin, i - plain_begin), out, md);
    out.push_back(best_id);
    i = plain_begin = best_end;
  }
  encode_valid(text.substr(plain_begin), out, md);
}

// Pre-tokenizes and BPE-encodes text without added tokens. Invalid UTF-8 bytes (which HF cannot
// receive) become single-byte words so that any byte string still round-trips.
void tokenizer::impl::encode_valid(std::string_view text, std::vector<int32_t>& out,
                                   pcre2_match_data* md) const {
  std::vector<std::string_view> cur, next;
  std::vector<segment> segs;
  std::deque<std::string> owned;  // pieces given a prefix space
  size_t run_begin = 0;
  auto flush_run = [&](std::string_view run) {
    if (run.empty()) return;
    cur.assign(1, run);
    for (const auto& step : steps_) {
      next.clear();
      for (std::string_view piece : cur) {
        if (step.add_prefix_space && piece.front() != ' ')
          piece = owned.emplace_back(" " + std::string(piece));
        if (step.regex) {
          split_piece(step, piece, md, segs, next);
        } else {
          next.push_back(piece);
        }
      }
      std::swap(cur, next);
    }
    for (std::string_view w : cur) encode_word(w, out);
  };
  for (size_t i = 0; i < text.size();) {
    size_t n = utf8_char_len(text, i);
    if (n > 0) {
      i += n;
      continue;
    }
    flush_run(text.substr(run_begin, i - run_begin));
    encode_word(text.substr(i, 1), out);
    run_begin = ++i;
  }
  flush_run(text.substr(run_begin));
}

// Splits one piece by the step's regex into (non-)match segments and combines them per the
// HF split behavior. The piece is the whole subject, so lookarounds stop at its edges as in HF.
void tokenizer::impl::split_piece(const pre_step& step, std::string_view piece,
                                  pcre2_match_data* md, std::vector<segment>& segs,
                                  std::vector<std::string_view>& out) const {
  segs.clear();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t n = piece.size(), off = 0, prev = 0;
  while (off < n) {
    // Runs are validated UTF-8 already; a JIT stack overflow falls back to the interpreter.
    uint32_t opts = PCRE2_NO_UTF_CHECK;
    int rc = pcre2_match(step.regex.get(), subject, n, off, opts, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(step.regex.get(), subject, n, off, opts | PCRE2_NO_JIT, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) rc = PCRE2_ERROR_NOMATCH;  // limits hit: no split
    if (rc == PCRE2_ERROR_NOMATCH) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    if (e <= s) {  // empty match: skip one char
      if (s >= n) break;
      off = s + std::max<size_t>(1, utf8_char_len(piece, s));
      continue;
    }
    if (s > prev) segs.push_back({prev, s, false});
    segs.push_back({s, e, true});
    prev = off = e;
  }
  if (prev < n) segs.push_back({prev, n, false});
  if (step.invert)
    for (auto& sg : segs) sg.is_match = !sg.is_match;

  // Combine as HF's SplitDelimiterBehavior does; MergedWithNext is MergedWithPrevious run
  // backwards.
  auto behavior = step.behavior;
  bool backwards = behavior == split_behavior::merged_with_next;
  if (backwards) std::reverse(segs.begin(), segs.end());
  size_t first_out = out.size();
  bool prev_match = false, have = false;
  for (const auto& sg : segs) {
    std::string_view text = piece.substr(sg.begin, sg.end - sg.begin);
    bool join = false;
    if (behavior == split_behavior::removed && sg.is_match) continue;
    if (behavior == split_behavior::merged_with_previous || backwards)
      join = have && sg.is_match && !prev_match;
    if (behavior == split_behavior::contiguous) join = have && sg.is_match == prev_match;
    if (join) {  // segments are adjacent in piece, so joining is widening the view
      std::string_view& last = out.back();
      const char* b = std::min(last.data(), text.data());
      last = {b, last.size() + text.size()};
    } else {
      out.push_back(text);
    }
    prev_match = sg.is_match;
    have = true;
  }
  if (backwards) std::reverse(out.begin() + long(first_out), out.end());
}

void tokenizer::impl::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    int32_t id = byte_id_[static_cast<unsigned char>(word[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  bool cacheable = word.size() <= max_cached_word_bytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) return (void)out.insert(out.end(), it->second.begin(), it->second.end());
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= max_cache_entries) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

// Rank-ordered BPE over the word's bytes: repeatedly merges the adjacent pair with the lowest
// merge rank (leftmost on ties), using a heap of candidate pairs validated lazily.
std::vector<int32_t> tokenizer::impl::merge_word(std::string_view word) const {
  if (auto it = ignore_merges_ ? vocab_.find(bytes_to_symbols(word)) : vocab_.end(); it != vocab_.end())
    return {it->second};  // HF's ignore_merges: a word already in the vocab is one token
  struct symbol { int32_t id, prev, next; bool alive; };
  std::vector<symbol> syms;
  syms.reserve(word.size());
  for (unsigned char b : word) {
    if (byte_id_[b] < 0) continue;  // no unk token: HF drops unknown symbols
    auto i = int32_t(syms.size());
    syms.push_back({byte_id_[b], i - 1, i + 1, true});
  }
  if (!syms.empty()) syms.back().next = -1;

  struct candidate {
    int32_t rank, pos, right, left_id, right_id, result;
    bool operator>(const candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<candidate, std::vector<candidate>, std::greater<>> heap;
  auto push_pair = [&](int32_t l) {
    if (l < 0 || syms[size_t(l)].next < 0) return;
    int32_t r = syms[size_t(l)].next;
    const auto* m = merges_.find(pair_key(syms[size_t(l)].id, syms[size_t(r)].id));
    if (m) heap.push({m->rank, l, r, syms[size_t(l)].id, syms[size_t(r)].id, m->result});
  };
  for (int32_t i = 0; i + 1 < int32_t(syms.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    candidate c = heap.top();
    heap.pop();
    symbol& l = syms[size_t(c.pos)];
    if (!l.alive || l.next != c.right || l.id != c.left_id) continue;
    symbol& r = syms[size_t(c.right)];
    if (!r.alive || r.id != c.right_id) continue;
    l.id = c.result;
    l.next = r.next;
    r.alive = false;
    if (r.next >= 0) syms[size_t(r.next)].prev = c.pos;
    push_pair(l.prev);
    push_pair(c.pos);
  }
  std::vector<int32_t> ids;
  for (const auto& s : syms)
    if (s.alive) ids.push_back(s.id);
  return ids;
}

// ------------------------------------------------------------------------------------------
// Public interface

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

result<tokenizer> tokenizer::parse(std::string_view tokenizer_json, const std::string& file) {
  auto p = std::make_unique<impl>();
  p->file_ = file;
  json root;
  try {
    root = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return fail(errc::bad_json, file + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) return fail(errc::bad_json, file + ": top level must be a JSON object");
  try {
    if (auto r = p->check_unsupported(root); !r) return std::unexpected(r.error());
    if (auto r = p->load_model(root); !r) return std::unexpected(r.error());
    if (auto r = p->load_added_tokens(root); !r) return std::unexpected(r.error());
    if (auto r = p->load_pre_tokenizer(root); !r) return std::unexpected(r.error());
  } catch (const std::exception& e) {  // a type case the checks above missed: still an error value
    return fail(errc::bad_json, file + ": " + e.what());
  }
  return tokenizer(std::move(p));
}

result<tokenizer> tokenizer::load(const std::string& tokenizer_json_path) {
  errno = 0;
  auto text = read_file(tokenizer_json_path);
  if (!text) return fail(errc::io, tokenizer_json_path + ": cannot read file: " + std::strerror(errno));
  auto tok = parse(*text, tokenizer_json_path);
  if (!tok) return tok;
  std::error_code ec;
  auto config = std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config, ec)) {
    try {
      if (auto r = tok->impl_->load_config(config.string()); !r) return std::unexpected(r.error());
    } catch (const std::exception& e) {
      return fail(errc::bad_json, config.string() + ": " + e.what());
    }
  }
  return tok;
}

std::vector<int32_t> tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  // One output pair suffices: only the whole match (group 0) is read.
  match_data_ptr md(pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  impl_->encode_text(text, out, md.get());
  return out;
}

std::string tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids)
    if (id >= 0 && size_t(id) < impl_->id_bytes_.size()) out += impl_->id_bytes_[size_t(id)];
  return out;
}

std::string tokenizer::decode_token(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->id_bytes_.size()) return {};
  return impl_->id_bytes_[size_t(id)];
}

int32_t tokenizer::vocab_size() const { return impl_->vocab_size_; }
int32_t tokenizer::bos_id() const { return impl_->bos_id_; }
int32_t tokenizer::eos_id() const { return impl_->eos_id_; }
const std::string& tokenizer::chat_template() const { return impl_->chat_template_; }

bool tokenizer::is_added(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->added_ids_.size()) return false;
  return impl_->added_ids_[size_t(id)];
}

int32_t tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_.find(token); it != impl_->added_.end()) return it->second;
  if (auto it = impl_->vocab_.find(token); it != impl_->vocab_.end()) return it->second;
  return -1;
}

}  // namespace shoal::model
