// Writes the binary seeds of fuzz/corpus/ (valid frames, images and files made by the
// project's own encoders), so each fuzzer starts from inputs that reach past the first
// check: make_seeds DIR (DIR/<target>/<seed>). The text seeds (requests, templates, configs)
// are written by hand. Run again after a wire format changes, and commit the result.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/safetensors.hpp"
#include "runtime/ep/expert_parallel.hpp"
#include "runtime/vision/image.hpp"
#include "storage/bulk.hpp"
// The test helpers bring doctest along; nothing here registers tests. With doctest off, the
// PNG writer's REQUIREs vanish and leave a variable unused (only write_jpeg is used here).
#define DOCTEST_CONFIG_DISABLE
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wunused-variable"
#include "tests/support/image_files.hpp"
#pragma clang diagnostic pop

namespace fs = std::filesystem;
using namespace shoal;

namespace {

// One seed: `prefix` (the target's selector byte, when it has one) then `body`.
void write_seed(const fs::path& dir, const std::string& name, std::vector<uint8_t> body, int prefix = -1) {
  fs::create_directories(dir);
  if (prefix >= 0) body.insert(body.begin(), static_cast<uint8_t>(prefix));
  std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(body.data()), body.size());
}

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const fs::path out = argv[1];

  // Expert-parallel frames: a dispatch from rank 2 to rank 0 of 4 (experts 0-3 of 16), and
  // a combine of 3 rows (the fuzz target's step 7, slot 1, hidden 8).
  runtime::dispatch_frame d;
  d.step = 7, d.slot = 1, d.source = 2, d.hidden = 8, d.rows = 2;
  d.xn.assign(16, 0.5f);
  d.pair_row = {0, 1, 1};
  d.pair_expert = {0, 2, 3};
  write_seed(out / "ep_frame", "dispatch", runtime::encode_dispatch(d), 0);
  const std::vector<float> rows(24, 1.25f);
  write_seed(out / "ep_frame", "combine", runtime::encode_combine(7, 1, 2, 8, rows.data(), 3), 1);

  // Bulk frames: a put with its payload after the head, a get, and replies.
  storage::bulk_request put;
  put.op = storage::bulk_op::put, put.id = 42, put.key.block = {0x0123456789abcdefull, 0xfedcba9876543210ull};
  put.key.index = 3, put.traffic_class = 1;
  const std::vector<uint8_t> chunk(64, 0xab);
  put.payload = chunk;
  auto head = storage::encode_request_head(put);
  head.insert(head.end(), chunk.begin(), chunk.end());
  write_seed(out / "bulk_frame", "put", head, 0);
  storage::bulk_request get = put;
  get.op = storage::bulk_op::get, get.payload = {};
  write_seed(out / "bulk_frame", "get", storage::encode_request_head(get), 0);
  storage::bulk_reply ok{42, storage::bulk_ok, "", chunk};
  write_seed(out / "bulk_frame", "reply_ok", storage::encode_reply(ok), 1);
  storage::bulk_reply bad{0, storage::bulk_invalid_request, "chunk index 300 out of range [0, 254]", {}};
  write_seed(out / "bulk_frame", "reply_error", storage::encode_reply(bad), 1);

  // Images: PNG (RGB, grey + alpha) and JPEG (baseline, progressive), as files and data URLs.
  runtime::rgb_image img;
  img.width = 6, img.height = 4;
  for (int i = 0; i < 24; ++i) img.rgb.insert(img.rgb.end(), {uint8_t(i * 10), uint8_t(255 - i * 10), uint8_t(i * 3)});
  const auto png = runtime::encode_png(img);
  write_seed(out / "image", "rgb.png", png, 0);
  const std::string url = runtime::png_data_url(img);
  write_seed(out / "image", "rgb.png.url", std::vector<uint8_t>(url.begin(), url.end()), 1);
  write_seed(out / "image", "baseline.jpg", test::write_jpeg(img.rgb, 6, 4, 3, 90, false), 0);
  write_seed(out / "image", "progressive.jpg", test::write_jpeg(img.rgb, 6, 4, 3, 90, true), 0);

  // safetensors: a bf16 and an f32 tensor with metadata, as the checkpoint writer lays them out.
  const std::vector<float> w(12, 0.25f), b(3, -1.0f);
  const fs::path tmp = out / "model.safetensors.tmp";
  if (!model::write_safetensors(tmp.string(), {{"layer.weight", {3, 4}, w.data(), model::dtype::bf16},
                                               {"layer.bias", {3}, b.data(), model::dtype::f32}},
                                {{"format", "pt"}})) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", tmp.c_str());
    return 1;
  }
  write_seed(out / "safetensors", "two_tensors", read_file(tmp));
  fs::remove(tmp);
  return 0;
}
