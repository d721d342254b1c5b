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
