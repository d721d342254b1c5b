// Tests of the safetensors reader/writer: bf16 and FP8-e4m3 conversions (exhaustive where
// the code space is small), write → read round trips for every stored dtype, sharded
// checkpoints, and one test per malformed input checking the error names the offending
// file/tensor. Files go to a fresh directory under /tmp per test.
#include <doctest/doctest.h>

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "model/safetensors.hpp"

namespace sm = shoal::model;
namespace fs = std::filesystem;
using sm::dtype;
using sm::errc;

namespace {

// A fresh directory under /tmp, removed with everything in it at scope exit.
struct temp_dir {
  std::string path;
  temp_dir() {
    std::string pattern = "/tmp/shoal_st_test_XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

bool contains(const std::string& message, const std::string& part) {
  return message.find(part) != std::string::npos;
}

// Writes a safetensors file by hand: header length (or `len_override`), header text, data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               int64_t len_override = -1) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header;
  for (size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i & 0x7f));
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Opens a directory holding a single model.safetensors with the given raw header.
sm::result<sm::checkpoint> open_raw(const temp_dir& dir, const std::string& header, size_t data_bytes) {
  write_raw(dir.file("model.safetensors"), header, data_bytes);
  return sm::checkpoint::open(dir.path);
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

size_t progress_calls = 0;
size_t progress_done = 0;
size_t progress_total = 0;
void record_progress(size_t done, size_t total) {
  ++progress_calls;
  CHECK(done >= progress_done);
  progress_done = done;
  progress_total = total;
}

// The writer's header: names sorted, metadata kept, data region 8-byte aligned.
void check_header_layout(const std::string& path) {
  std::ifstream raw(path, std::ios::binary);
  uint64_t len = 0;
  raw.read(reinterpret_cast<char*>(&len), 8);
  CHECK((8 + len) % 8 == 0);
  std::string header(len, ' ');
  raw.read(header.data(), static_cast<std::streamsize>(len));
  CHECK(header.find("\"a.weight\"") < header.find("\"b.bias\""));
  CHECK(header.find("\"layer.w.weight\"") < header.find("\"layer.w.weight_scale_inv\""));
  CHECK(nlohmann::json::parse(header)["__metadata__"]["format"] == "pt");
}

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even") {
  auto from_bits = [](uint32_t b) { return std::bit_cast<float>(b); };
  CHECK(sm::f32_to_bf16(1.0f) == 0x3f80);
  CHECK(sm::f32_to_bf16(from_bits(0x3f808000)) == 0x3f80);  // tie, even stays
  CHECK(sm::f32_to_bf16(from_bits(0x3f818000)) == 0x3f82);  // tie, odd rounds up
  CHECK(sm::f32_to_bf16(from_bits(0x3f808001)) == 0x3f81);  // above half
  CHECK(sm::f32_to_bf16(from_bits(0x3f807fff)) == 0x3f80);  // below half
  CHECK(sm::f32_to_bf16(from_bits(0xbf818000)) == 0xbf82);  // sign kept
  CHECK(sm::f32_to_bf16(from_bits(0x7f7fffff)) == 0x7f80);  // rounds up to +inf
  CHECK(sm::f32_to_bf16(-0.0f) == 0x8000);
  CHECK(sm::f32_to_bf16(INFINITY) == 0x7f80);
  CHECK(std::isnan(sm::bf16_to_f32(sm::f32_to_bf16(NAN))));
  CHECK(sm::bf16_to_f32(0x4049) == 3.140625f);
  int mismatches = 0;
  for (uint32_t code = 0; code < 65536; ++code) {
    const float f = sm::bf16_to_f32(static_cast<uint16_t>(code));
    if (!std::isnan(f) && sm::f32_to_bf16(f) != code) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp8 e4m3: every code decodes and re-encodes to itself") {
  for (int code = 0; code < 256; ++code) {
    const float f = sm::fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if ((code & 0x7f) == 0x7f) {
      CHECK(std::isnan(f));
      continue;
    }
    INFO("code " << code << " value " << f);
    CHECK(sm::f32_to_fp8_e4m3(f) == code);
  }
  CHECK(sm::fp8_e4m3_to_f32(0x7e) == 448.0f);
  CHECK(sm::fp8_e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));
  CHECK(sm::fp8_e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));
  CHECK(sm::fp8_e4m3_to_f32(0x38) == 1.0f);
  CHECK(sm::fp8_e4m3_to_f32(0xc0) == -2.0f);
}

TEST_CASE("fp8 e4m3 encoding saturates and rounds to nearest even") {
  CHECK(sm::f32_to_fp8_e4m3(1000.0f) == 0x7e);
  CHECK(sm::f32_to_fp8_e4m3(464.0f) == 0x7e);
  CHECK(sm::f32_to_fp8_e4m3(-INFINITY) == 0xfe);
  CHECK((sm::f32_to_fp8_e4m3(NAN) & 0x7f) == 0x7f);
  CHECK(sm::f32_to_fp8_e4m3(1.0625f) == 0x38);  // tie between 1 and 1.125 → even (1)
  CHECK(sm::f32_to_fp8_e4m3(1.1875f) == 0x3a);  // tie between 1.125 and 1.25 → even (1.25)
  CHECK(sm::f32_to_fp8_e4m3(1.07f) == 0x39);
  CHECK(sm::f32_to_fp8_e4m3(std::ldexp(0.5f, -9)) == 0x00);  // subnormal tie → 0
  CHECK(sm::f32_to_fp8_e4m3(std::ldexp(1.5f, -9)) == 0x02);  // subnormal tie → 2
  CHECK(sm::f32_to_fp8_e4m3(std::ldexp(15.5f, -10)) == 0x08);  // rounds up into the normals
  CHECK(sm::f32_to_fp8_e4m3(1e-10f) == 0x00);
  CHECK(sm::f32_to_fp8_e4m3(-1e-10f) == 0x80);
  CHECK(sm::f32_to_fp8_e4m3(240.0f) == 0x77);
  CHECK(sm::f32_to_fp8_e4m3(248.0f) == 0x78);  // tie between 240 and 256 → 256 (even)
}

TEST_CASE("write then read: f32, bf16 and fp8 with block scales") {
  temp_dir dir;
  const std::vector<float> a = random_values(3 * 5, 1, 2.0f);
  const std::vector<float> b = random_values(7, 2, 1.0f);
  // 130 × 260: partial blocks in both dims; one block row 100× larger to test per-block scales.
  std::vector<float> w = random_values(130 * 260, 3, 0.02f);
  for (int c = 0; c < 260; ++c) w[5 * 260 + c] *= 100.0f;
  for (int c = 0; c < 128; ++c) w[129 * 260 + c] = 0.0f;  // block (1, 0) all but one value zero

  const std::vector<sm::tensor_to_write> tensors = {
      {"b.bias", {7}, b.data(), dtype::bf16},
      {"a.weight", {3, 5}, a.data(), dtype::f32},
      {"layer.w.weight", {130, 260}, w.data(), dtype::f8_e4m3},
  };
  REQUIRE(sm::write_safetensors(dir.file("model.safetensors"), tensors, {{"format", "pt"}}));
  CHECK_FALSE(fs::exists(dir.file("model.safetensors.tmp")));

  check_header_layout(dir.file("model.safetensors"));

  progress_calls = progress_done = progress_total = 0;
  auto ck = sm::checkpoint::open(dir.path, record_progress);
  REQUIRE_MESSAGE(ck, ck.error().message);
  CHECK(progress_calls == 1);
  CHECK(progress_done == progress_total);
  CHECK(progress_total == fs::file_size(dir.file("model.safetensors")));
  CHECK(ck->names() == std::vector<std::string>{"a.weight", "b.bias", "layer.w.weight",
                                                "layer.w.weight_scale_inv"});
  const sm::tensor_info* scale = ck->find("layer.w.weight_scale_inv");
  REQUIRE(scale);
  CHECK(scale->type == dtype::f32);
  CHECK(scale->shape == std::vector<int64_t>{2, 3});
  CHECK(ck->find("layer.w.weight")->type == dtype::f8_e4m3);

  auto ra = ck->read_f32("a.weight", {3, 5});
  REQUIRE(ra);
  CHECK(*ra == a);
  auto rb = ck->read_f32("b.bias", {7});
  REQUIRE(rb);
  for (size_t i = 0; i < b.size(); ++i) CHECK((*rb)[i] == sm::bf16_to_f32(sm::f32_to_bf16(b[i])));

  auto rw = ck->read_f32("layer.w.weight", {130, 260});
  REQUIRE(rw);
  auto scales = ck->read_f32("layer.w.weight_scale_inv", {2, 3});
  REQUIRE(scales);
  int bad = 0;
  for (int r = 0; r < 130; ++r) {
    for (int c = 0; c < 260; ++c) {
      const float amax = (*scales)[(r / 128) * 3 + c / 128] * 448.0f;
      if (std::fabs((*rw)[r * 260 + c] - w[r * 260 + c]) > amax / 16.0f) ++bad;
    }
  }
  CHECK(bad == 0);
  // scale_inv = block amax / 448, exactly.
  std::vector<float> amax(6, 0.0f);
  for (int r = 0; r < 130; ++r) {
    for (int c = 0; c < 260; ++c) {
      float& m = amax[(r / 128) * 3 + c / 128];
      m = std::max(m, std::fabs(w[r * 260 + c]));
    }
  }
  for (int i = 0; i < 6; ++i) CHECK((*scales)[i] == amax[i] / 448.0f);
  CHECK((*scales)[0] > 20.0f * (*scales)[3]);  // block (0, 0) holds the ×100 row
}

TEST_CASE("fp8 all-zero block gets scale 1") {
  temp_dir dir;
  std::vector<float> w(4 * 4, 0.0f);
  REQUIRE(sm::write_safetensors(dir.file("model.safetensors"), {{"z.weight", {4, 4}, w.data(), dtype::f8_e4m3}}));
  auto ck = sm::checkpoint::open(dir.path);
  REQUIRE(ck);
  auto s = ck->read_f32("z.weight_scale_inv", {1, 1});
  REQUIRE(s);
  CHECK((*s)[0] == 1.0f);
  auto v = ck->read_f32("z.weight", {4, 4});
  REQUIRE(v);
  CHECK(*v == w);
}

TEST_CASE("sharded checkpoint through model.safetensors.index.json") {
  temp_dir dir;
  const std::vector<float> x = random_values(4 * 3, 4, 1.0f), y = random_values(6, 5, 1.0f);
  REQUIRE(sm::write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                                {{"x.weight", {4, 3}, x.data(), dtype::f32}}));
  REQUIRE(sm::write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                                {{"y.weight", {6}, y.data(), dtype::bf16},
                                 {"y.extra", {2}, y.data(), dtype::f32}}));
  write_text(dir.file("model.safetensors.index.json"),
             R"({"metadata": {"total_size": 60}, "weight_map": {
                  "x.weight": "model-00001-of-00002.safetensors",
                  "y.weight": "model-00002-of-00002.safetensors"}})");
  progress_calls = progress_done = progress_total = 0;
  auto ck = sm::checkpoint::open(dir.path, record_progress);
  REQUIRE_MESSAGE(ck, ck.error().message);
  CHECK(progress_calls == 2);
  CHECK(progress_done == progress_total);
  CHECK(progress_total == fs::file_size(dir.file("model-00001-of-00002.safetensors")) +
                              fs::file_size(dir.file("model-00002-of-00002.safetensors")));
  CHECK(ck->has("x.weight"));
  CHECK(ck->has("y.extra"));  // in a shard but not in the weight_map: still reachable
  CHECK(ck->find("y.weight")->file == dir.file("model-00002-of-00002.safetensors"));
  auto rx = ck->read_f32("x.weight", {4, 3});
  REQUIRE(rx);
  CHECK(*rx == x);
  auto ry = ck->read_f32("y.weight", {6});
  REQUIRE(ry);
  CHECK((*ry)[5] == sm::bf16_to_f32(sm::f32_to_bf16(y[5])));
}

TEST_CASE("malformed: truncated data region names the tensor") {
  temp_dir dir;
  const std::vector<float> v(16, 1.0f);
  const std::string path = dir.file("model.safetensors");
  REQUIRE(sm::write_safetensors(path, {{"first", {8}, v.data(), dtype::f32}, {"second", {8}, v.data(), dtype::f32}}));
  fs::resize_file(path, fs::file_size(path) - 4);
  auto ck = sm::checkpoint::open(dir.path);
  REQUIRE_FALSE(ck);
  INFO(ck.error().message);
  CHECK(ck.error().code == errc::truncated);
  CHECK(contains(ck.error().message, path));
  CHECK(contains(ck.error().message, "'second'"));
}

TEST_CASE("malformed: header length past end of file") {
  temp_dir dir;
  const std::string path = dir.file("model.safetensors");
  write_raw(path, "{}", 0, 1000);
  auto f = sm::safetensors_file::open(path);
  REQUIRE_FALSE(f);
  INFO(f.error().message);
  CHECK(f.error().code == errc::truncated);
  CHECK(contains(f.error().message, path));
  CHECK(contains(f.error().message, "header length 1000"));

  write_text(path, "abc");  // shorter than the length field itself
  auto g = sm::safetensors_file::open(path);
  REQUIRE_FALSE(g);
  CHECK(g.error().code == errc::truncated);
  CHECK(contains(g.error().message, path));
}

TEST_CASE("malformed: header is not JSON") {
  temp_dir dir;
  auto ck = open_raw(dir, R"({"w": {"dtype": "F32", )", 0);
  REQUIRE_FALSE(ck);
  INFO(ck.error().message);
  CHECK(ck.error().code == errc::bad_json);
  CHECK(contains(ck.error().message, dir.file("model.safetensors")));
}

TEST_CASE("malformed: unknown dtype") {
  temp_dir dir;
  auto ck = open_raw(dir, R"({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})", 16);
  REQUIRE_FALSE(ck);
  INFO(ck.error().message);
  CHECK(ck.error().code == errc::bad_dtype);
  CHECK(contains(ck.error().message, "'w'"));
  CHECK(contains(ck.error().message, "F128"));
}

TEST_CASE("malformed: byte count differs from shape × dtype size") {
  temp_dir dir;
  auto ck = open_raw(dir, R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 16);
  REQUIRE_FALSE(ck);
  INFO(ck.error().message);
  CHECK(ck.error().code == errc::bad_shape);
  CHECK(contains(ck.error().message, "'w'"));
  CHECK(contains(ck.error().message, "[2, 2]"));
}

TEST_CASE("malformed: offsets past the end, unordered, overlapping, wrong field types") {
  temp_dir dir;
  auto past = open_raw(dir, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  REQUIRE_FALSE(past);
  CHECK(past.error().code == errc::truncated);
  CHECK(contains(past.error().message, "'w'"));

  auto unordered = open_raw(dir, R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}})", 8);
  REQUIRE_FALSE(unordered);
  CHECK(unordered.error().code == errc::bad_value);
  CHECK(contains(unordered.error().message, "'w'"));

  auto overlap = open_raw(dir, R"({"p": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "q": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  REQUIRE_FALSE(overlap);
  CHECK(overlap.error().code == errc::bad_value);
  CHECK(contains(overlap.error().message, "'p'"));
  CHECK(contains(overlap.error().message, "'q'"));

  auto shape = open_raw(dir, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
  REQUIRE_FALSE(shape);
  CHECK(shape.error().code == errc::bad_json);
  CHECK(contains(shape.error().message, "'w'"));
  CHECK(contains(shape.error().message, "shape"));

  auto missing = open_raw(dir, R"({"w": {"dtype": "F32", "shape": [1]}})", 4);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == errc::missing_field);
  CHECK(contains(missing.error().message, "data_offsets"));

  auto meta = open_raw(dir, R"({"__metadata__": {"k": 1}})", 0);
  REQUIRE_FALSE(meta);
  CHECK(contains(meta.error().message, "'k'"));
}

TEST_CASE("read_f32: missing tensor, wrong shape, unsupported dtype") {
  temp_dir dir;
  const std::vector<float> a(15, 0.5f);
  REQUIRE(sm::write_safetensors(dir.file("model.safetensors"), {{"a", {3, 5}, a.data(), dtype::f32}}));
  auto ck = sm::checkpoint::open(dir.path);
  REQUIRE(ck);

  auto missing = ck->read_f32("nope", {1});
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == errc::missing_field);
  CHECK(missing.error().message == "missing tensor 'nope' in " + dir.path);

  auto shape = ck->read_f32("a", {5, 3});
  REQUIRE_FALSE(shape);
  INFO(shape.error().message);
  CHECK(shape.error().code == errc::bad_shape);
  CHECK(contains(shape.error().message, "'a'"));
  CHECK(contains(shape.error().message, "[3, 5]"));
  CHECK(contains(shape.error().message, "[5, 3]"));

  temp_dir dir2;
  write_raw(dir2.file("model.safetensors"), R"({"ids": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})", 8);
  auto ints = sm::checkpoint::open(dir2.path);
  REQUIRE(ints);
  auto r = ints->read_f32("ids", {2});
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::bad_dtype);
  CHECK(contains(r.error().message, "'ids'"));
  CHECK(contains(r.error().message, "I32"));
}

TEST_CASE("read_f32: fp8 tensor without (or with a misshapen) scale tensor") {
  temp_dir dir;
  auto ck = open_raw(dir, R"({"x.weight": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [0, 4]}})", 4);
  REQUIRE(ck);
  auto r = ck->read_f32("x.weight", {2, 2});
  REQUIRE_FALSE(r);
  INFO(r.error().message);
  CHECK(r.error().code == errc::missing_field);
  CHECK(contains(r.error().message, "'x.weight'"));
  CHECK(contains(r.error().message, "'x.weight_scale_inv'"));

  temp_dir dir2;
  auto ck2 = open_raw(dir2, R"({"x.weight": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [0, 4]},
      "x.weight_scale_inv": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  REQUIRE(ck2);
  auto r2 = ck2->read_f32("x.weight", {2, 2});
  REQUIRE_FALSE(r2);
  CHECK(r2.error().code == errc::bad_shape);
  CHECK(contains(r2.error().message, "'x.weight_scale_inv'"));
}

TEST_CASE("checkpoint: index referencing a missing shard, or a tensor not in its shard") {
  temp_dir dir;
  const std::vector<float> v(4, 1.0f);
  REQUIRE(sm::write_safetensors(dir.file("s1.safetensors"), {{"a", {4}, v.data(), dtype::f32}}));
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  auto missing_shard = sm::checkpoint::open(dir.path);
  REQUIRE_FALSE(missing_shard);
  INFO(missing_shard.error().message);
  CHECK(missing_shard.error().code == errc::io);
  CHECK(contains(missing_shard.error().message, "s2.safetensors"));

  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})");
  auto ghost = sm::checkpoint::open(dir.path);
  REQUIRE_FALSE(ghost);
  INFO(ghost.error().message);
  CHECK(ghost.error().code == errc::missing_field);
  CHECK(contains(ghost.error().message, "'ghost'"));
  CHECK(contains(ghost.error().message, "s1.safetensors"));

  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": )");
  auto bad = sm::checkpoint::open(dir.path);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == errc::bad_json);
  CHECK(contains(bad.error().message, "model.safetensors.index.json"));
}

TEST_CASE("checkpoint: empty directory names the directory") {
  temp_dir dir;
  auto ck = sm::checkpoint::open(dir.path);
  REQUIRE_FALSE(ck);
  CHECK(ck.error().code == errc::io);
  CHECK(contains(ck.error().message, dir.path));
}

TEST_CASE("writer rejects bad input and leaves no file behind") {
  temp_dir dir;
  const std::vector<float> v(8, 1.0f);
  const std::string path = dir.file("out.safetensors");
  auto one_d = sm::write_safetensors(path, {{"w.weight", {8}, v.data(), dtype::f8_e4m3}});
  REQUIRE_FALSE(one_d);
  CHECK(one_d.error().code == errc::bad_shape);
  CHECK(contains(one_d.error().message, "'w.weight'"));

  auto twice = sm::write_safetensors(path, {{"w", {8}, v.data(), dtype::f32}, {"w", {8}, v.data(), dtype::bf16}});
  REQUIRE_FALSE(twice);
  CHECK(twice.error().code == errc::bad_value);

  auto ints = sm::write_safetensors(path, {{"w", {8}, v.data(), dtype::i32}});
  REQUIRE_FALSE(ints);
  CHECK(ints.error().code == errc::bad_dtype);

  auto no_dir = sm::write_safetensors(dir.file("missing/out.safetensors"), {{"w", {8}, v.data(), dtype::f32}});
  REQUIRE_FALSE(no_dir);
  CHECK(no_dir.error().code == errc::io);
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("corrupted or cut files fail cleanly or read in bounds") {
  temp_dir dir;
  const std::vector<float> w = random_values(130 * 20, 7, 1.0f);
  const std::string good = dir.file("good.safetensors");
  REQUIRE(sm::write_safetensors(good, {{"a.weight", {130, 20}, w.data(), dtype::f8_e4m3},
                                       {"b", {13}, w.data(), dtype::bf16}}));
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  std::mt19937 rng(42);  // fixed seed: the same 300 corruptions every run
  int opened = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string mutated = bytes;
    if (trial % 3 == 0) {
      mutated.resize(rng() % bytes.size());
    } else {
      const size_t at = rng() % (8 + header_len);
      mutated[at] = static_cast<char>(rng() % 256);
    }
    std::ofstream(dir.file("model.safetensors"), std::ios::binary | std::ios::trunc) << mutated;
    auto ck = sm::checkpoint::open(dir.path);
    if (!ck) {
      CHECK_FALSE(ck.error().message.empty());
      continue;
    }
    ++opened;
    for (const std::string& name : ck->names()) (void)ck->read_f32(name, ck->find(name)->shape);
  }
  CHECK(opened < 300);
}
