// safetensors checkpoint access: a memory-mapped reader for single files and for sharded
// checkpoints with model.safetensors.index.json, and a writer used by the checkpoint
// generator. Tensors are converted to fp32 on read (bf16, fp32, f16, FP8-e4m3 with one fp32
// `<name>_scale_inv` per 128×128 block, HF's `weight_scale_inv` convention).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/error.hpp"

namespace shoal::model {

enum class dtype { f32, f16, bf16, f8_e4m3, i32, i64, u8 };

std::string_view to_string(dtype d);
size_t dtype_size(dtype d);

struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into the mapping
  size_t nbytes = 0;
  std::string file;                 // shard that holds it (for error messages)
};

// One mapped .safetensors file. Validates the header (JSON, dtypes, shapes, offsets
// inside the file, no overlap past the end) at open.
class safetensors_file {
 public:
  static result<std::unique_ptr<safetensors_file>> open(const std::string& path);
  ~safetensors_file();
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;

  const std::map<std::string, tensor_info>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }

 private:
  safetensors_file() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, tensor_info> tensors_;
};

// An FP8 weight as stored: e4m3fn codes and the fp32 block scales of `<name>_scale_inv`
// (value = e4m3(code) · scales[(r / block_rows) · scale_cols + c / block_cols]).
struct fp8_tensor {
  std::vector<uint8_t> codes;  // (rows, cols)
  std::vector<float> scales;   // (ceil(rows / block_rows), scale_cols)
  int64_t rows = 0, cols = 0, block_rows = 128, block_cols = 128, scale_cols = 0;
};

// A checkpoint directory: model.safetensors, or model.safetensors.index.json + shards.
class checkpoint {
 public:
  // `progress` (may be null) is called with (bytes mapped so far, total bytes) per shard.
  static result<checkpoint> open(const std::string& dir,
                                 void (*progress)(size_t done, size_t total) = nullptr);

  bool has(const std::string& name) const;
  const tensor_info* find(const std::string& name) const;
  // Reads tensor `name` as fp32, checking its shape equals `shape`. FP8 tensors are
  // dequantised with `<name>_scale_inv` (blocks of fp8_block(), 128×128 unless set). Errors
  // name the tensor and file.
  result<std::vector<float>> read_f32(const std::string& name,
                                      const std::vector<int64_t>& shape) const;
  // Reads an FP8 tensor as stored, with its scales: the shape must equal `shape`, the
  // scale tensor must be F32 (BF16 / F16 read too) of ceil(rows / block rows) × ceil(cols / block cols), every
  // scale in [0, 2^100], and no code NaN (0x7F, 0xFF). Errors name the tensor and file.
  result<fp8_tensor> read_fp8(const std::string& name, const std::vector<int64_t>& shape) const;
  // Copies a BF16 tensor's values as stored into out (prod(shape) values), checking shape
  // and dtype. Errors name the tensor and file.
  result<void> read_bf16(const std::string& name, const std::vector<int64_t>& shape, uint16_t* out) const;
  // The scale block of FP8 tensors (config.json quantization_config.weight_block_size).
  void set_fp8_block(int64_t rows, int64_t cols) { block_rows_ = rows, block_cols_ = cols; }
  // Tells the kernel the mapped bytes of `name` will not be read again (drops them from
  // the resident set, so loading does not hold the checkpoint's pages and the copy at once).
  void release(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  // Tensor `name`, checked to have `shape` and `type`.
  result<const tensor_info*> stored(const std::string& name, const std::vector<int64_t>& shape, dtype type) const;
  std::vector<std::shared_ptr<safetensors_file>> files_;
  std::map<std::string, const tensor_info*> index_;
  std::string dir_;
  int64_t block_rows_ = 128, block_cols_ = 128;
};

// A tensor to write: fp32 source values, stored as `type` (f32, bf16 or f8_e4m3; for
// f8_e4m3 the writer also emits `<name>_scale_inv` with 128×128 block scales).
struct tensor_to_write {
  std::string name;
  std::vector<int64_t> shape;
  const float* values = nullptr;  // (prod(shape))
  dtype type = dtype::bf16;
};

// Writes one safetensors file (header sorted by name, 8-byte aligned), atomically:
// written to PATH.tmp then renamed.
result<void> write_safetensors(const std::string& path, const std::vector<tensor_to_write>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// bf16/fp8 conversions used by reader, writer and tests.
float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);          // round to nearest even
float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float v);       // saturating, round to nearest even

}  // namespace shoal::model
