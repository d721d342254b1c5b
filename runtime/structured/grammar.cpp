// The grammar engine's core: the builder (UTF-8 code point sets, repetition), the checks and
// flattening, the vocabulary, the per-position mask walk and the pushdown matcher. The front
// ends (JSON schema, regex, EBNF) are in grammar_*.cpp.
#include "runtime/structured/grammar.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace shoal::runtime {

const char* to_string(constraint_kind k) {
  switch (k) {
    case constraint_kind::none: return "none";
    case constraint_kind::json_schema: return "json_schema";
    case constraint_kind::json_object: return "json_object";
    case constraint_kind::regex: return "regex";
    case constraint_kind::ebnf: return "ebnf";
    case constraint_kind::tool_calls: return "tool_calls";
  }
  return "none";
}

std::optional<constraint_kind> constraint_kind_from(std::string_view name) {
  for (auto k : {constraint_kind::none, constraint_kind::json_schema, constraint_kind::json_object,
                 constraint_kind::regex, constraint_kind::ebnf, constraint_kind::tool_calls})
    if (name == to_string(k)) return k;
  return std::nullopt;
}

std::optional<constraint_kind> constraint_kind_from_byte(uint8_t b) {
  if (b > static_cast<uint8_t>(constraint_kind::tool_calls)) return std::nullopt;
  return static_cast<constraint_kind>(b);
}

// -- builder ------------------------------------------------------------------------------------

uint32_t grammar_builder::rule(std::string name) {
  alts_.emplace_back();
  names_.push_back(std::move(name));
  return static_cast<uint32_t>(alts_.size() - 1);
}

void grammar_builder::alt(uint32_t r, sequence s) { alts_[r].push_back(std::move(s)); }

grammar_builder::item grammar_builder::cls(const grammar::byte_class& c) {
  std::string key(reinterpret_cast<const char*>(c.data()), sizeof c);
  auto [it, fresh] = class_index_.try_emplace(key, static_cast<uint32_t>(classes_.size()));
  if (fresh) classes_.push_back(c);
  return {grammar::kind::bytes, it->second};
}

grammar_builder::item grammar_builder::byte(uint8_t b) {
  grammar::byte_class c{};
  c[b >> 6] |= uint64_t{1} << (b & 63);
  return cls(c);
}

void grammar_builder::append_literal(sequence& out, std::string_view bytes) {
  for (char ch : bytes) out.push_back(byte(static_cast<uint8_t>(ch)));
}

grammar_builder::sequence grammar_builder::literal(std::string_view bytes) {
  sequence s;
  append_literal(s, bytes);
  return s;
}

uint32_t grammar_builder::embed(const grammar& g, const std::string& prefix) {
  const auto base = static_cast<uint32_t>(alts_.size());
  for (const auto& n : g.names) rule(prefix + n);
  for (size_t r = 0; r < g.alts.size(); ++r)
    for (uint32_t at : g.alts[r]) {
      sequence s;
      for (; g.elements[at].k != grammar::kind::end; ++at) {
        const auto& e = g.elements[at];
        s.push_back(e.k == grammar::kind::bytes ? cls(g.classes[e.arg]) : ref(base + e.arg));
      }
      alt(base + static_cast<uint32_t>(r), std::move(s));
    }
  return base + g.root;
}

std::string special_token_bytes(std::string_view token_text) { return "\xFF" + std::string(token_text); }

namespace {

grammar::byte_class byte_range(uint8_t lo, uint8_t hi) {
  grammar::byte_class c{};
  for (unsigned b = lo; b <= hi; ++b) c[b >> 6] |= uint64_t{1} << (b & 63);
  return c;
}

size_t utf8_encode(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

// Splits [lo, hi] (one UTF-8 length) until every byte position is an independent range, then
// emits the byte-range sequence (the utf8-ranges construction).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  uint8_t a[4], b[4];
  const size_t n = utf8_encode(lo, a);
  for (size_t i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  utf8_encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

}  // namespace

uint32_t grammar_builder::codepoints(std::vector<std::pair<uint32_t, uint32_t>> ranges, std::string name) {
  // Sorted, merged, surrogates and out-of-range removed, split at the UTF-8 length bounds.
  std::vector<std::pair<uint32_t, uint32_t>> in;
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {
      if (hi > 0xDFFF) in.emplace_back(0xE000, hi);
      hi = 0xD7FF;
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi <= 0xDFFF) continue;
      lo = 0xE000;
    }
    in.emplace_back(lo, hi);
  }
  std::sort(in.begin(), in.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto r : in)
    if (!merged.empty() && r.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, r.second);
    else merged.push_back(r);
  const uint32_t r = rule(std::move(name));
  grammar::byte_class ascii{};
  bool any_ascii = false;
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (auto [lo, hi] : merged) {
    for (uint32_t bound : {0x7Fu, 0x7FFu, 0xFFFFu, 0x10FFFFu}) {
      if (lo > hi) break;
      if (lo > bound) continue;
      const uint32_t top = std::min(hi, bound);
      if (bound == 0x7F) {
        auto c = byte_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(top));
        for (size_t w = 0; w < 4; ++w) ascii[w] |= c[w];
        any_ascii = true;
      } else {
        utf8_sequences(lo, top, seqs);
      }
      lo = top + 1;
    }
  }
  if (any_ascii) alt(r, {cls(ascii)});
  for (const auto& s : seqs) {
    sequence q;
    for (auto [a, b] : s) q.push_back(cls(byte_range(a, b)));
    alt(r, std::move(q));
  }
  return r;
}

uint32_t grammar_builder::repeat(uint32_t body, int64_t min, int64_t max, const std::string& name) {
  const uint32_t r = rule(name);
  sequence head;
  for (int64_t i = 0; i < min; ++i) head.push_back(ref(body));
  if (max < 0) {
    const uint32_t star = rule(name + "*");
    alt(star, {ref(body), ref(star)});
    alt(star, {});
    head.push_back(ref(star));
  } else if (max > min) {
    // opt_k: up to k more, as a right-nested chain.
    uint32_t next = rule(name + "?");
    alt(next, {ref(body)});
    alt(next, {});
    for (int64_t k = 2; k <= max - min; ++k) {
      const uint32_t opt = rule(name + "?");
      alt(opt, {ref(body), ref(next)});
      alt(opt, {});
      next = opt;
    }
    head.push_back(ref(next));
  }
  alt(r, std::move(head));
  return r;
}

uint32_t grammar_builder::choice(std::vector<sequence> alts, std::string name) {
  const uint32_t r = rule(std::move(name));
  for (auto& a : alts) alt(r, std::move(a));
  return r;
}

std::optional<grammar_error> grammar_builder::finish(uint32_t root, grammar& out) const {
  constexpr size_t max_elements = 4'000'000;
  const size_t n = alts_.size();
  for (size_t r = 0; r < n; ++r)
    if (alts_[r].empty()) return grammar_error{"rule '" + names_[r] + "' has no alternative", ""};
  // Nullable rules (fixpoint), then left recursion: an edge r → s when s can come first in r.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const auto& s : alts_[r]) {
        bool all = std::all_of(s.begin(), s.end(), [&](const item& it) { return it.k == grammar::kind::rule && nullable[it.arg]; });
        if (all) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<uint32_t>> first(n);
  size_t total = 0;
  for (size_t r = 0; r < n; ++r)
    for (const auto& s : alts_[r]) {
      total += s.size() + 1;
      for (const item& it : s) {
        if (it.k != grammar::kind::rule) break;
        first[r].push_back(it.arg);
        if (!nullable[it.arg]) break;
      }
    }
  if (total > max_elements)
    return grammar_error{"grammar too large: " + std::to_string(total) + " elements, at most " + std::to_string(max_elements), ""};
  std::vector<uint8_t> mark(n, 0);  // 0 new, 1 on the path, 2 done
  std::optional<grammar_error> err;
  std::vector<std::pair<uint32_t, size_t>> path;  // iterative DFS
  for (uint32_t s0 = 0; s0 < n && !err; ++s0) {
    if (mark[s0]) continue;
    path.emplace_back(s0, 0);
    mark[s0] = 1;
    while (!path.empty() && !err) {
      auto& [r, i] = path.back();
      if (i < first[r].size()) {
        const uint32_t s = first[r][i++];
        if (mark[s] == 1) err = grammar_error{"rule '" + names_[s] + "' can recurse without consuming input", ""};
        else if (mark[s] == 0) {
          mark[s] = 1;
          path.emplace_back(s, 0);
        }
      } else {
        mark[r] = 2;
        path.pop_back();
      }
    }
  }
  if (err) return err;
  out = grammar{};
  out.classes = classes_;
  out.names = names_;
  out.root = root;
  out.alts.resize(n);
  out.elements.reserve(total);
  for (size_t r = 0; r < n; ++r)
    for (const auto& s : alts_[r]) {
      out.alts[r].push_back(static_cast<uint32_t>(out.elements.size()));
      for (const item& it : s) out.elements.push_back({it.k, it.arg});
      out.elements.push_back({grammar::kind::end, 0});
    }
  return std::nullopt;
}

std::optional<grammar_error> compile(const constraint_spec& spec, grammar& out) {
  switch (spec.kind) {
    case constraint_kind::json_schema: return compile_json_schema(spec.source, out);
    case constraint_kind::json_object: return compile_json_object(out);
    case constraint_kind::regex: return compile_regex(spec.source, out);
    case constraint_kind::ebnf: return compile_ebnf(spec.source, out);
    case constraint_kind::tool_calls: return compile_tool_calls(spec.source, out);
    case constraint_kind::none: break;
  }
  return grammar_error{"no constraint to compile", ""};
}

// -- vocabulary ---------------------------------------------------------------------------------

token_vocab::token_vocab(std::vector<std::string> bytes, std::vector<bool> special, int32_t eos_id)
    : bytes_(std::move(bytes)), special_(std::move(special)), eos_(eos_id) {
  special_.resize(bytes_.size(), false);
  // A 0xFF byte only ever opens a special token's spelling (special_token_bytes): any other
  // token holding one (a raw byte of a byte-level vocabulary) could spell such a token out.
  const auto usable = [](const std::string& b) {
    const size_t ff = b.find('\xFF');
    return ff == std::string::npos || (ff == 0 && b.size() > 1 && b.find('\xFF', 1) == std::string::npos);
  };
  for (size_t i = 0; i < bytes_.size(); ++i) {
    if (!usable(bytes_[i])) special_[i] = true;
    if (!special_[i] && !bytes_[i].empty() && static_cast<int32_t>(i) != eos_) sorted_.push_back(static_cast<int32_t>(i));
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)];
  });
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const auto& a = bytes_[static_cast<size_t>(sorted_[i - 1])];
    const auto& b = bytes_[static_cast<size_t>(sorted_[i])];
    uint32_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
    lcp_[i] = l;
  }
}

std::shared_ptr<const token_vocab> make_token_vocab(const model::tokenizer& tok, int32_t vocab_size, int32_t eos_id) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  std::vector<bool> special(static_cast<size_t>(vocab_size), false);
  for (int32_t i = 0; i < vocab_size; ++i) {
    std::string b = tok.decode_token(i);
    if (tok.is_added(i) && !b.empty() && i != eos_id) b = special_token_bytes(b);
    else special[static_cast<size_t>(i)] = tok.is_added(i) || b.find('\xFF') != std::string::npos;
    bytes[static_cast<size_t>(i)] = std::move(b);
  }
  return std::make_shared<const token_vocab>(std::move(bytes), std::move(special), eos_id);
}

compiled_grammar::compiled_grammar(grammar gr, std::shared_ptr<const token_vocab> v)
    : g(std::move(gr)), vocab(std::move(v)) {}

std::variant<std::shared_ptr<compiled_grammar>, grammar_error> compile_for(const constraint_spec& spec,
                                                                          std::shared_ptr<const token_vocab> vocab) {
  grammar g;
  if (auto err = compile(spec, g)) return *err;
  return std::make_shared<compiled_grammar>(std::move(g), std::move(vocab));
}

// -- stacks -------------------------------------------------------------------------------------

namespace {

constexpr uint32_t bottom = 0xFFFFFFFFu;  // below the root: ending there is a whole match
constexpr uint32_t sentinel = 0xFFFFFFFEu;  // a mask walk's rule boundary: ending there leaves it

// Stack frames (position, parent frame), hash-consed so equal stacks are equal ids: an
// open-addressing table of node ids (linear probing, at most half full). Frames are only ever
// dropped newest first (truncate), so clearing a slot never breaks another key's probe path:
// every key still there was inserted earlier and stopped before that slot was taken.
struct arena {
  struct node {
    uint32_t pos, parent;
  };
  static constexpr uint32_t empty = 0xFFFFFFFFu;
  std::vector<node> nodes;
  std::vector<uint32_t> slots;  // power-of-two size
  static size_t hash(uint32_t pos, uint32_t parent) {
    uint64_t k = (uint64_t{pos} << 32) | parent;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  uint32_t make(uint32_t pos, uint32_t parent) {
    if (2 * (nodes.size() + 1) > slots.size()) grow();
    const size_t mask = slots.size() - 1;
    for (size_t i = hash(pos, parent) & mask;; i = (i + 1) & mask) {
      const uint32_t id = slots[i];
      if (id == empty) {
        slots[i] = static_cast<uint32_t>(nodes.size());
        nodes.push_back({pos, parent});
        return slots[i];
      }
      if (nodes[id].pos == pos && nodes[id].parent == parent) return id;
    }
  }
  void grow() {
    slots.assign(std::max<size_t>(64, 2 * slots.size()), empty);
    const size_t mask = slots.size() - 1;
    for (uint32_t id = 0; id < nodes.size(); ++id) {  // in insertion order: the invariant holds again
      size_t i = hash(nodes[id].pos, nodes[id].parent) & mask;
      while (slots[i] != empty) i = (i + 1) & mask;
      slots[i] = id;
    }
  }
  size_t mark() const { return nodes.size(); }
  void truncate(size_t m) {
    const size_t mask = slots.size() - 1;
    for (size_t id = nodes.size(); id-- > m;) {
      size_t i = hash(nodes[id].pos, nodes[id].parent) & mask;
      while (slots[i] != id) i = (i + 1) & mask;
      slots[i] = empty;
    }
    nodes.resize(m);
  }
};

// A matcher state: the live stacks (each top at a byte class), and whether the bytes so far
// end a whole match (or, in a walk, left the rule).
struct state {
  std::vector<uint32_t> tops;
  bool complete = false;
  bool escaped = false;
  bool eos = false;  // the eos token was accepted: nothing follows
};

class runner {
 public:
  runner(const grammar& g, arena& a) : g_(g), a_(a) {}

  // Expands `node` until every stack's top is a byte class, into `out`.
  void expand(uint32_t node, state& out) {
    work_.clear();
    work_.push_back(node);
    while (!work_.empty()) {
      const uint32_t n = work_.back();
      work_.pop_back();
      const auto [pos, parent] = a_.nodes[n];
      const grammar::element e = g_.elements[pos];
      if (e.k == grammar::kind::bytes) {
        out.tops.push_back(n);
      } else if (e.k == grammar::kind::end) {
        if (parent == bottom) out.complete = true;
        else if (parent == sentinel) out.escaped = true;
        else work_.push_back(parent);
      } else {
        const uint32_t ret = pos + 1;  // a tail call keeps no frame
        const uint32_t base = g_.elements[ret].k == grammar::kind::end ? parent : a_.make(ret, parent);
        for (uint32_t s : g_.alts[e.arg]) work_.push_back(a_.make(s, base));
      }
    }
  }
  static void normalise(state& s) {
    std::sort(s.tops.begin(), s.tops.end());
    s.tops.erase(std::unique(s.tops.begin(), s.tops.end()), s.tops.end());
  }
  // The state after byte b.
  void advance(const state& from, uint8_t b, state& out) {
    out.tops.clear();
    out.complete = out.escaped = out.eos = false;
    for (uint32_t n : from.tops) {
      const auto [pos, parent] = a_.nodes[n];
      if (!grammar::has(g_.classes[g_.elements[pos].arg], b)) continue;
      expand(a_.make(pos + 1, parent), out);
    }
    normalise(out);
  }
  state initial(uint32_t root) {
    state s;
    for (uint32_t st : g_.alts[root]) expand(a_.make(st, bottom), s);
    normalise(s);
    return s;
  }

 private:
  const grammar& g_;
  arena& a_;
  std::vector<uint32_t> work_;
};

void set_bit(std::span<uint64_t> m, int32_t id) { m[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }
bool get_bit(std::span<const uint64_t> m, int32_t id) { return (m[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }

enum class verdict : uint8_t { rejected, accepted, uncertain };

// Walks the tokens `ids` (in byte order; lcp(i): the bytes ids[i] shares with ids[i − 1]) from
// `start`, sharing the states of common prefixes, and calls out(id, verdict) for each token that
// is not rejected: accepted when its whole byte string goes through (or ends exactly where a
// path leaves the walk's frames or the grammar ends), uncertain when a path left the frames
// (past the sentinel) before its last byte. A prefix that dies decides the tokens after it
// that share it without stepping further.
template <class Lcp, class Out>
void walk_tokens(runner& run, const state& start, const token_vocab& v, std::span<const int32_t> ids, Lcp lcp, Out out) {
  std::vector<state> depth(1, start);
  std::vector<uint8_t> left_at(1, 0), left_upto(1, 0), done_at(1, 0);
  size_t valid = 0;  // depth[0..valid] hold the previous token's prefix states
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& t = v.bytes(ids[i]);
    const size_t len = t.size();
    size_t d = std::min<size_t>(i == 0 ? 0 : lcp(i), valid);
    if (depth.size() < len + 1) {
      depth.resize(len + 1);
      left_at.resize(len + 1);
      left_upto.resize(len + 1);
      done_at.resize(len + 1);
    }
    while (d < len && !depth[d].tops.empty()) {
      run.advance(depth[d], static_cast<uint8_t>(t[d]), depth[d + 1]);
      left_at[d + 1] = depth[d + 1].escaped ? 1 : 0;
      done_at[d + 1] = depth[d + 1].complete ? 1 : 0;
      left_upto[d + 1] = static_cast<uint8_t>(left_upto[d] | left_at[d + 1]);
      ++d;
    }
    valid = d;
    if (d == len && (!depth[len].tops.empty() || left_at[len] || done_at[len])) out(ids[i], verdict::accepted);
    else if (d == len ? len > 1 && left_upto[len - 1] : left_upto[d] != 0) out(ids[i], verdict::uncertain);
  }
}

// Frames of the mask context: the top of a stack and the frames under it, at most this many.
// Four cover a code point inside a string or number rule, the rule's own frames (a string's
// closing quote) and the sequence it is in (a property's comma), so only tokens that run past
// that are left uncertain. Measured with `shoal bench grammar` (DeepSeek-V3 vocabulary, cached
// contexts): mask p50 66 us with 3 frames, 38 us with 4, 40 us with 6.
constexpr size_t context_frames = 4;

// The walk of the whole sorted vocabulary from a context (frames top first; under the last
// one the sentinel, or the bottom when the stack ends there).
compiled_grammar::position_mask walk_context(const grammar& g, const token_vocab& v, std::span<const uint32_t> frames,
                                             bool to_bottom, std::span<const int32_t> sorted,
                                             std::span<const uint32_t> lcp) {
  compiled_grammar::position_mask pm;
  pm.accepted.assign((static_cast<size_t>(v.size()) + 63) / 64, 0);
  arena a;
  runner run(g, a);
  uint32_t node = to_bottom ? bottom : sentinel;
  for (size_t j = frames.size(); j-- > 0;) node = a.make(frames[j], node);
  state start;
  start.tops.push_back(node);
  walk_tokens(run, start, v, sorted, [&](size_t i) { return lcp[i]; }, [&](int32_t id, verdict r) {
    if (r == verdict::accepted) set_bit(pm.accepted, id);
    else pm.uncertain.push_back(id);
  });
  return pm;
}

}  // namespace

// -- matcher ------------------------------------------------------------------------------------

struct grammar_matcher::impl {
  std::shared_ptr<compiled_grammar> cg;
  arena a;
  std::vector<state> history;  // history[0]: before any token
  std::vector<size_t> marks;   // arena size after each state

  // The cached mask of the context at the top of stack `node`.
  const compiled_grammar::position_mask& mask_at(uint32_t node) {
    uint32_t frames[context_frames];
    size_t n = 0;
    uint32_t f = node;
    for (; n < context_frames && f != bottom; f = a.nodes[f].parent) frames[n++] = a.nodes[f].pos;
    const bool to_bottom = f == bottom;
    std::string key(reinterpret_cast<const char*>(frames), n * sizeof(uint32_t));
    key.push_back(to_bottom ? 'b' : 's');
    auto it = cg->cache.find(key);
    if (it == cg->cache.end()) {
      it = cg->cache.emplace(std::move(key), walk_context(cg->g, *cg->vocab, std::span(frames, n), to_bottom,
                                                          cg->vocab->sorted_, cg->vocab->lcp_))
             .first;
      ++cg->cache_walks;
    }
    return it->second;
  }
  bool step_bytes(std::string_view bytes) {
    const size_t m = a.mark();
    runner run(cg->g, a);
    state cur = history.back(), next;
    if (cur.eos) return false;
    for (char ch : bytes) {
      if (cur.tops.empty()) {
        a.truncate(m);
        return false;
      }
      run.advance(cur, static_cast<uint8_t>(ch), next);
      std::swap(cur, next);
    }
    if (cur.tops.empty() && !cur.complete) {
      a.truncate(m);
      return false;
    }
    history.push_back(std::move(cur));
    marks.push_back(a.mark());
    return true;
  }
};

grammar_matcher::grammar_matcher(std::shared_ptr<compiled_grammar> g) : impl_(std::make_unique<impl>()) {
  impl_->cg = std::move(g);
  runner run(impl_->cg->g, impl_->a);
  impl_->history.push_back(run.initial(impl_->cg->g.root));
  impl_->marks.push_back(impl_->a.mark());
}

grammar_matcher::~grammar_matcher() = default;
grammar_matcher::grammar_matcher(grammar_matcher&&) noexcept = default;
grammar_matcher& grammar_matcher::operator=(grammar_matcher&&) noexcept = default;

bool grammar_matcher::accept_token(int32_t id) {
  auto& im = *impl_;
  const token_vocab& v = *im.cg->vocab;
  if (id < 0 || id >= v.size()) return false;
  if (id == v.eos_id()) {
    const state& s = im.history.back();
    if (!s.complete || s.eos) return false;
    state e;
    e.eos = true;
    im.history.push_back(std::move(e));
    im.marks.push_back(im.a.mark());
    return true;
  }
  if (v.special_[static_cast<size_t>(id)] || v.bytes(id).empty()) return false;
  return im.step_bytes(v.bytes(id));
}

bool grammar_matcher::accept_bytes(std::string_view bytes) { return impl_->step_bytes(bytes); }

void grammar_matcher::rollback(size_t n) {
  auto& im = *impl_;
  n = std::min(n, im.history.size() - 1);
  im.history.resize(im.history.size() - n);
  im.marks.resize(im.marks.size() - n);
  im.a.truncate(im.marks.back());
}

size_t grammar_matcher::history() const { return impl_->history.size() - 1; }

bool grammar_matcher::can_end() const { return impl_->history.back().complete; }

bool grammar_matcher::terminated() const {
  const state& s = impl_->history.back();
  return s.eos || (s.complete && s.tops.empty());
}

void grammar_matcher::fill_mask(std::span<uint64_t> mask) {
  auto& im = *impl_;
  std::fill(mask.begin(), mask.end(), 0);
  const state& s = im.history.back();
  if (s.eos) return;
  const token_vocab& v = *im.cg->vocab;
  const size_t m = im.a.mark();
  for (uint32_t n : s.tops) {
    const auto& pm = im.mask_at(n);
    for (size_t w = 0; w < mask.size() && w < pm.accepted.size(); ++w) mask[w] |= pm.accepted[w];
    if (pm.uncertain.empty()) continue;
    // The uncertain tokens (in byte order) walked from the whole stack.
    runner run(im.cg->g, im.a);
    state start;
    start.tops.push_back(n);
    const auto& u = pm.uncertain;
    walk_tokens(run, start, v, u,
                [&](size_t i) {
                  const std::string& p = v.bytes(u[i - 1]);
                  const std::string& q = v.bytes(u[i]);
                  size_t l = 0;
                  while (l < p.size() && l < q.size() && p[l] == q[l]) ++l;
                  return l;
                },
                [&](int32_t id, verdict r) {
                  if (r == verdict::accepted) set_bit(mask, id);
                });
    im.a.truncate(m);
  }
  if (s.complete && v.eos_id() >= 0 && v.eos_id() < v.size()) set_bit(mask, v.eos_id());
}

size_t grammar_matcher::apply_mask(std::span<float> logits) {
  const token_vocab& v = *impl_->cg->vocab;
  std::vector<uint64_t> mask((static_cast<size_t>(v.size()) + 63) / 64);
  fill_mask(mask);
  size_t left = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (i >= static_cast<size_t>(v.size()) || !get_bit(mask, static_cast<int32_t>(i)))
      logits[i] = -std::numeric_limits<float>::infinity();
    else
      ++left;
  return left;
}

}  // namespace shoal::runtime
