// Workloads (workload.hpp).
#include "sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "sim/prefix_trace.hpp"

namespace shoal::sim {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr int64_t first_id = 300;  // clear of the special tokens of every preset

int64_t scaled(int64_t n, double s) { return std::max<int64_t>(1, std::llround(static_cast<double>(n) * s)); }

}  // namespace

std::vector<int32_t> prompt_tokens(const sim_request& r, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(r.input_len));
  const uint64_t span = static_cast<uint64_t>(std::max<int64_t>(vocab - first_id, 1));
  for (int64_t i = 0; i < r.input_len; ++i) {
    // No hash ids: a prompt of its own, shared with no other request.
    const int64_t h = r.hash_ids.empty() ? -1 - r.id
                                          : r.hash_ids[static_cast<size_t>(std::min<int64_t>(i / r.hash_block, static_cast<int64_t>(r.hash_ids.size()) - 1))];
    t[static_cast<size_t>(i)] = static_cast<int32_t>(first_id + mix(static_cast<uint64_t>(h) * 1000003u + static_cast<uint64_t>(i % r.hash_block)) % span);
  }
  return t;
}

int32_t output_token(int64_t request_id, int64_t index, int64_t vocab) {
  const uint64_t span = static_cast<uint64_t>(std::max<int64_t>(vocab - first_id, 1));
  return static_cast<int32_t>(first_id + mix(~static_cast<uint64_t>(request_id) * 7919u + static_cast<uint64_t>(index)) % span);
}

std::expected<std::vector<sim_request>, std::string> mooncake_workload(const std::string& path, const workload_options& o) {
  if (!(o.speed > 0) || !(o.length_scale > 0)) return std::unexpected("speed and length scale must be > 0");
  auto rows = sim::load_mooncake_trace(path);
  if (!rows) return std::unexpected(rows.error());
  std::vector<sim_request> out;
  const double t0 = rows->empty() ? 0 : static_cast<double>(rows->front().timestamp_ms) / 1000.0;
  for (const auto& row : *rows) {
    if (o.max_requests > 0 && static_cast<int64_t>(out.size()) >= o.max_requests) break;
    const double t = static_cast<double>(row.timestamp_ms) / 1000.0 - t0;
    if (o.duration_s > 0 && t > o.duration_s) break;
    if (row.hash_ids.empty() || row.input_length < 1 || row.output_length < 1)
      return std::unexpected(path + ": request " + std::to_string(out.size()) + " has no prompt blocks or no output");
    sim_request r;
    r.id = static_cast<int64_t>(out.size());
    r.arrival_s = t / o.speed;
    r.input_len = scaled(row.input_length, o.length_scale);
    r.output_len = scaled(row.output_length, o.length_scale);
    r.hash_block = scaled(512, o.length_scale);
    r.hash_ids = row.hash_ids;
    if (o.max_input > 0 && r.input_len > o.max_input) r.input_len = o.max_input;
    const int64_t blocks = (r.input_len + r.hash_block - 1) / r.hash_block;
    if (static_cast<int64_t>(r.hash_ids.size()) > blocks) r.hash_ids.resize(static_cast<size_t>(blocks));
    while (static_cast<int64_t>(r.hash_ids.size()) < blocks)  // rounding: a unique id past the row's
      r.hash_ids.push_back(-1 - r.id * 16 - static_cast<int64_t>(r.hash_ids.size()));
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

struct pdf {
  std::vector<int64_t> values;
  std::discrete_distribution<size_t> pick;
};

// "{45: 0.0096, 46: 0.0117, ...}" (a Python dict literal of value → probability).
std::expected<pdf, std::string> parse_pdf(const std::string& text, const std::string& where) {
  pdf p;
  std::vector<double> w;
  size_t i = text.find('{');
  if (i == std::string::npos) return std::unexpected(where + ": not a {value: probability} literal");
  ++i;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i < text.size() && text[i] == '}') break;
    char* end = nullptr;
    double v = std::strtod(text.c_str() + i, &end);
    if (end == text.c_str() + i) return std::unexpected(where + ": bad value at offset " + std::to_string(i));
    i = static_cast<size_t>(end - text.c_str());
    while (i < text.size() && text[i] == ' ') ++i;
    if (i >= text.size() || text[i] != ':') return std::unexpected(where + ": ':' expected at offset " + std::to_string(i));
    ++i;
    double q = std::strtod(text.c_str() + i, &end);
    if (end == text.c_str() + i || !std::isfinite(q) || q < 0)
      return std::unexpected(where + ": bad probability at offset " + std::to_string(i));
    i = static_cast<size_t>(end - text.c_str());
    p.values.push_back(std::max<int64_t>(1, std::llround(v)));
    w.push_back(q);
  }
  if (p.values.empty()) return p;  // a block without traffic
  p.pick = std::discrete_distribution<size_t>(w.begin(), w.end());
  return p;
}

struct window {
  double start = 0, rate = 0;
  std::string family;
  double shape = 0, scale = 0;
};

struct arrival {
  double t;
  int64_t in, out;
};

using length_pdfs = std::map<double, std::pair<pdf, pdf>>;  // window start → (input, output)

// A chunk's rate windows (chunk-N-trace.csv: start, rate, _, family, shape, scale).
std::expected<std::vector<window>, std::string> read_windows(const std::filesystem::path& trace_path) {
  std::ifstream f(trace_path);
  std::vector<window> windows;
  std::string line;
  int ln = 0;
  while (std::getline(f, line)) {
    ++ln;
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string cell[6];
    for (auto& c : cell) std::getline(ss, c, ',');
    window w;
    try {
      w.start = std::stod(cell[0]);
      w.rate = std::stod(cell[1]);
      w.family = cell[3];
      w.shape = cell[4].empty() ? 0 : std::stod(cell[4]);
      w.scale = cell[5].empty() ? 0 : std::stod(cell[5]);
    } catch (const std::exception&) {
      return std::unexpected(trace_path.string() + ":" + std::to_string(ln) + ": bad number");
    }
    if (w.rate > 0 && ((w.family != "Gamma" && w.family != "Weibull") || !(w.shape > 0) || !(w.scale > 0)))
      return std::unexpected(trace_path.string() + ":" + std::to_string(ln) + ": active window without a Gamma/Weibull (shape, scale)");
    windows.push_back(w);
  }
  return windows;
}

// A chunk's length distributions by window (chunk-N-dataset.json).
std::expected<length_pdfs, std::string> read_lengths(const std::filesystem::path& ds_path) {
  std::ifstream df(ds_path);
  nlohmann::json ds = nlohmann::json::parse(df, nullptr, false);
  if (ds.is_discarded() || !ds.is_object()) return std::unexpected(ds_path.string() + ": not a JSON object");
  length_pdfs lengths;
  for (auto& [k, v] : ds.items()) {
    if (!v.is_object() || !v.contains("input_tokens") || !v.contains("output_tokens") ||
        !v["input_tokens"].is_string() || !v["output_tokens"].is_string())
      return std::unexpected(ds_path.string() + ": window " + k + ": input_tokens / output_tokens strings missing");
    auto in = parse_pdf(v["input_tokens"].get<std::string>(), ds_path.string() + ": " + k + ".input_tokens");
    if (!in) return std::unexpected(in.error());
    auto out = parse_pdf(v["output_tokens"].get<std::string>(), ds_path.string() + ": " + k + ".output_tokens");
    if (!out) return std::unexpected(out.error());
    lengths.emplace(std::stod(k), std::make_pair(std::move(*in), std::move(*out)));
  }
  if (lengths.empty()) return std::unexpected(ds_path.string() + ": no windows");
  return lengths;
}

// The arrivals of one chunk's windows inside [o.start_s, o.start_s + o.duration_s), each
// with lengths drawn from the distribution of its window (or the last one before it).
std::expected<void, std::string> sample_chunk(const std::vector<window>& windows, length_pdfs& lengths,
                                              const std::string& ds_name, const workload_options& o,
                                              std::mt19937_64& rng, std::vector<arrival>& all) {
  const double end_s = o.start_s + o.duration_s;
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const window& w = windows[wi];
    const double w_end = wi + 1 < windows.size() ? windows[wi + 1].start : w.start + 600;
    if (w.rate <= 0 || w_end <= o.start_s || w.start >= end_s) continue;
    auto block = lengths.upper_bound(w.start);
    if (block != lengths.begin()) --block;
    while (block != lengths.begin() && (block->second.first.values.empty() || block->second.second.values.empty())) --block;
    if (block->second.first.values.empty() || block->second.second.values.empty())
      return std::unexpected(ds_name + ": window at " + std::to_string(static_cast<int64_t>(w.start)) +
                             " s has traffic but no length distribution at or before it");
    auto& [in_pdf, out_pdf] = block->second;
    double t = w.start;
    std::gamma_distribution<double> gamma(w.shape, w.scale);
    std::weibull_distribution<double> weibull(w.shape, w.scale);
    while (true) {
      t += w.family == "Gamma" ? gamma(rng) : weibull(rng);
      if (t >= w_end || t >= end_s) break;
      const int64_t in = in_pdf.values[in_pdf.pick(rng)], out = out_pdf.values[out_pdf.pick(rng)];
      if (t >= o.start_s) all.push_back({t - o.start_s, in, out});
    }
  }
  return {};
}

std::vector<sim_request> to_requests(std::vector<arrival>& all, const workload_options& o) {
  std::stable_sort(all.begin(), all.end(), [](const arrival& a, const arrival& b) { return a.t < b.t; });
  std::vector<sim_request> out;
  for (const arrival& a : all) {
    if (o.max_requests > 0 && static_cast<int64_t>(out.size()) >= o.max_requests) break;
    sim_request r;
    r.id = static_cast<int64_t>(out.size());
    r.arrival_s = a.t / o.speed;
    r.input_len = scaled(a.in, o.length_scale);
    if (o.max_input > 0) r.input_len = std::min(r.input_len, o.max_input);
    r.output_len = scaled(a.out, o.length_scale);
    r.hash_block = scaled(512, o.length_scale);
    for (int64_t b = 0; b * r.hash_block < r.input_len; ++b) r.hash_ids.push_back(-1 - r.id * 4096 - b);  // no sharing known
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::expected<std::vector<sim_request>, std::string> servegen_workload(const std::string& dir, const workload_options& o,
                                                                       uint64_t seed) {
  namespace fs = std::filesystem;
  if (!(o.duration_s > 0)) return std::unexpected("a ServeGen workload needs a duration (seconds of the day)");
  if (!(o.speed > 0) || !(o.length_scale > 0)) return std::unexpected("speed and length scale must be > 0");
  std::vector<std::pair<int, fs::path>> chunks;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("chunk-") && n.ends_with("-trace.csv")) chunks.emplace_back(std::stoi(n.substr(6)), e.path());
  }
  if (ec || chunks.empty()) return std::unexpected(dir + ": no chunk-N-trace.csv files");
  std::sort(chunks.begin(), chunks.end());
  std::vector<arrival> all;
  for (const auto& [id, trace_path] : chunks) {
    std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(id));
    auto windows = read_windows(trace_path);
    if (!windows) return std::unexpected(windows.error());
    const fs::path ds_path = trace_path.parent_path() / ("chunk-" + std::to_string(id) + "-dataset.json");
    auto lengths = read_lengths(ds_path);
    if (!lengths) return std::unexpected(lengths.error());
    if (auto ok = sample_chunk(*windows, *lengths, ds_path.string(), o, rng, all); !ok) return std::unexpected(ok.error());
  }
  return to_requests(all, o);
}

}  // namespace shoal::sim
