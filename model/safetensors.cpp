// safetensors reader and writer. The reader maps each file read-only, validates the whole
// header before exposing any tensor (so a damaged checkpoint fails with a message naming the
// file and tensor instead of crashing later), and converts bf16/f16/f32/FP8-e4m3 to fp32 on
// read. The writer is used by the checkpoint generator and mirrors the HF layout exactly.
#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>

namespace shoal::model {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the reader copies it as-is");

namespace {

using json = nlohmann::json;

constexpr int64_t fp8_block = 128;   // HF DeepSeek block-scale granularity (rows and cols)
constexpr float fp8_max = 448.0f;    // largest finite e4m3fn value

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string errno_str() { return std::strerror(errno); }

bool parse_dtype(std::string_view s, dtype& out) {
  for (dtype d : {dtype::f32, dtype::f16, dtype::bf16, dtype::f8_e4m3, dtype::i32, dtype::i64,
                  dtype::u8}) {
    if (to_string(d) == s) {
      out = d;
      return true;
    }
  }
  return false;
}

// Element count of `shape`; false on a negative dim or overflow of 64 bits.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t& out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  out = n;
  return true;
}

uint64_t numel_of(const std::vector<int64_t>& shape) {
  uint64_t n = 0;
  checked_numel(shape, n);
  return n;
}

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }  // no overflow near INT64_MAX

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

struct fd_closer {
  int fd;
  ~fd_closer() {
    if (fd >= 0) ::close(fd);
  }
};

// ---- header validation -------------------------------------------------------------------

result<std::vector<int64_t>> parse_shape(const json& j, const std::string& where) {
  if (!j.is_array()) return fail(errc::bad_json, where + ": field 'shape' must be an array");
  std::vector<int64_t> shape;
  for (const json& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return fail(errc::bad_json, where + ": field 'shape' must hold non-negative integers");
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// One header entry → tensor_info pointing into the data region `data` (data_size bytes).
result<tensor_info> parse_entry(const std::string& path, const std::string& name, const json& entry,
                                const std::byte* data, uint64_t data_size) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!entry.is_object()) return fail(errc::bad_json, where + " must be an object");
  auto dt = entry.find("dtype");
  auto sh = entry.find("shape");
  auto off = entry.find("data_offsets");
  if (dt == entry.end()) return fail(errc::missing_field, where + ": missing field 'dtype'");
  if (sh == entry.end()) return fail(errc::missing_field, where + ": missing field 'shape'");
  if (off == entry.end()) return fail(errc::missing_field, where + ": missing field 'data_offsets'");
  if (!dt->is_string()) return fail(errc::bad_json, where + ": field 'dtype' must be a string");

  tensor_info info;
  info.name = name;
  info.file = path;
  if (!parse_dtype(dt->get<std::string>(), info.type)) {
    return fail(errc::bad_dtype, where + ": unknown dtype '" + dt->get<std::string>() + "'");
  }
  auto shape = parse_shape(*sh, where);
  if (!shape) return std::unexpected(shape.error());
  info.shape = std::move(*shape);

  if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return fail(errc::bad_json,
                where + ": field 'data_offsets' must be two non-negative integers [begin, end]");
  }
  const uint64_t begin = (*off)[0].get<uint64_t>();
  const uint64_t end = (*off)[1].get<uint64_t>();
  const std::string offsets = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (begin > end) return fail(errc::bad_value, where + ": " + offsets + " are not ordered");

  uint64_t numel = 0, need = 0;
  if (!checked_numel(info.shape, numel) ||
      __builtin_mul_overflow(numel, dtype_size(info.type), &need)) {
    return fail(errc::bad_shape, where + ": shape " + shape_str(info.shape) + " is too large");
  }
  if (end - begin != need) {
    return fail(errc::bad_shape, where + ": " + offsets + " hold " + std::to_string(end - begin) +
                                     " bytes but shape " + shape_str(info.shape) + " of " +
                                     std::string(to_string(info.type)) + " needs " +
                                     std::to_string(need));
  }
  if (end > data_size) {
    return fail(errc::truncated, where + ": " + offsets + " run past the end of the data region (" +
                                     std::to_string(data_size) + " bytes); file truncated?");
  }
  info.data = data + begin;
  info.nbytes = need;
  return info;
}

result<void> check_metadata(const std::string& path, const json& meta) {
  if (!meta.is_object()) return fail(errc::bad_json, path + ": '__metadata__' must be an object");
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) {
      return fail(errc::bad_json, path + ": '__metadata__' field '" + key + "' must be a string");
    }
  }
  return {};
}

// Non-empty tensors may not share bytes.
result<void> check_overlaps(const std::string& path, const std::map<std::string, tensor_info>& tensors) {
  std::vector<const tensor_info*> sorted;
  for (const auto& [name, t] : tensors) {
    if (t.nbytes > 0) sorted.push_back(&t);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const tensor_info* a, const tensor_info* b) { return a->data < b->data; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1]->data + sorted[i - 1]->nbytes > sorted[i]->data) {
      return fail(errc::bad_value, path + ": tensors '" + sorted[i - 1]->name + "' and '" +
                                       sorted[i]->name + "' overlap");
    }
  }
  return {};
}

result<std::map<std::string, tensor_info>> parse_header(const std::string& path, const std::byte* base,
                                                        uint64_t size) {
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(base[i]) << (8 * i);
  if (header_len > size - 8) {
    return fail(errc::truncated, path + ": header length " + std::to_string(header_len) +
                                     " runs past the end of the file (" + std::to_string(size) +
                                     " bytes)");
  }
  const char* text = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(text, text + header_len);
  } catch (const json::parse_error& e) {
    return fail(errc::bad_json, path + ": header is not valid JSON at header byte " + std::to_string(e.byte) +
                                    " (file offset " + std::to_string(8 + e.byte) + "): " + e.what());
  } catch (const json::exception& e) {
    return fail(errc::bad_json, path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return fail(errc::bad_json, path + ": header must be a JSON object");

  const std::byte* data = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::map<std::string, tensor_info> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (auto ok = check_metadata(path, entry); !ok) return std::unexpected(ok.error());
      continue;
    }
    auto info = parse_entry(path, name, entry, data, data_size);
    if (!info) return std::unexpected(info.error());
    tensors.emplace(name, std::move(*info));
  }
  if (auto ok = check_overlaps(path, tensors); !ok) return std::unexpected(ok.error());
  return tensors;
}

// ---- conversion on read ------------------------------------------------------------------

float f16_to_f32(uint16_t v) {
  const int sign = v >> 15, exp = (v >> 10) & 0x1f, mant = v & 0x3ff;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    mag = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    mag = std::ldexp(static_cast<float>(mant + 1024), exp - 25);
  }
  return sign ? -mag : mag;
}

// f32/f16/bf16 → fp32 into out (t.nbytes / dtype_size values); false for other dtypes.
bool convert_plain(const tensor_info& t, float* out) {
  const size_t n = t.nbytes / dtype_size(t.type);
  switch (t.type) {
    case dtype::f32:
      if (n) std::memcpy(out, t.data, n * sizeof(float));
      return true;
    case dtype::bf16:
    case dtype::f16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, t.data + 2 * i, 2);
        out[i] = t.type == dtype::bf16 ? bf16_to_f32(v) : f16_to_f32(v);
      }
      return true;
    default:
      return false;
  }
}

// Drops the mapped pages of [p, p + n) from the resident set (whole pages inside the range;
// the mapping is private and read-only, so a dropped page is read again from the file if
// touched). Loading thus never holds a tensor's mapped pages and its copy at once for long.
void drop_pages(const std::byte* p, size_t n) {
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// memcpy of n mapped bytes in pieces, each piece's pages dropped once copied.
void copy_and_drop(void* dst, const std::byte* src, size_t n) {
  constexpr size_t piece = size_t{16} << 20;
  for (size_t at = 0; at < n; at += piece) {
    const size_t len = std::min(piece, n - at);
    std::memcpy(static_cast<std::byte*>(dst) + at, src + at, len);
    drop_pages(src + at, len);
  }
}

// Checks an FP8 tensor and its scale tensor and copies both out (see checkpoint::read_fp8).
result<fp8_tensor> load_fp8(const tensor_info& t, const tensor_info* scale, const std::string& scale_name,
                            const std::string& dir, int64_t block_rows, int64_t block_cols) {
  if (t.shape.size() != 2) {
    return fail(errc::bad_shape, "FP8 tensor '" + t.name + "' in " + t.file + " has shape " +
                                     shape_str(t.shape) + "; block scales need 2-D");
  }
  if (!scale) {
    return fail(errc::missing_field, "FP8 tensor '" + t.name + "' in " + t.file +
                                         " has no scale tensor '" + scale_name + "' in " + dir);
  }
  fp8_tensor out;
  out.rows = t.shape[0], out.cols = t.shape[1], out.block_rows = block_rows, out.block_cols = block_cols;
  out.scale_cols = ceil_div(out.cols, block_cols);
  const std::vector<int64_t> want = {ceil_div(out.rows, block_rows), out.scale_cols};
  if (scale->shape != want) {
    return fail(errc::bad_shape, "scale tensor '" + scale_name + "' in " + scale->file + " has shape " +
                                     shape_str(scale->shape) + ", expected " + shape_str(want) + " for " +
                                     shape_str(t.shape) + " in blocks of " + std::to_string(block_rows) + "×" +
                                     std::to_string(block_cols) + " (quantization_config.weight_block_size)");
  }
  out.scales.resize(static_cast<size_t>(want[0] * want[1]));
  if (!convert_plain(*scale, out.scales.data())) {  // F32 as published; BF16 / F16 read too
    return fail(errc::bad_dtype, "scale tensor '" + scale_name + "' in " + scale->file + " has dtype " +
                                     std::string(to_string(scale->type)) + "; expected F32");
  }
  for (size_t i = 0; i < out.scales.size(); ++i)
    if (!(out.scales[i] >= 0 && out.scales[i] <= 0x1p100f))  // NaN fails too
      return fail(errc::bad_value, "scale tensor '" + scale_name + "' in " + scale->file + " holds " +
                                       std::to_string(out.scales[i]) + " at block " + std::to_string(i) +
                                       "; scales must be finite and not negative (at most 2^100)");
  out.codes.resize(t.nbytes);
  copy_and_drop(out.codes.data(), t.data, t.nbytes);
  for (size_t i = 0; i < out.codes.size(); ++i)
    if ((out.codes[i] & 0x7f) == 0x7f)
      return fail(errc::bad_value, "FP8 tensor '" + t.name + "' in " + t.file + " holds NaN (code 0x" +
                                       (out.codes[i] == 0x7f ? std::string("7f") : std::string("ff")) +
                                       ") at element " + std::to_string(i));
  return out;
}

}  // namespace

// ---- dtypes and scalar conversions -------------------------------------------------------

std::string_view to_string(dtype d) {
  switch (d) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::f8_e4m3: return "F8_E4M3";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
    case dtype::u8: return "U8";
  }
  return "?";
}

size_t dtype_size(dtype d) {
  switch (d) {
    case dtype::f32: case dtype::i32: return 4;
    case dtype::f16: case dtype::bf16: return 2;
    case dtype::f8_e4m3: case dtype::u8: return 1;
    case dtype::i64: return 8;
  }
  return 1;
}

float bf16_to_f32(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

uint16_t f32_to_bf16(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  if (std::isnan(v)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stay NaN, quiet
  const uint32_t lsb = (bits >> 16) & 1;
  return static_cast<uint16_t>((bits + 0x7fff + lsb) >> 16);  // RNE; overflow gives ±inf
}

float fp8_e4m3_to_f32(uint8_t v) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int code = 0; code < 256; ++code) {
      const int exp = (code >> 3) & 0xf, mant = code & 7;
      float mag;
      if (exp == 15 && mant == 7) {
        mag = std::numeric_limits<float>::quiet_NaN();
      } else if (exp == 0) {
        mag = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 · 2^-6
      } else {
        mag = std::ldexp(static_cast<float>(mant + 8), exp - 10);  // (1 + mant/8) · 2^(exp-7)
      }
      t[code] = (code & 0x80) ? -mag : mag;
    }
    return t;
  }();
  return table[v];
}

uint8_t f32_to_fp8_e4m3(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if (std::isnan(v)) return sign | 0x7f;
  const float a = std::fabs(v);
  if (a >= fp8_max) return sign | 0x7e;  // saturate (incl. ±inf)
  if (a < 0x1p-6f) {
    // Subnormal range: quantum 2^-9, exact scaling then RNE; 8 lands on the smallest normal.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int exp = static_cast<int>((bits >> 23) & 0xff) - 127;  // in [-6, 8]
  const uint32_t mant = bits & 0x7fffff;
  uint32_t top = mant >> 20;
  const uint32_t rest = mant & 0xfffff;
  if (rest > 0x80000 || (rest == 0x80000 && (top & 1))) ++top;
  if (top == 8) {
    top = 0;
    ++exp;
  }
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | top);
}

// ---- safetensors_file --------------------------------------------------------------------

result<std::unique_ptr<safetensors_file>> safetensors_file::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errc::io, "cannot open " + path + ": " + errno_str());
  fd_closer closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(errc::io, "cannot stat " + path + ": " + errno_str());
  if (!S_ISREG(st.st_mode)) return fail(errc::io, path + " is not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return fail(errc::truncated, path + ": file is " + std::to_string(size) +
                                     " bytes, too short for the 8-byte header length");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return fail(errc::io, "cannot mmap " + path + ": " + errno_str());

  std::unique_ptr<safetensors_file> file(new safetensors_file());
  file->path_ = path;
  file->map_ = map;  // owned from here: the destructor unmaps on every path below
  file->map_size_ = size;
  auto tensors = parse_header(path, static_cast<const std::byte*>(map), size);
  if (!tensors) return std::unexpected(tensors.error());
  file->tensors_ = std::move(*tensors);
  return file;
}

safetensors_file::~safetensors_file() {
  if (map_) ::munmap(map_, map_size_);
}

// ---- checkpoint --------------------------------------------------------------------------

namespace {

// weight_map of an index file as (tensor, shard file name) pairs.
result<std::vector<std::pair<std::string, std::string>>> read_index(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return fail(errc::io, "cannot read " + index_path + ": " + errno_str());
  std::stringstream text;
  text << in.rdbuf();
  json index;
  try {
    index = json::parse(text.str());
  } catch (const json::parse_error& e) {
    return fail(errc::bad_json, index_path + ": not valid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {
    return fail(errc::bad_json, index_path + ": not valid JSON: " + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map")) {
    return fail(errc::missing_field, index_path + ": missing field 'weight_map'");
  }
  const json& map = index["weight_map"];
  if (!map.is_object()) return fail(errc::bad_json, index_path + ": field 'weight_map' must be an object");
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& [tensor, shard] : map.items()) {
    if (!shard.is_string() || shard.get<std::string>().empty()) {
      return fail(errc::bad_json, index_path + ": weight_map entry '" + tensor +
                                      "' must be a non-empty shard file name");
    }
    entries.emplace_back(tensor, shard.get<std::string>());
  }
  return entries;
}

}  // namespace

result<checkpoint> checkpoint::open(const std::string& dir, void (*progress)(size_t, size_t)) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::pair<std::string, std::string>> mapping;  // (tensor, shard)
  std::map<std::string, std::string> shards;                 // shard → first tensor mapped to it
  if (file_exists(index_path)) {
    auto entries = read_index(index_path);
    if (!entries) return std::unexpected(entries.error());
    mapping = std::move(*entries);
    for (const auto& [tensor, shard] : mapping) shards.emplace(shard, tensor);
  } else if (file_exists(dir + "/model.safetensors")) {
    shards.emplace("model.safetensors", "");
  } else {
    return fail(errc::io, "no model.safetensors or model.safetensors.index.json in " + dir);
  }

  size_t total = 0;
  std::map<std::string, size_t> shard_bytes;
  for (const auto& [shard, tensor] : shards) {
    struct stat st {};
    const std::string path = dir + "/" + shard;
    if (::stat(path.c_str(), &st) != 0) {
      return fail(errc::io, "cannot open shard '" + shard + "' (" + path + ", holding tensor '" + tensor +
                                "' per " + index_path + "): " + errno_str());
    }
    shard_bytes[shard] = static_cast<size_t>(st.st_size);
    total += shard_bytes[shard];
  }

  checkpoint ck;
  ck.dir_ = dir;
  std::map<std::string, const safetensors_file*> by_shard;
  size_t done = 0;
  for (const auto& [shard, tensor] : shards) {
    auto file = safetensors_file::open(dir + "/" + shard);
    if (!file) return std::unexpected(file.error());
    done += shard_bytes[shard];
    by_shard[shard] = file->get();
    ck.files_.emplace_back(std::move(*file));
    if (progress) progress(std::min(done, total), total);
  }
  for (const auto& [tensor, shard] : mapping) {
    const auto& held = by_shard[shard]->tensors();
    auto it = held.find(tensor);
    if (it == held.end()) {
      return fail(errc::missing_field, index_path + " maps tensor '" + tensor + "' to shard '" + shard +
                                           "', which does not contain it");
    }
    ck.index_[tensor] = &it->second;
  }
  // Tensors a shard holds but the weight_map omits stay reachable (first shard wins).
  for (const auto& file : ck.files_) {
    for (const auto& [name, info] : file->tensors()) ck.index_.emplace(name, &info);
  }
  return ck;
}

bool checkpoint::has(const std::string& name) const { return index_.contains(name); }

const tensor_info* checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, info] : index_) out.push_back(name);
  return out;
}

result<std::vector<float>> checkpoint::read_f32(const std::string& name,
                                                const std::vector<int64_t>& shape) const {
  const tensor_info* t = find(name);
  if (!t) return fail(errc::missing_field, "missing tensor '" + name + "' in " + dir_);
  if (t->shape != shape) {
    return fail(errc::bad_shape, "tensor '" + name + "' in " + t->file + " has shape " + shape_str(t->shape) +
                                     ", expected " + shape_str(shape));
  }
  std::vector<float> out(numel_of(shape));
  if (t->type == dtype::f8_e4m3) {
    auto q = read_fp8(name, shape);
    if (!q) return std::unexpected(q.error());
    for (int64_t r = 0; r < q->rows; ++r) {
      const float* row_scales = q->scales.data() + (r / q->block_rows) * q->scale_cols;
      for (int64_t c = 0; c < q->cols; ++c)
        out[r * q->cols + c] = fp8_e4m3_to_f32(q->codes[r * q->cols + c]) * row_scales[c / q->block_cols];
    }
    return out;
  }
  if (!convert_plain(*t, out.data())) {
    return fail(errc::bad_dtype, "tensor '" + name + "' in " + t->file + " has dtype " +
                                     std::string(to_string(t->type)) + ", which cannot be read as fp32");
  }
  return out;
}

result<const tensor_info*> checkpoint::stored(const std::string& name, const std::vector<int64_t>& shape,
                                              dtype type) const {
  const tensor_info* t = find(name);
  if (!t) return fail(errc::missing_field, "missing tensor '" + name + "' in " + dir_);
  if (t->shape != shape) {
    return fail(errc::bad_shape, "tensor '" + name + "' in " + t->file + " has shape " + shape_str(t->shape) +
                                     ", expected " + shape_str(shape));
  }
  if (t->type != type) {
    return fail(errc::bad_dtype, "tensor '" + name + "' in " + t->file + " has dtype " +
                                     std::string(to_string(t->type)) + ", not " + std::string(to_string(type)));
  }
  return t;
}

result<fp8_tensor> checkpoint::read_fp8(const std::string& name, const std::vector<int64_t>& shape) const {
  auto t = stored(name, shape, dtype::f8_e4m3);
  if (!t) return std::unexpected(t.error());
  const std::string scale_name = name + "_scale_inv";  // "X.weight" → "X.weight_scale_inv"
  return load_fp8(**t, find(scale_name), scale_name, dir_, block_rows_, block_cols_);
}

result<void> checkpoint::read_bf16(const std::string& name, const std::vector<int64_t>& shape, uint16_t* out) const {
  auto t = stored(name, shape, dtype::bf16);
  if (!t) return std::unexpected(t.error());
  copy_and_drop(out, (*t)->data, (*t)->nbytes);
  return {};
}

void checkpoint::release(const std::string& name) const {
  const tensor_info* t = find(name);
  if (t) drop_pages(t->data, t->nbytes);
}

// ---- writer ------------------------------------------------------------------------------

namespace {

// One tensor as it will appear in the file. FP8 values and their scale tensor share `scales`.
struct planned_tensor {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  const tensor_to_write* source = nullptr;
  std::shared_ptr<const std::vector<float>> scales;  // (ceil(rows/128), ceil(cols/128)) for FP8
  bool is_scale = false;
  uint64_t nbytes = 0;
  uint64_t begin = 0;
};

// scale_inv per 128×128 block = amax / 448 (1 for an all-zero block).
std::vector<float> fp8_block_scales(const tensor_to_write& t) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int64_t block_cols = ceil_div(cols, fp8_block);
  std::vector<float> amax(static_cast<size_t>(ceil_div(rows, fp8_block) * block_cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* row_amax = amax.data() + (r / fp8_block) * block_cols;
    for (int64_t c = 0; c < cols; ++c) {
      row_amax[c / fp8_block] = std::max(row_amax[c / fp8_block], std::fabs(t.values[r * cols + c]));
    }
  }
  for (float& a : amax) a = a == 0.0f ? 1.0f : a / fp8_max;
  return amax;
}

result<void> check_tensor_to_write(const std::string& path, const tensor_to_write& t, uint64_t& numel) {
  const std::string where = path + ": tensor '" + t.name + "'";
  if (t.name.empty() || t.name == "__metadata__") return fail(errc::bad_value, where + ": invalid name");
  if (!checked_numel(t.shape, numel) || numel > (uint64_t{1} << 60)) {
    return fail(errc::bad_shape, where + ": invalid shape " + shape_str(t.shape));
  }
  if (numel > 0 && !t.values) return fail(errc::bad_value, where + ": no values");
  if (t.type != dtype::f32 && t.type != dtype::bf16 && t.type != dtype::f8_e4m3) {
    return fail(errc::bad_dtype, where + ": cannot write dtype " + std::string(to_string(t.type)));
  }
  if (t.type == dtype::f8_e4m3) {
    if (t.shape.size() != 2) return fail(errc::bad_shape, where + ": FP8 needs a 2-D shape");
    for (uint64_t i = 0; i < numel; ++i) {
      if (!std::isfinite(t.values[i])) {
        return fail(errc::bad_value, where + ": non-finite value at index " + std::to_string(i));
      }
    }
  }
  return {};
}

result<std::vector<planned_tensor>> plan_tensors(const std::string& path,
                                                 const std::vector<tensor_to_write>& tensors) {
  std::vector<planned_tensor> plan;
  for (const tensor_to_write& t : tensors) {
    uint64_t numel = 0;
    if (auto ok = check_tensor_to_write(path, t, numel); !ok) return std::unexpected(ok.error());
    planned_tensor p{t.name, t.type, t.shape, &t, nullptr, false, numel * dtype_size(t.type), 0};
    if (t.type == dtype::f8_e4m3) {
      p.scales = std::make_shared<const std::vector<float>>(fp8_block_scales(t));
      const std::vector<int64_t> scale_shape = {ceil_div(t.shape[0], fp8_block),
                                                ceil_div(t.shape[1], fp8_block)};
      plan.push_back({t.name + "_scale_inv", dtype::f32, scale_shape, &t, p.scales, true,
                      p.scales->size() * sizeof(float), 0});
    }
    plan.push_back(std::move(p));
  }
  std::sort(plan.begin(), plan.end(),
            [](const planned_tensor& a, const planned_tensor& b) { return a.name < b.name; });
  uint64_t offset = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (i > 0 && plan[i].name == plan[i - 1].name) {
      return fail(errc::bad_value, path + ": tensor '" + plan[i].name + "' written twice");
    }
    plan[i].begin = offset;
    offset += plan[i].nbytes;
  }
  return plan;
}

void encode_tensor(const planned_tensor& p, std::vector<std::byte>& out) {
  out.resize(p.nbytes);
  const float* v = p.source->values;
  const size_t n = p.is_scale ? p.scales->size() : p.nbytes / dtype_size(p.type);
  if (p.is_scale) {
    std::memcpy(out.data(), p.scales->data(), p.nbytes);
  } else if (p.type == dtype::f32) {
    if (n) std::memcpy(out.data(), v, p.nbytes);
  } else if (p.type == dtype::bf16) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t b = f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  } else {  // f8_e4m3: value / its block's scale_inv
    const int64_t cols = p.shape[1], block_cols = ceil_div(cols, fp8_block);
    for (size_t i = 0; i < n; ++i) {
      const int64_t r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) % cols;
      const float s = (*p.scales)[(r / fp8_block) * block_cols + c / fp8_block];
      out[i] = static_cast<std::byte>(f32_to_fp8_e4m3(v[i] / s));
    }
  }
}

std::string header_text(const std::vector<planned_tensor>& plan,
                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();  // std::map-backed: keys come out sorted
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const planned_tensor& p : plan) {
    header[p.name] = {{"dtype", std::string(to_string(p.type))},
                      {"shape", p.shape},
                      {"data_offsets", {p.begin, p.begin + p.nbytes}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data region starts 8-byte aligned
  return text;
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

result<void> write_file_body(int fd, const std::string& tmp, const std::vector<planned_tensor>& plan,
                             const std::string& header) {
  const auto fail_io = [&] { return fail(errc::io, "cannot write " + tmp + ": " + errno_str()); };
  std::array<uint8_t, 8> len{};
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  if (!write_all(fd, len.data(), len.size()) || !write_all(fd, header.data(), header.size())) {
    return fail_io();
  }
  std::vector<std::byte> buffer;
  for (const planned_tensor& p : plan) {
    encode_tensor(p, buffer);
    if (!write_all(fd, buffer.data(), buffer.size())) return fail_io();
  }
  if (::fsync(fd) != 0) return fail_io();
  return {};
}

}  // namespace

result<void> write_safetensors(const std::string& path, const std::vector<tensor_to_write>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  auto plan = plan_tensors(path, tensors);
  if (!plan) return std::unexpected(plan.error());
  const std::string header = header_text(*plan, metadata);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(errc::io, "cannot create " + tmp + ": " + errno_str());
  auto body = write_file_body(fd, tmp, *plan, header);
  const bool closed = ::close(fd) == 0;
  if (body && !closed) body = fail(errc::io, "cannot close " + tmp + ": " + errno_str());
  if (body && ::rename(tmp.c_str(), path.c_str()) != 0) {
    body = fail(errc::io, "cannot rename " + tmp + " to " + path + ": " + errno_str());
  }
  if (!body) {
    ::unlink(tmp.c_str());
    return body;
  }
  // Make the rename durable too (best effort: the data itself is already synced).
  const size_t slash = path.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (const int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

}  // namespace shoal::model
