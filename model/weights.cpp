// The one list of checkpoint tensors (names and shapes of model/README.md) and the loader
// that fills model_weights from a checkpoint through it.
#include "model/weights.hpp"

#include <sys/mman.h>

#include <cmath>
#include <cstdio>
#include <numbers>
#include <optional>
#include <algorithm>
#include <map>

#include "kernels/assert.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/safetensors.hpp"

namespace shoal::model {
namespace {

using visit_fn = std::function<void(const tensor_slot&)>;

void vec(const visit_fn& fn, std::vector<float>& v, const std::string& name, int64_t n,
         init_kind kind) {
  v.assign(static_cast<size_t>(n), 0.0f);
  fn({name, {n}, kind, v.data()});
}

// A slot the loader keeps in checkpoint precision: unallocated until slot_storage().
tensor_slot narrow_slot(const std::string& name, std::vector<int64_t> shape, init_kind kind, linear& l,
                        int64_t offset = 0, bool shared = false) {
  tensor_slot t{name, std::move(shape), kind, nullptr};
  t.narrowable = &l, t.offset = offset, t.shared = shared;
  return t;
}

// narrow: the loader keeps it in checkpoint precision (tensor_slot::narrowable).
void lin(const visit_fn& fn, linear& l, const std::string& name, int64_t out, int64_t in, bool narrow = false) {
  l.out = out, l.in = in;
  l.w.clear(), l.w_bf16.clear(), l.w_fp8 = {};
  if (narrow) return fn(narrow_slot(name, {out, in}, init_kind::linear, l));
  l.w.assign(static_cast<size_t>(out * in), 0.0f);
  fn({name, {out, in}, init_kind::linear, l.w.data()});
}

void swiglu(const visit_fn& fn, expert_weights& e, const std::string& prefix, int64_t width,
            int64_t d) {
  e.gate_up.out = 2 * width, e.gate_up.in = d;
  e.gate_up.w.clear(), e.gate_up.w_bf16.clear(), e.gate_up.w_fp8 = {};
  fn(narrow_slot(prefix + "gate_proj.weight", {width, d}, init_kind::linear, e.gate_up));
  fn(narrow_slot(prefix + "up_proj.weight", {width, d}, init_kind::linear, e.gate_up, width * d));
  lin(fn, e.down, prefix + "down_proj.weight", d, width, true);
}

// Routed expert e of (MoE) layer `layer`, its slots tagged with their MoE slot and expert.
void routed_swiglu(const model_config& c, const visit_fn& fn, expert_weights& x, int64_t layer, int64_t e) {
  const int64_t moe_slot = layer - c.first_k_dense_replace;
  swiglu([&](const tensor_slot& t) {
    tensor_slot tagged = t;
    tagged.moe_slot = moe_slot, tagged.expert = e;
    fn(tagged);
  }, x, "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + ".",
         c.moe_intermediate_size, c.hidden_size);
}

// kind: 0 encoder/v3 layer, 1 decoder layer, 2 MTP layer.
void visit_layer(const model_config& c, layer_weights& l, int64_t index, int kind,
                 const visit_fn& fn) {
  const std::string p = "model.layers." + std::to_string(index) + ".";
  int64_t d = c.hidden_size, H = c.num_attention_heads, r = c.kv_lora_rank;
  vec(fn, l.input_norm, p + "input_layernorm.weight", d, init_kind::norm);
  vec(fn, l.post_norm, p + "post_attention_layernorm.weight", d, init_kind::norm);
  attn_weights& a = l.attn;
  if (c.q_lora_rank > 0) {
    lin(fn, a.q_a, p + "self_attn.q_a_proj.weight", c.q_lora_rank, d, true);
    vec(fn, a.q_a_norm, p + "self_attn.q_a_layernorm.weight", c.q_lora_rank, init_kind::norm);
    lin(fn, a.q_b, p + "self_attn.q_b_proj.weight", H * c.qk_head_dim(), c.q_lora_rank, true);
  } else {
    lin(fn, a.q_proj, p + "self_attn.q_proj.weight", H * c.qk_head_dim(), d, true);
  }
  lin(fn, a.kv_a, p + "self_attn.kv_a_proj_with_mqa.weight", c.entry_dim(), d, true);
  vec(fn, a.kv_a_norm, p + "self_attn.kv_a_layernorm.weight", r, init_kind::norm);
  lin(fn, a.kv_b, p + "self_attn.kv_b_proj.weight", H * (c.qk_nope_head_dim + c.v_head_dim), r, true);
  lin(fn, a.o_proj, p + "self_attn.o_proj.weight", d, H * c.v_head_dim, true);
  if (c.is_flash() && kind == 0) {
    a.kv_compress.assign(static_cast<size_t>(d), 0.0f);
    fn({p + "self_attn.kv_compress.weight", {1, d}, init_kind::linear, a.kv_compress.data()});
  }
  if (c.attn_sink) vec(fn, a.sink, p + "self_attn.attn_sink", H, init_kind::sink);
  ffn_weights& f = l.ffn;
  f.moe = c.is_moe_layer(index);
  if (!f.moe) {
    swiglu(fn, f.dense, p + "mlp.", c.intermediate_size, d);
    return;
  }
  int64_t E = c.n_routed_experts;
  lin(fn, f.router, p + "mlp.gate.weight", E, d);
  vec(fn, f.router_bias, p + "mlp.gate.e_score_correction_bias", E, init_kind::bias);
  f.experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) routed_swiglu(c, fn, f.experts[e], index, e);
  if (c.n_shared_experts > 0)
    swiglu(fn, f.shared, p + "mlp.shared_experts.", c.moe_intermediate_size * c.n_shared_experts, d);
}

void visit_vision(const model_config& c, vision_weights& v, const visit_fn& fn) {
  const int64_t dv = c.vision.hidden, d = c.hidden_size, p = c.vision.patch_size, g = c.vision.grid();
  lin(fn, v.patch_embed, "vision.patch_embed.weight", dv, p * p * 3);
  vec(fn, v.patch_b, "vision.patch_embed.bias", dv, init_kind::bias);
  v.pos_embed.assign(static_cast<size_t>(g * g * dv), 0.0f);
  fn({"vision.pos_embed", {g * g, dv}, init_kind::bias, v.pos_embed.data()});
  v.layers.resize(static_cast<size_t>(c.vision.layers));
  for (int64_t i = 0; i < c.vision.layers; ++i) {
    vision_block_weights& b = v.layers[i];
    const std::string n = "vision.layers." + std::to_string(i) + ".";
    vec(fn, b.norm1_w, n + "norm1.weight", dv, init_kind::norm);
    vec(fn, b.norm1_b, n + "norm1.bias", dv, init_kind::bias);
    lin(fn, b.qkv, n + "attn.qkv.weight", 3 * dv, dv);
    vec(fn, b.qkv_b, n + "attn.qkv.bias", 3 * dv, init_kind::bias);
    lin(fn, b.proj, n + "attn.proj.weight", dv, dv);
    vec(fn, b.proj_b, n + "attn.proj.bias", dv, init_kind::bias);
    vec(fn, b.norm2_w, n + "norm2.weight", dv, init_kind::norm);
    vec(fn, b.norm2_b, n + "norm2.bias", dv, init_kind::bias);
    lin(fn, b.fc1, n + "mlp.fc1.weight", 4 * dv, dv);
    vec(fn, b.fc1_b, n + "mlp.fc1.bias", 4 * dv, init_kind::bias);
    lin(fn, b.fc2, n + "mlp.fc2.weight", dv, 4 * dv);
    vec(fn, b.fc2_b, n + "mlp.fc2.bias", dv, init_kind::bias);
  }
  vec(fn, v.post_norm_w, "vision.post_norm.weight", dv, init_kind::norm);
  vec(fn, v.post_norm_b, "vision.post_norm.bias", dv, init_kind::bias);
  lin(fn, v.proj1, "vision.projector.fc1.weight", d, dv);
  vec(fn, v.proj1_b, "vision.projector.fc1.bias", d, init_kind::bias);
  lin(fn, v.proj2, "vision.projector.fc2.weight", d, d);
  vec(fn, v.proj2_b, "vision.projector.fc2.bias", d, init_kind::bias);
}

}  // namespace

float* slot_storage(const tensor_slot& t) {
  if (t.dest) return t.dest;
  if (linear* l = t.narrowable) {
    const auto n = static_cast<size_t>(l->out * l->in);
    if (l->w.size() != n) l->w.assign(n, 0.0f);
    return l->w.data() + t.offset;
  }
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  if (t.storage->size() != static_cast<size_t>(n)) t.storage->assign(static_cast<size_t>(n), 0.0f);
  return t.storage->data();
}

void visit_tensors(model_weights& w, const visit_fn& fn) {
  const model_config& c = w.config;
  int64_t d = c.hidden_size, V = c.vocab_size, L = c.num_hidden_layers;
  w.embed.out = V, w.embed.in = d;
  fn(narrow_slot("model.embed_tokens.weight", {V, d}, init_kind::embed, w.embed));
  w.layers.resize(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i)
    visit_layer(c, w.layers[i], i, i < c.encoder_layers() ? 0 : 1, fn);
  vec(fn, w.norm, "model.norm.weight", d, init_kind::norm);
  lin(fn, w.lm_head, "lm_head.weight", V, d, true);
  if (c.is_flash()) {
    decoder_kv_weights& k = w.decoder_kv;
    vec(fn, k.input_norm, "model.decoder_kv.input_layernorm.weight", d, init_kind::norm);
    lin(fn, k.kv_a, "model.decoder_kv.kv_a_proj_with_mqa.weight", c.entry_dim(), d, true);
    vec(fn, k.kv_a_norm, "model.decoder_kv.kv_a_layernorm.weight", c.kv_lora_rank, init_kind::norm);
    k.kv_compress.assign(static_cast<size_t>(d), 0.0f);
    fn({"model.decoder_kv.kv_compress.weight", {1, d}, init_kind::linear, k.kv_compress.data()});
  }
  w.mtp.resize(static_cast<size_t>(c.num_nextn_predict_layers));
  for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
    mtp_weights& m = w.mtp[k];
    const std::string p = "model.layers." + std::to_string(L + k) + ".";
    vec(fn, m.enorm, p + "enorm.weight", d, init_kind::norm);
    vec(fn, m.hnorm, p + "hnorm.weight", d, init_kind::norm);
    lin(fn, m.eh_proj, p + "eh_proj.weight", d, 2 * d, true);
    visit_layer(c, m.layer, L + k, 2, fn);
    vec(fn, m.head_norm, p + "shared_head.norm.weight", d, init_kind::norm);
    m.head = {}, m.head.out = V, m.head.in = d;
    fn(narrow_slot(p + "shared_head.head.weight", {V, d}, init_kind::linear, m.head, 0, true));
    m.embed = {}, m.embed.out = V, m.embed.in = d;
    fn(narrow_slot(p + "embed_tokens.weight", {V, d}, init_kind::embed, m.embed, 0, true));
  }
  if (c.conf_head_hidden > 0) {
    lin(fn, w.conf_fc1, "model.conf_head.fc1.weight", c.conf_head_hidden, d);
    lin(fn, w.conf_fc2, "model.conf_head.fc2.weight", 1, c.conf_head_hidden);
  }
  if (c.vision.present) visit_vision(c, w.vision, fn);
}

namespace {

void derive_uk(const model_config& c, attn_weights& a) {
  int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim, r = c.kv_lora_rank;
  linear& t = a.w_uk_t;
  t = {}, t.out = H * r, t.in = nope;
  t.w.assign(static_cast<size_t>(H * r * nope), 0.0f);
  std::vector<float> row(static_cast<size_t>(r));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t n = 0; n < nope; ++n) {
      row_of(a.kv_b, h * (nope + v) + n, row.data());
      for (int64_t i = 0; i < r; ++i) t.w[(h * r + i) * nope + n] = row[static_cast<size_t>(i)];
    }
  if (a.kv_b.w_bf16.empty()) return;
  t.w_bf16.resize(t.w.size());  // exact: the values are kv_b's bf16 values
  for (size_t i = 0; i < t.w.size(); ++i) t.w_bf16[i] = f32_to_bf16(t.w[i]);
  std::vector<float>().swap(t.w);
}

}  // namespace

void apply_rows(const linear& l, int64_t row0, int64_t n, const float* x, float* y, int64_t m, bool batch_invariant) {
  if (!l.w_bf16.empty()) {
    kernels::matmul_bf16(x, l.w_bf16.data() + row0 * l.in, y, m, n, l.in, batch_invariant);
  } else if (!l.w_fp8.codes.empty()) {
    const kernels::fp8_matrix f{l.w_fp8.codes.data() + row0 * l.in, l.w_fp8.scales.data(),
                                l.w_fp8.row_scales.data() + row0, l.w_fp8.block_in};
    kernels::matmul_fp8(x, f, y, m, n, l.in, batch_invariant);
  } else {
    kernels::matmul(x, l.w.data() + row0 * l.in, y, m, n, l.in, batch_invariant);
  }
}

void apply(const linear& l, const float* x, float* y, int64_t m, bool batch_invariant) {
  apply_rows(l, 0, l.out, x, y, m, batch_invariant);
}

size_t linear::bytes() const {
  return w.size() * sizeof(float) + w_bf16.size() * sizeof(uint16_t) + w_fp8.codes.size() +
         w_fp8.scales.size() * sizeof(float) + w_fp8.row_scales.size() * sizeof(int32_t);
}

void row_of(const linear& l, int64_t row, float* out) {
  const int64_t d = l.in;
  if (!l.w_bf16.empty()) {
    const uint16_t* src = l.w_bf16.data() + row * d;
    for (int64_t i = 0; i < d; ++i) out[i] = bf16_to_f32(src[i]);
  } else if (!l.w_fp8.codes.empty()) {
    const uint8_t* src = l.w_fp8.codes.data() + row * d;
    const float* scales = l.w_fp8.scales.data() + l.w_fp8.row_scales[static_cast<size_t>(row)];
    for (int64_t i = 0; i < d; ++i) out[i] = fp8_e4m3_to_f32(src[i]) * scales[i / l.w_fp8.block_in];
  } else {
    std::copy_n(l.w.data() + row * d, d, out);
  }
}

void derive(model_weights& w) {
  for (auto& l : w.layers) derive_uk(w.config, l.attn);
  for (auto& m : w.mtp) derive_uk(w.config, m.layer.attn);
  const model_config& c = w.config;
  int64_t dr = c.qk_rope_head_dim;
  const rope_scaling_config& y = c.rope_scaling;
  auto m = [](double s, double k) { return s <= 1.0 ? 1.0 : 0.1 * k * std::log(s) + 1.0; };
  w.inv_freq.resize(static_cast<size_t>(dr / 2));
  double low = 0, high = 0;
  if (y.yarn) {
    auto corr = [&](double n) {
      return dr * std::log(y.original_max_position_embeddings / (n * 2 * std::numbers::pi)) /
             (2 * std::log(c.rope_theta));
    };
    low = std::max(std::floor(corr(y.beta_fast)), 0.0);
    high = std::min(std::ceil(corr(y.beta_slow)), double(dr - 1));
    if (low == high) high += 0.001;
  }
  for (int64_t i = 0; i < dr / 2; ++i) {
    double extra = std::pow(c.rope_theta, -2.0 * i / dr);
    if (!y.yarn) {
      w.inv_freq[i] = static_cast<float>(extra);
      continue;
    }
    double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    w.inv_freq[i] = static_cast<float>(extra / y.factor * ramp + extra * (1 - ramp));
  }
  w.attn_factor = y.yarn ? static_cast<float>(m(y.factor, y.mscale) / m(y.factor, y.mscale_all_dim)) : 1.0f;
  w.softmax_scale = static_cast<float>(c.softmax_scale());
}

void print_load_progress(size_t done, size_t total) {
  if (total < (64u << 20)) return;
  std::fprintf(stderr, "\rloading weights: %zu / %zu MiB", done >> 20, total >> 20);
  if (done == total) std::fprintf(stderr, "\n");
}

void back_with_huge_pages(void* p, size_t bytes) {
  constexpr uintptr_t huge = uintptr_t{2} << 20;
  const auto begin = (reinterpret_cast<uintptr_t>(p) + huge - 1) / huge * huge;
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) / huge * huge;
  if (end <= begin) return;
  // The 4 KiB pages sizing touched go first; the writes that follow fault in huge pages.
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

namespace {

// Reads tensor slots from a checkpoint into their destinations, keeping bf16 and FP8 linears
// as stored; a linear whose parts mix dtypes is read again as fp32 once its last part is
// known. The first error stops it.
class slot_reader {
 public:
  explicit slot_reader(const checkpoint& ckpt) : ckpt_(ckpt) {}
  const std::optional<error>& failed() const { return first_error_; }

  void read(const tensor_slot& t) {
    if (first_error_) return;
    if (t.shared && !ckpt_.has(t.name)) return;  // left empty: the main model's is read
    auto fail_with = [&](const error& e) { first_error_ = e; };
    linear* l = t.narrowable;
    const tensor_info* info = ckpt_.find(t.name);
    if (!l || !info || (info->type != dtype::bf16 && info->type != dtype::f8_e4m3)) {
      auto values = ckpt_.read_f32(t.name, t.shape);
      if (!values) return fail_with(values.error());
      std::copy(values->begin(), values->end(), slot_storage(t));
    } else if (info->type == dtype::bf16) {
      if (l->w_bf16.empty()) {
        l->w_bf16.resize(static_cast<size_t>(l->out * l->in));
        back_with_huge_pages(l->w_bf16.data(), l->w_bf16.size() * sizeof(uint16_t));
      }
      if (auto r = ckpt_.read_bf16(t.name, t.shape, l->w_bf16.data() + t.offset); !r) return fail_with(r.error());
    } else {
      auto q = ckpt_.read_fp8(t.name, t.shape);
      if (!q) return fail_with(q.error());
      fp8_weights& f = l->w_fp8;  // stacked after the parts read before (gate, then up)
      const auto base = static_cast<int32_t>(f.scales.size());
      if (f.codes.empty()) {
        f.block_in = q->block_cols;
        f.codes.reserve(static_cast<size_t>(l->out * l->in));  // untouched until the parts are copied in
        back_with_huge_pages(f.codes.data(), f.codes.capacity());
      }
      f.codes.insert(f.codes.end(), q->codes.begin(), q->codes.end());
      f.scales.insert(f.scales.end(), q->scales.begin(), q->scales.end());
      for (int64_t r = 0; r < q->rows; ++r)
        f.row_scales.push_back(base + static_cast<int32_t>((r / q->block_rows) * q->scale_cols));
    }
    ckpt_.release(t.name);
    if (!l) return;
    int64_t numel = 1;
    for (int64_t v : t.shape) numel *= v;
    auto& seen = parts_[l];
    seen.push_back({t.name, t.shape, t.offset, info ? info->type : dtype::f32});
    if (t.offset + numel != l->out * l->in) return;  // gate_up: after up_proj
    bool same = true;
    for (const part& p : seen) same = same && p.type == seen[0].type;
    if (same) return;
    // Mixed dtypes: the whole linear in fp32.
    l->w_bf16.clear(), l->w_fp8 = {};
    l->w.assign(static_cast<size_t>(l->out * l->in), 0.0f);
    for (const part& p : seen) {
      auto values = ckpt_.read_f32(p.name, p.shape);
      if (!values) return fail_with(values.error());
      std::copy(values->begin(), values->end(), l->w.data() + p.offset);
    }
  }

 private:
  struct part { std::string name; std::vector<int64_t> shape; int64_t offset; dtype type; };
  const checkpoint& ckpt_;
  std::map<const linear*, std::vector<part>> parts_;  // the parts of each linear read so far
  std::optional<error> first_error_;
};

}  // namespace

result<model_weights> load_weights(const std::string& dir, void (*progress)(size_t, size_t),
                                   const load_options& options) {
  auto config = load_config(dir);
  if (!config) return std::unexpected(config.error());
  auto ckpt = checkpoint::open(dir, progress);
  if (!ckpt) return std::unexpected(ckpt.error());
  model_weights w;
  w.config = *config;
  ckpt->set_fp8_block(w.config.quantization.block_rows, w.config.quantization.block_cols);
  slot_reader reader(*ckpt);
  visit_tensors(w, [&](const tensor_slot& t) {
    if (t.expert >= 0 && options.keep_routed_expert && !options.keep_routed_expert(t.moe_slot, t.expert)) return;
    reader.read(t);
  });
  if (reader.failed()) return std::unexpected(*reader.failed());
  derive(w);
  return w;
}

expert_weights& routed_expert_weights(model_weights& w, int64_t moe_slot, int64_t expert) {
  const model_config& c = w.config;
  SHOAL_ASSERT(moe_slot >= 0 && c.first_k_dense_replace + moe_slot < c.num_hidden_layers + c.num_nextn_predict_layers);
  const int64_t layer = c.first_k_dense_replace + moe_slot;
  ffn_weights& f = layer < c.num_hidden_layers ? w.layers[layer].ffn : w.mtp[layer - c.num_hidden_layers].layer.ffn;
  SHOAL_ASSERT(f.moe && expert >= 0 && expert < static_cast<int64_t>(f.experts.size()));
  return f.experts[expert];
}

struct expert_reader::impl {
  checkpoint ckpt;
};

result<expert_reader> expert_reader::open(const std::string& dir) {
  auto config = load_config(dir);
  if (!config) return std::unexpected(config.error());
  auto ckpt = checkpoint::open(dir, nullptr);
  if (!ckpt) return std::unexpected(ckpt.error());
  ckpt->set_fp8_block(config->quantization.block_rows, config->quantization.block_cols);
  return expert_reader(std::make_shared<const impl>(impl{std::move(*ckpt)}));
}

result<void> expert_reader::read(model_weights& w, int64_t moe_slot, int64_t expert) const {
  const model_config& c = w.config;
  expert_weights& x = routed_expert_weights(w, moe_slot, expert);
  slot_reader reader(impl_->ckpt);
  routed_swiglu(c, [&](const tensor_slot& t) { reader.read(t); }, x, c.first_k_dense_replace + moe_slot, expert);
  if (reader.failed()) {
    drop(w, moe_slot, expert);  // nothing half-read stays
    return std::unexpected(*reader.failed());
  }
  return {};
}

result<expert_weights> expert_reader::read(const model_config& c, int64_t moe_slot, int64_t expert) const {
  SHOAL_ASSERT(moe_slot >= 0 && c.first_k_dense_replace + moe_slot < c.num_hidden_layers + c.num_nextn_predict_layers);
  expert_weights x;
  slot_reader reader(impl_->ckpt);
  routed_swiglu(c, [&](const tensor_slot& t) { reader.read(t); }, x, c.first_k_dense_replace + moe_slot, expert);
  if (reader.failed()) return std::unexpected(*reader.failed());
  return x;
}

void expert_reader::drop(model_weights& w, int64_t moe_slot, int64_t expert) {
  expert_weights& x = routed_expert_weights(w, moe_slot, expert);
  for (linear* l : {&x.gate_up, &x.down}) {
    std::vector<float>().swap(l->w);
    std::vector<uint16_t>().swap(l->w_bf16);
    l->w_fp8 = {};
  }
}

}  // namespace shoal::model
