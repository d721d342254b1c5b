// Run reports (report.hpp). The SVG is written by hand: a few rectangles, lines and labels.
#include "sim/report.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/metrics.hpp"

namespace shoal::sim {

serving_metrics serving_from_records(const std::string& policy, const std::vector<request_record>& records,
                                     int64_t prefill_ranks, double ttft_slo_s, double tpot_slo_s) {
  serving_metrics m;
  m.policy = policy;
  m.requests = static_cast<int64_t>(records.size());
  std::vector<double> ttft, tpot;
  double first = records.empty() ? 0 : records.front().arrival_s, last = first;
  int64_t good = 0;
  double hit = 0, prompt = 0;
  for (const auto& r : records) {
    first = std::min(first, r.arrival_s);
    prompt += static_cast<double>(r.input);
    if (r.finish_s < 0 || r.first_token_s < 0) continue;
    ++m.finished;
    last = std::max(last, r.finish_s);
    hit += static_cast<double>(r.cached_tokens);
    const double t1 = r.first_token_s - r.arrival_s;
    ttft.push_back(t1);
    double tp = 0;
    if (r.output > 1) {
      tp = (r.finish_s - r.first_token_s) / static_cast<double>(r.output - 1);
      tpot.push_back(tp);
    }
    if ((ttft_slo_s <= 0 || t1 <= ttft_slo_s) && (tpot_slo_s <= 0 || tp <= tpot_slo_s)) ++good;
  }
  m.span_s = last - first;
  m.ttft_p50 = runtime::percentile(ttft, 0.5), m.ttft_p90 = runtime::percentile(ttft, 0.9);
  m.ttft_p99 = runtime::percentile(ttft, 0.99);
  m.tpot_p50 = runtime::percentile(tpot, 0.5), m.tpot_p90 = runtime::percentile(tpot, 0.9);
  m.tpot_p99 = runtime::percentile(tpot, 0.99);
  m.goodput_rps = m.span_s > 0 ? static_cast<double>(good) / m.span_s : 0;
  m.slo_attainment = m.requests > 0 ? static_cast<double>(good) / static_cast<double>(m.requests) : 0;
  m.prefix_hit_ratio = prompt > 0 ? hit / prompt : 0;
  (void)prefill_ranks;
  return m;
}

serving_metrics summarize(const sim_result& r, const sim_config& c) {
  serving_metrics m = serving_from_records(r.policy, r.requests, c.prefill_ranks, c.prof.ttft_slo_s, c.prof.tpot_slo_s);
  m.prefill_tps_per_rank = m.span_s > 0 ? r.prefill.tokens / (static_cast<double>(c.prefill_ranks) * m.span_s) : 0;
  m.decode_avg_sps = r.decode.busy_s > 0 ? static_cast<double>(r.decode.steps) / r.decode.busy_s : 0;
  m.per_user_tps = m.decode_avg_sps;  // one token per step per request (no MTP in the simulator)
  m.decode_balance = r.decode.balance_mean, m.decode_balance_p10 = r.decode.balance_p10;
  m.decode_pct_perfect = r.decode.pct_of_perfect;
  m.prefill_balance = r.prefill.balance_mean, m.prefill_pct_perfect = r.prefill.pct_of_perfect;
  m.prefix_hit_ratio = r.prompt_tokens > 0 ? static_cast<double>(r.hit_tokens) / static_cast<double>(r.prompt_tokens) : 0;
  m.handoffs = r.handoffs, m.kept = r.kept, m.preemptions = r.preemptions;
  m.wall_s = r.wall_s;
  m.state_hash = r.state_hash;
  return m;
}

std::string to_jsonl(const serving_metrics& m, const std::string& kind, const std::string& extra_json) {
  nlohmann::json j = {{"kind", kind}, {"policy", m.policy}, {"requests", m.requests}, {"finished", m.finished},
                      {"ttft_p50_s", m.ttft_p50}, {"ttft_p90_s", m.ttft_p90}, {"ttft_p99_s", m.ttft_p99},
                      {"tpot_p50_s", m.tpot_p50}, {"tpot_p90_s", m.tpot_p90}, {"tpot_p99_s", m.tpot_p99},
                      {"goodput_rps", m.goodput_rps}, {"slo_attainment", m.slo_attainment}, {"span_s", m.span_s},
                      {"prefill_tokens_per_s_per_rank", m.prefill_tps_per_rank}, {"decode_avg_sps", m.decode_avg_sps},
                      {"per_user_tokens_per_s", m.per_user_tps}, {"decode_balance_ratio", m.decode_balance},
                      {"decode_balance_ratio_p10", m.decode_balance_p10}, {"decode_pct_of_perfect", m.decode_pct_perfect},
                      {"prefill_balance_ratio", m.prefill_balance}, {"prefill_pct_of_perfect", m.prefill_pct_perfect},
                      {"prefix_hit_ratio_tokens", m.prefix_hit_ratio}, {"handoffs", m.handoffs}, {"kept", m.kept},
                      {"preemptions", m.preemptions}, {"wall_s", m.wall_s},
                      {"state_hash", fmt::format("{:016x}", m.state_hash)}};
  if (!extra_json.empty()) {
    nlohmann::json extra = nlohmann::json::parse(extra_json, nullptr, false);
    if (extra.is_object()) j.update(extra);
  }
  return j.dump();
}

std::string format_table(const std::vector<serving_metrics>& ms) {
  std::string out = fmt::format("{:<16} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>6}\n",
                                "policy", "done", "TTFTp50", "TTFTp90", "TTFTp99", "TPOTp50", "TPOTp90", "TPOTp99",
                                "goodput", "dBal", "d%perf", "pBal", "p%perf", "hit");
  for (const auto& m : ms)
    out += fmt::format("{:<16} {:>6} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.4f} {:>8.4f} {:>8.4f} {:>8.2f} {:>7.3f} {:>7.1f} {:>7.3f} {:>7.1f} {:>6.3f}\n",
                       m.policy, m.finished, m.ttft_p50, m.ttft_p90, m.ttft_p99, m.tpot_p50, m.tpot_p90, m.tpot_p99,
                       m.goodput_rps, m.decode_balance, m.decode_pct_perfect, m.prefill_balance, m.prefill_pct_perfect,
                       m.prefix_hit_ratio);
  return out;
}

namespace {

std::string escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '<') o += "&lt;";
    else if (ch == '>') o += "&gt;";
    else if (ch == '&') o += "&amp;";
    else o += ch;
  }
  return o;
}

const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

}  // namespace

std::string comparison_svg(const std::string& title, const std::vector<serving_metrics>& ms,
                           const std::vector<std::vector<std::pair<double, double>>>& timelines) {
  struct panel {
    const char* name;
    double (*get)(const serving_metrics&);
  };
  const panel panels[] = {
      {"TTFT p99 (s)", [](const serving_metrics& m) { return m.ttft_p99; }},
      {"TPOT p99 (ms)", [](const serving_metrics& m) { return m.tpot_p99 * 1e3; }},
      {"decode balance ratio", [](const serving_metrics& m) { return m.decode_balance; }},
      {"decode % of perfectly balanced", [](const serving_metrics& m) { return m.decode_pct_perfect; }},
      {"goodput (req/s)", [](const serving_metrics& m) { return m.goodput_rps; }},
      {"prefix hit ratio (tokens)", [](const serving_metrics& m) { return m.prefix_hit_ratio; }},
  };
  const int pw = 300, ph = 220, cols = 3;
  const bool lines = !timelines.empty();
  const int rows = 2 + (lines ? 1 : 0);
  const int W = cols * pw + 20, H = rows * ph + 70;
  std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n"
                              "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
                              "<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n", W, H, escape(title));
  for (size_t i = 0; i < ms.size(); ++i)  // legend
    s += fmt::format("<rect x=\"{}\" y=\"32\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"41\">{}</text>\n",
                     10 + 130 * i, colours[i % 8], 24 + 130 * i, escape(ms[i].policy));
  for (size_t p = 0; p < std::size(panels); ++p) {
    const int x0 = 10 + static_cast<int>(p % cols) * pw, y0 = 55 + static_cast<int>(p / cols) * ph;
    double mx = 0;
    for (const auto& m : ms) mx = std::max(mx, panels[p].get(m));
    if (mx <= 0) mx = 1;
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", x0, y0 + 12, panels[p].name);
    const int base = y0 + ph - 30, top = y0 + 25, bw = std::max(8, (pw - 40) / std::max<int>(1, static_cast<int>(ms.size())) - 6);
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", x0, base, x0 + pw - 20, base);
    for (size_t i = 0; i < ms.size(); ++i) {
      const double v = panels[p].get(ms[i]);
      const int h = static_cast<int>(std::lround((base - top) * v / mx));
      const int x = x0 + 5 + static_cast<int>(i) * (bw + 6);
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", x, base - h, bw, h, colours[i % 8]);
      s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"9\">{:.3g}</text>\n", x, base - h - 3, v);
    }
  }
  if (lines) {
    const int x0 = 10, y0 = 55 + 2 * ph, w = cols * pw - 30, h = ph - 50;
    double tmax = 0;
    for (const auto& tl : timelines)
      for (auto [t, v] : tl) tmax = std::max(tmax, t);
    if (tmax <= 0) tmax = 1;
    s += fmt::format("<text x=\"{}\" y=\"{}\">decode balance ratio over virtual time (0 to {:.0f} s; y from 0 to 1)</text>\n",
                     x0, y0 + 12, tmax);
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", x0, y0 + 20, w, h);
    for (size_t i = 0; i < timelines.size(); ++i) {
      std::string pts;
      for (auto [t, v] : timelines[i])
        pts += fmt::format("{:.1f},{:.1f} ", x0 + w * t / tmax, y0 + 20 + h * (1 - std::clamp(v, 0.0, 1.0)));
      s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" points=\"{}\"/>\n", colours[i % 8], pts);
    }
  }
  s += "</svg>\n";
  return s;
}

}  // namespace shoal::sim
