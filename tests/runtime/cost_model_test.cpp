// Tests for the prefill cost model: the fit must recover known coefficients from noiseless
// samples and stay close under 5% multiplicative noise, refuse samples that cannot determine
// the model, and largest_chunk must match hand-computed answers and a brute-force scan for
// odd coefficients. Persistence must round-trip and reject malformed files by field.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "runtime/core/cost_model.hpp"

using namespace shoal::runtime;

namespace {

// Roughly an 8B model on one GPU: 2 ms launch overhead, 20 us per token, attention terms.
const cost_model truth(2e-3, 2e-5, 4e-10, 2e-10);

std::vector<int64_t> grid_n() { return {16, 32, 64, 128, 256, 512, 1024, 2048, 3000, 4096}; }
std::vector<int64_t> grid_p() { return {0, 512, 2048, 8192, 16384, 32768}; }

std::vector<cost_sample> grid_samples(const cost_model& m, double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::vector<cost_sample> out;
  for (int64_t n : grid_n())
    for (int64_t p : grid_p())
      out.push_back({n, p, m.predict(n, p) * (1.0 + noise * gauss(rng))});
  return out;
}

bool close_rel(double got, double want, double tol) {
  return std::fabs(got - want) <= tol * std::fabs(want);
}

// Largest n in [1, hi] with predict <= budget by exhaustive scan (0 if none).
int64_t brute_largest(const cost_model& m, int64_t p, double budget, int64_t hi) {
  int64_t best = 0;
  for (int64_t n = 1; n <= hi; ++n)
    if (m.predict(n, p) <= budget) best = n;
  return best;
}

std::string temp_dir(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("shoal_cost_model_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

std::string error_of(std::string_view text) {
  const auto m = cost_model::from_json(text, "cm.json");
  REQUIRE_FALSE(m.has_value());
  return m.error();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const char* valid_json = R"({"version": 1, "preset": "p", "machine": "m",
  "coefficients": {"a": 0.001, "b": 1e-5, "c": 0, "d": 0}, "samples": 7, "r2": 0.99})";

}  // namespace

TEST_CASE("cost_model: fit recovers noiseless coefficients") {
  const auto samples = grid_samples(truth, 0.0, 1);
  const auto fitted = cost_model::fit(samples);
  INFO((fitted ? std::string() : fitted.error()));
  REQUIRE(fitted.has_value());
  CHECK(close_rel(fitted->a(), truth.a(), 1e-6));
  CHECK(close_rel(fitted->b(), truth.b(), 1e-6));
  CHECK(close_rel(fitted->c(), truth.c(), 1e-6));
  CHECK(close_rel(fitted->d(), truth.d(), 1e-6));
  CHECK(fitted->quality().samples == static_cast<int64_t>(samples.size()));
  CHECK(fitted->quality().r2 > 1.0 - 1e-12);
  CHECK(fitted->quality().rms_rel_error < 1e-9);

  const auto plain = cost_model::fit(samples, cost_model::weighting::absolute);
  REQUIRE(plain.has_value());
  CHECK(close_rel(plain->a(), truth.a(), 1e-6));
  CHECK(close_rel(plain->b(), truth.b(), 1e-6));
  CHECK(close_rel(plain->c(), truth.c(), 1e-6));
  CHECK(close_rel(plain->d(), truth.d(), 1e-6));
}

TEST_CASE("cost_model: fit with 5% multiplicative noise predicts within 10%") {
  for (uint64_t seed : {1u, 2u, 3u}) {
    INFO("SEED=" << seed);
    const auto fitted = cost_model::fit(grid_samples(truth, 0.05, seed));
    REQUIRE(fitted.has_value());
    for (int64_t n : grid_n())
      for (int64_t p : grid_p()) {
        INFO("n=" << n << " p=" << p);
        CHECK(close_rel(fitted->predict(n, p), truth.predict(n, p), 0.10));
      }
    CHECK(fitted->quality().r2 > 0.98);
    CHECK(fitted->quality().rms_rel_error > 0.02);
    CHECK(fitted->quality().rms_rel_error < 0.10);
  }
}

TEST_CASE("cost_model: fit refuses too few or degenerate samples") {
  const std::vector<cost_sample> three = {{16, 0, 0.1}, {32, 0, 0.2}, {64, 100, 0.3}};
  const auto few = cost_model::fit(three);
  REQUIRE_FALSE(few.has_value());
  CHECK(contains(few.error(), "at least 4 samples"));

  const std::vector<cost_sample> same(10, cost_sample{128, 1024, 0.01});
  const auto one_point = cost_model::fit(same);
  REQUIRE_FALSE(one_point.has_value());
  CHECK(contains(one_point.error(), "singular"));
  CHECK(contains(one_point.error(), "feature n "));

  std::vector<cost_sample> one_p;  // n*p is 4096 * n: indistinguishable from n
  for (int64_t n : grid_n()) one_p.push_back({n, 4096, truth.predict(n, 4096)});
  const auto no_p = cost_model::fit(one_p);
  REQUIRE_FALSE(no_p.has_value());
  CHECK(contains(no_p.error(), "feature n*p"));
  CHECK(contains(no_p.error(), "1 distinct p"));

  std::vector<cost_sample> zero_p;  // the n*p column is all zeros
  for (int64_t n : grid_n()) zero_p.push_back({n, 0, truth.predict(n, 0)});
  CHECK_FALSE(cost_model::fit(zero_p).has_value());

  std::vector<cost_sample> two_n;  // n^2 is affine in n over two distinct n
  for (int64_t n : {64, 512})
    for (int64_t p : grid_p()) two_n.push_back({n, p, truth.predict(n, p)});
  const auto no_d = cost_model::fit(two_n);
  REQUIRE_FALSE(no_d.has_value());
  CHECK(contains(no_d.error(), "feature n^2"));

  auto bad = grid_samples(truth, 0.0, 1);
  bad[5].seconds = std::nan("");
  CHECK(contains(cost_model::fit(bad).error(), "sample 5"));
  bad[5] = {0, 0, 0.1};
  CHECK(contains(cost_model::fit(bad).error(), "n = 0"));
  bad[5] = {8, -1, 0.1};
  CHECK(contains(cost_model::fit(bad).error(), "p = -1"));
}

TEST_CASE("cost_model: predict is never negative") {
  const cost_model odd(-0.5, 1e-5, -1e-9, -1e-8);
  for (int64_t n : {1, 10, 1000, 32768, 1 << 20})
    for (int64_t p : {0, 1000, 1 << 20}) CHECK(odd.predict(n, p) >= 0.0);
  CHECK(odd.predict(1, 0) == 0.0);
  const cost_model nan_model(std::nan(""), 0, 0, 0);
  CHECK(nan_model.predict(10, 10) == 0.0);
  // A plain-OLS fit on samples whose intercept goes negative still predicts >= 0.
  std::vector<cost_sample> s;
  for (int64_t n : grid_n())
    for (int64_t p : grid_p()) s.push_back({n, p, std::max(0.0, -0.01 + truth.predict(n, p))});
  CHECK(contains(cost_model::fit(s).error(), "seconds is 0"));  // relative weighting needs > 0
  const auto fitted = cost_model::fit(s, cost_model::weighting::absolute);
  REQUIRE(fitted.has_value());
  CHECK(fitted->a() < 0.0);
  CHECK(fitted->predict(1, 0) == 0.0);
}

TEST_CASE("cost_model: largest_chunk hand-computed cases") {
  const cost_model linear(0.001, 1e-5, 0.0, 0.0);  // t = 1 ms + 10 us per token
  // 0.001 + 1e-5 n <= 0.011 + slack -> n = 1000 (the slack absorbs the rounding of 0.011).
  CHECK(linear.largest_chunk(0, 0.011 + 1e-12, 32768, 100000) == 1000);
  CHECK(linear.largest_chunk(0, 0.011 - 1e-12, 32768, 100000) == 999);
  CHECK(linear.largest_chunk(0, 0.0105 + 1e-12, 32768, 100000) == 950);
  CHECK(linear.largest_chunk(0, 10.0, 32768, 100000) == 32768);  // token budget caps
  CHECK(linear.largest_chunk(0, 10.0, 32768, 700) == 700);        // remaining tokens cap
  CHECK(linear.largest_chunk(0, 0.011 + 1e-12, 32768, 700) == 700);
  CHECK(linear.largest_chunk(0, 0.0005, 32768, 700) == 1);  // n = 1 overruns: still progress
  CHECK(linear.largest_chunk(0, -1.0, 32768, 700) == 1);
  CHECK(linear.largest_chunk(0, std::nan(""), 32768, 700) == 1);
  CHECK(linear.largest_chunk(0, 10.0, 0, 700) == 1);  // no token budget: still progress
  CHECK(linear.largest_chunk(0, 10.0, 32768, 0) == 0);
  CHECK(linear.largest_chunk(0, 10.0, 32768, -3) == 0);
  CHECK(linear.largest_chunk(0, 10.0, 32768, 1) == 1);

  // With the prefix term: t = 1 ms + n * (10 us + 1e-9 * 9000) = 1 ms + 19 us * n.
  const cost_model with_prefix(0.001, 1e-5, 1e-9, 0.0);
  CHECK(with_prefix.largest_chunk(9000, 0.001 + 19e-6 * 500 + 1e-12, 32768, 100000) == 500);
  // Quadratic: t = n^2 * 1e-8, budget 0.01 s -> n = 1000.
  const cost_model square(0.0, 0.0, 0.0, 1e-8);
  CHECK(square.largest_chunk(0, 0.01 + 1e-12, 32768, 100000) == 1000);

  // Odd fits where n = 1 overruns but longer chunks fit. Falling: t = 10 ms - 10 us * n.
  const cost_model falling(0.01, -1e-5, 0.0, 0.0);
  CHECK(falling.largest_chunk(0, 0.005, 32768, 800) == 800);
  CHECK(falling.largest_chunk(0, 0.005, 32768, 400) == 1);  // nothing fits: progress
  // Dip: t = 10 ms - 20 us n + 1e-8 n^2 = 1e-8 (n - 1000)^2, <= 2.5 ms on [500, 1500].
  const cost_model dip(0.01, -2e-5, 0.0, 1e-8);
  CHECK(dip.largest_chunk(0, 0.0025 + 1e-12, 32768, 100000) == 1500);
  CHECK(dip.largest_chunk(0, 0.0025 + 1e-12, 1200, 100000) == 1200);
  CHECK(dip.largest_chunk(0, 0.0025 + 1e-12, 32768, 400) == 1);
}

TEST_CASE("cost_model: largest_chunk matches a brute-force scan for odd coefficients") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const cost_model m(1e-3 * u(rng), 1e-5 * u(rng), 1e-9 * u(rng), 1e-8 * u(rng));
    const int64_t p = static_cast<int64_t>(4096 * (u(rng) + 1.0));
    const double budget = 0.02 * (u(rng) + 1.0);
    const int64_t hi = 1 + static_cast<int64_t>(1000 * (u(rng) + 1.0));
    INFO("trial=" << trial);
    const int64_t got = m.largest_chunk(p, budget, 32768, hi);
    const int64_t want = std::max<int64_t>(1, brute_largest(m, p, budget, hi));
    CHECK(got == want);
    if (got > 1 || m.predict(1, p) <= budget) CHECK(m.predict(got, p) <= budget);
    ++checked;
  }
  CHECK(checked == 400);
}

TEST_CASE("cost_model: JSON round trip") {
  auto fitted = cost_model::fit(grid_samples(truth, 0.05, 4));
  REQUIRE(fitted.has_value());
  fitted->set_preset("llama-8b");
  fitted->set_machine("H200");
  const auto back = cost_model::from_json(fitted->to_json(), "rt.json");
  INFO((back ? std::string() : back.error()));
  REQUIRE(back.has_value());
  CHECK(back->a() == fitted->a());  // exact: doubles are written with round-trip precision
  CHECK(back->b() == fitted->b());
  CHECK(back->c() == fitted->c());
  CHECK(back->d() == fitted->d());
  CHECK(back->preset() == "llama-8b");
  CHECK(back->machine() == "H200");
  CHECK(back->quality().samples == fitted->quality().samples);
  CHECK(back->quality().r2 == fitted->quality().r2);
  CHECK(back->quality().rms_rel_error == fitted->quality().rms_rel_error);

  const auto minimal = cost_model::from_json(valid_json, "cm.json");  // no rms_rel_error
  REQUIRE(minimal.has_value());
  CHECK(minimal->b() == 1e-5);
  CHECK(minimal->quality().samples == 7);
  CHECK(minimal->quality().rms_rel_error == 0.0);
}

TEST_CASE("cost_model: malformed JSON errors name the file and field") {
  CHECK(error_of("{not json") == "cm.json: invalid JSON");
  CHECK(error_of("[1, 2]") == "cm.json: top level is not a JSON object");
  std::string text = valid_json;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  CHECK(contains(error_of(with("\"version\": 1", "\"version\": 2")), "\"version\" is 2"));
  CHECK(contains(error_of(with("\"version\": 1,", "")), "field \"version\" is missing"));
  CHECK(contains(error_of(with("\"version\": 1", "\"version\": \"1\"")), "not an integer"));
  CHECK(contains(error_of(with("\"preset\": \"p\"", "\"preset\": 3")),
                 "field \"preset\" is not a string"));
  CHECK(contains(error_of(with("\"machine\": \"m\",", "")), "field \"machine\" is missing"));
  CHECK(error_of(with("\"c\": 0,", "")) == "cm.json: field \"coefficients.c\" is missing");
  CHECK(error_of(with("\"b\": 1e-5", "\"b\": \"x\"")) ==
        "cm.json: field \"coefficients.b\" is not a number");
  CHECK(contains(error_of(with("\"a\": 0.001", "\"a\": 1e400")), "cm.json: "));
  CHECK(contains(error_of(with("{\"a\": 0.001, \"b\": 1e-5, \"c\": 0, \"d\": 0}", "[1]")),
                 "field \"coefficients\" is not an object"));
  CHECK(contains(error_of(with("\"samples\": 7", "\"samples\": -7")), "\"samples\" is negative"));
  CHECK(contains(error_of(with("\"samples\": 7", "\"samples\": 7.5")),
                 "\"samples\" is not an integer"));
  CHECK(contains(error_of(with(", \"r2\": 0.99", "")), "field \"r2\" is missing"));
  CHECK(contains(error_of(with("\"r2\": 0.99", "\"r2\": 0.99, \"rms_rel_error\": -1")),
                 "\"rms_rel_error\" is negative"));
}

TEST_CASE("cost_model: save and load through a directory") {
  const std::string dir = temp_dir("save");
  cost_model m(0.001, 1e-5, 2e-10, 3e-10);
  m.set_preset("Qwen/Qwen3 8B");
  m.set_machine("node 7");
  const auto path = save_cost_model(dir, m);
  INFO((path ? std::string() : path.error()));
  REQUIRE(path.has_value());
  CHECK(*path == dir + "/cost-Qwen_Qwen3_8B-node_7.json");
  CHECK(std::filesystem::exists(*path));
  int files = 0;  // no temporary left behind
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  CHECK(files == 1);

  const auto loaded = load_cost_model(dir, "Qwen/Qwen3 8B", "node 7");
  INFO((loaded ? std::string() : loaded.error()));
  REQUIRE(loaded.has_value());
  CHECK(loaded->c() == 2e-10);
  CHECK(loaded->predict(100, 100) == m.predict(100, 100));

  // Overwrite in place, then a name that sanitizes onto the same file is refused.
  m = cost_model(0.002, 1e-5, 2e-10, 3e-10);
  m.set_preset("Qwen/Qwen3 8B");
  m.set_machine("node 7");
  REQUIRE(save_cost_model(dir, m).has_value());
  CHECK(load_cost_model(dir, "Qwen/Qwen3 8B", "node 7")->a() == 0.002);
  const auto clash = load_cost_model(dir, "Qwen_Qwen3_8B", "node 7");
  REQUIRE_FALSE(clash.has_value());
  CHECK(contains(clash.error(), "field \"preset\""));

  const auto missing = load_cost_model(dir, "other", "node 7");
  REQUIRE_FALSE(missing.has_value());
  CHECK(contains(missing.error(), "cost-other-node_7.json: cannot open"));

  std::ofstream(dir + "/cost-broken-node_7.json") << "{\"version\": 1";
  const auto broken = load_cost_model(dir, "broken", "node 7");
  REQUIRE_FALSE(broken.has_value());
  CHECK(broken.error() == dir + "/cost-broken-node_7.json: invalid JSON");
  std::filesystem::remove_all(dir);
}

TEST_CASE("cost_model: names are sanitized for file names") {
  CHECK(sanitize_name("Intel(R) Xeon(R) Platinum 8480+") == "Intel_R_Xeon_R_Platinum_8480");
  CHECK(sanitize_name("a.b_c-D9") == "a.b_c-D9");
  CHECK(sanitize_name("../x") == ".._x");
  CHECK(sanitize_name("") == "unknown");
  CHECK(sanitize_name("  //  ") == "unknown");
  const std::string id = machine_id();
  CHECK_FALSE(id.empty());
  CHECK(sanitize_name(id) == id);
}

TEST_CASE("cost_fitter: nothing until enough distinct steps, then the model that generated them") {
  const cost_model truth(0.004, 2e-4, 1e-7, 5e-8);
  cost_fitter f(12);
  CHECK_FALSE(f.fit());
  for (int rep = 0; rep < 3; ++rep)  // the same step over and over determines nothing
    f.add(64, 0, truth.predict(64, 0));
  CHECK(f.samples() == 1);
  f.add(0, 0, 1.0);      // no tokens: not a sample
  f.add(8, -1, 1.0);     // bad prefix
  f.add(8, 0, 0.0);      // no time
  f.add(8, 0, NAN);
  CHECK(f.samples() == 1);
  int64_t k = 0;
  for (int64_t n : {8, 32, 96, 200})
    for (int64_t p : {0, 300, 1200}) {
      f.add(n, p, truth.predict(n, p));
      ++k;
    }
  REQUIRE(f.samples() == 13);
  auto m = f.fit();
  REQUIRE(m);
  CHECK(m->quality().samples == 13);
  CHECK(m->predict(150, 700) == doctest::Approx(truth.predict(150, 700)).epsilon(1e-6));
  cost_fitter few(12);
  for (int64_t p = 0; p < 20; ++p) few.add(p % 3 == 0 ? 16 : 48, 100 * p, truth.predict(16, 100 * p));  // 2 distinct n
  CHECK_FALSE(few.fit());
}
