// `shoal bench fit-cost` as an operator runs it before `shoal bench cluster`: with --model it
// times the checkpoint a cluster serves (its linears in checkpoint precision) and saves the
// fitted cost model; a directory that holds no checkpoint is refused naming what is missing.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/core/cost_model.hpp"
#include "tests/support/cluster.hpp"

using namespace shoal;
namespace fs = std::filesystem;

TEST_CASE("shoal bench fit-cost --model fits the checkpoint's weights, and refuses a directory without one") {
  test::temp_dir dir;
  const fs::path model = dir.path / "model", out = dir.path / "fits", empty = dir.path / "empty";
  test::generated_model(model, "tiny", 3);
  fs::create_directories(empty);

  std::string text;
  int rc = test::run_shoal(dir.path,
                           {"bench", "fit-cost", "--preset", "tiny", "--model", model.string(), "--reps", "1",
                            "--threads", "1", "--dir", out.string()},
                           text);
  REQUIRE_MESSAGE(rc == 0, text);
  CHECK(text.find("fitted") != std::string::npos);
  int files = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    ++files;
    CHECK(e.path().filename().string().rfind("cost-tiny-", 0) == 0);
    auto m = runtime::read_cost_model_file(e.path().string());
    REQUIRE_MESSAGE(m, m.error());
    CHECK(m->predict(64, 0) > 0);
  }
  CHECK(files == 1);

  rc = test::run_shoal(dir.path, {"bench", "fit-cost", "--model", empty.string(), "--dir", out.string()}, text);
  CHECK(rc != 0);
  CHECK_MESSAGE(text.find("config.json") != std::string::npos, text);
}

// `shoal sim --config` simulates the cluster a node-config directory describes, as `shoal bench
// cluster` does: the colocated sample has 6 ranks in one EP group and no decode pool, and its
// ranks speculate, which the shipped CPU profile times.
TEST_CASE("shoal sim --config replays a trace on the shape of a node-config directory") {
  test::temp_dir dir;
  runtime::cost_model m(0.01, 0.0005, 1e-6, 0);
  m.set_preset("small"), m.set_machine("test");
  auto file = runtime::save_cost_model(dir.path.string(), m);
  REQUIRE_MESSAGE(file, file.error());
  const fs::path src(SHOAL_SOURCE_DIR);
  std::string text;
  auto sim_on = [&](const fs::path& config) {
    return test::run_shoal(dir.path,
                           {"sim", "--config", config.string(), "--profile", (src / "config/sim/cpu-deepseek.json").string(),
                            "--cost-model", *file, "--requests", "20", "--speed", "0.25", "--length-scale", "0.03125",
                            "--max-input", "1024", "--policies", "shoal"},
                           text);
  };
  int rc = sim_on(src / "config/deepseek-colocated");
  REQUIRE_MESSAGE(rc == 0, text);
  CHECK_MESSAGE(text.find("6 prefill ranks (EP 6) + 0 decode ranks") != std::string::npos, text);
  CHECK_MESSAGE(text.find("handoffs 0") != std::string::npos, text);
  rc = sim_on(src / "config/deepseek-shape");
  REQUIRE_MESSAGE(rc == 0, text);
  CHECK_MESSAGE(text.find("2 prefill ranks (EP 2) + 4 decode ranks (EP 4)") != std::string::npos, text);
  rc = sim_on(dir.path);
  CHECK(rc != 0);
  CHECK_MESSAGE(text.find("gateway") != std::string::npos, text);
  // The shape comes from the configs: a rank option beside --config is refused by name.
  rc = test::run_shoal(dir.path, {"sim", "--config", (src / "config/deepseek-shape").string(), "--prefill-ranks", "4"}, text);
  CHECK(rc != 0);
  CHECK_MESSAGE(text.find("--prefill-ranks") != std::string::npos, text);
}
