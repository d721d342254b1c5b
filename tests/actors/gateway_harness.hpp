// The harness of the gateway tests (gateway_test.cpp, gateway_images_test.cpp): an in-process
// cluster (detached engines over a tiny checkpoint written to a temp dir, balancers fed a
// hand-made membership, the gateway on a loopback port), HTTP helpers over http_call, the
// plain-engine references the tests compare with, and the table of bad inputs.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/engine_actor.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/http_client.hpp"
#include "actors/interfaces.hpp"
#include "actors/balancer_actors.hpp"
#include "model/generate.hpp"
#include "runtime/serve/chat_template.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "runtime/serve/openai_api.hpp"
#include "tests/support/image_files.hpp"


namespace shoal::test::gateway_harness {

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;


constexpr auto wait_timeout = std::chrono::seconds(30);
constexpr auto call_timeout = std::chrono::milliseconds(30'000);
constexpr int64_t model_context = 4096;  // the checkpoint's context, raised from the preset's 512

// -- the model ---------------------------------------------------------------------------------

// The tiny checkpoint, written once per process into a temp dir (removed at exit). Its
// max_position_embeddings is raised so that a 2,000-token request fits (the engine refuses a
// request longer than the context; nothing else depends on it).
struct checkpoint {
  fs::path dir;
  runtime::loaded_model model;
  ~checkpoint() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir.parent_path(), ec);
  }
};

inline const checkpoint& tiny_checkpoint() {
  static checkpoint c = [] {
    checkpoint out;
    std::string tmpl = (fs::temp_directory_path() / "gateway_test.XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    out.dir = fs::path(tmpl) / "tiny";
    model::generate_options gen;
    gen.preset = "tiny";
    gen.seed = 11;
    gen.vision = true;  // image chat requests too
    gen.out_dir = out.dir.string();
    REQUIRE(model::generate_checkpoint(gen));
    json config;
    {
      std::ifstream f(out.dir / "config.json");
      config = json::parse(f);
    }
    config["max_position_embeddings"] = model_context;
    {
      std::ofstream f(out.dir / "config.json");
      f << config.dump(2);
      REQUIRE(f.good());
    }
    auto m = runtime::load_model_dir(out.dir.string(), false);
    REQUIRE(m);
    out.model = std::move(*m);
    return out;
  }();
  return c;
}

inline const model::tokenizer& tok() { return *tiny_checkpoint().model.tokenizer; }

inline runtime::engine_config engine_config() {
  runtime::engine_config e = runtime::default_engine_config(tiny_checkpoint().model.weights->config, 16);
  e.batch_invariant = true;  // outputs independent of batch composition: re-routing relies on it
  return e;
}

// What a plain engine generates greedily for `prompt` (ignore_eos).
inline std::vector<int32_t> reference_tokens(const std::vector<int32_t>& prompt, int32_t max_tokens,
                                      std::vector<runtime::prompt_image> images = {},
                                      runtime::sampling_params o = {}) {
  runtime::engine e(tiny_checkpoint().model.weights, engine_config());
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  REQUIRE(e.add_request(prompt, o, runtime::traffic_class::chat, std::move(images)));
  auto done = e.run_to_completion();
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].output.size() == static_cast<size_t>(max_tokens));
  return done[0].output;
}

// Text as a JSON response carries it: invalid UTF-8 (random bytes of a random model) replaced.
inline std::string as_json_text(const std::string& raw) {
  return json::parse(json(raw).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

inline std::vector<int32_t> chat_prompt(const std::vector<runtime::chat_message>& messages) {
  auto t = runtime::load_chat_template(tiny_checkpoint().dir / "tokenizer_config.json");
  REQUIRE(t);
  auto text = t->tmpl.render(messages, true, t->bos_token, t->eos_token);
  REQUIRE(text);
  return tok().encode(*text);
}

// -- the cluster -------------------------------------------------------------------------------

struct system_config : caf::actor_system_config {
  system_config() {
    set("scheduler.max-threads", size_t{4});
    actors::add_message_types(*this);
  }
};

// Engines, the balancers and gateways in one actor system (the normal scheduler: the gateway's
// connection threads and the detached engines run for real).
struct cluster {
  system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<actors::engine_actor> engines;
  actors::balancers bal = actors::spawn_balancers(sys, {});
  std::vector<actors::gateway_start> gateways;
  uint64_t version = 0;

  explicit cluster(size_t n_engines) {
    for (size_t i = 0; i < n_engines; ++i)
      engines.push_back(actors::spawn_engine(sys, tiny_checkpoint().model.weights, engine_config(), true, nullptr,
                                             tiny_checkpoint().model.tokenizer));
    std::vector<size_t> all(n_engines);
    for (size_t i = 0; i < n_engines; ++i) all[i] = i;
    route_to(all);
  }

  ~cluster() {
    // No connection thread may be inside the gateway when the system goes away.
    for (auto& g : gateways) {
      auto deadline = std::chrono::steady_clock::now() + wait_timeout;
      while (in_flight(g) != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
      caf::anon_send_exit(g.actor, caf::exit_reason::user_shutdown);
    }
    caf::anon_send_exit(bal.prefill, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(bal.decode, caf::exit_reason::user_shutdown);
    for (auto& e : engines) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
  }

  // The balancers' membership: one engine node whose ranks are engines[idx...].
  void route_to(const std::vector<size_t>& idx) {
    actors::node_info n;
    n.name = "engines";
    n.host = "127.0.0.1";
    n.roles = {"engine"};
    for (size_t i : idx) n.ranks.push_back({static_cast<int32_t>(i), caf::actor_cast<caf::actor>(engines[i]), {}});
    actors::membership m;
    m.version = ++version;
    m.nodes.push_back(std::move(n));
    caf::anon_send(bal.prefill, m);
    caf::anon_send(bal.decode, std::move(m));
  }

  static actors::gateway_config default_gateway() {
    actors::gateway_config g;
    g.host = "127.0.0.1";
    g.port = 0;
    g.model_id = "tiny";
    g.context_length = tiny_checkpoint().model.weights->config.max_position_embeddings;
    g.request_timeout = call_timeout;
    g.tokenizer_config = tiny_checkpoint().dir / "tokenizer_config.json";
    g.vision = tiny_checkpoint().model.weights->config.vision;
    return g;
  }

  uint16_t start_gateway(actors::gateway_config g = default_gateway()) {
    auto started = actors::spawn_gateway(sys, bal, tiny_checkpoint().model.tokenizer, std::move(g));
    REQUIRE_MESSAGE(started, (started ? "" : started.error()));
    gateways.push_back(*started);
    return started->port;
  }

  actors::engine_stats_snapshot stats(size_t i) {
    caf::scoped_actor self{sys};
    std::optional<actors::engine_stats_snapshot> out;
    self->request(engines[i], wait_timeout, stats_atom_v)
      .receive([&](const actors::engine_stats_snapshot& s) { out = s; }, [&](caf::error&) {});
    REQUIRE(out);
    return *out;
  }

  int64_t in_flight(const actors::gateway_start& g) {
    caf::scoped_actor self{sys};
    int64_t n = -1;
    self->request(g.actor, wait_timeout, stats_atom_v).receive([&](int64_t v) { n = v; }, [&](caf::error&) {});
    return n;
  }

  std::optional<bool> drain(const actors::gateway_start& g) {
    caf::scoped_actor self{sys};
    std::optional<bool> out;
    self->request(g.actor, wait_timeout, drain_atom_v).receive([&](bool b) { out = b; }, [&](caf::error&) {});
    return out;
  }
};

// -- HTTP --------------------------------------------------------------------------------------

inline actors::http_response call(uint16_t port, const std::string& method, const std::string& target,
                           const std::string& body = "", actors::http_call_options opts = {}) {
  opts.timeout = call_timeout;
  auto r = actors::http_call("127.0.0.1", port, method, target, body, opts);
  if (!r) FAIL(method << " " << target << ": " << r.error());
  return *r;
}

inline actors::http_response post(uint16_t port, const std::string& target, const json& body,
                           actors::http_call_options opts = {}) {
  return call(port, "POST", target, body.dump(), std::move(opts));
}

inline json parse(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) FAIL("not JSON: " << text);
  return j;
}

// An OpenAI error body: exact status, type, param and code (empty: JSON null), some message.
inline void check_error(int status, const std::string& body, int want_status, const std::string& type,
                 const std::string& param = "", const std::string& code = "") {
  CHECK(status == want_status);
  json j = json::parse(body, nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), "error body is not JSON: " << body);
  REQUIRE(j.contains("error"));
  const json& e = j["error"];
  CHECK(e["type"] == type);
  if (param.empty())
    CHECK(e["param"].is_null());
  else
    CHECK(e["param"] == param);
  if (code.empty())
    CHECK(e["code"].is_null());
  else
    CHECK(e["code"] == code);
  CHECK(e["message"].is_string());
  CHECK(!e["message"].get<std::string>().empty());
}

inline void check_error(const actors::http_response& r, int want_status, const std::string& type,
                 const std::string& param = "", const std::string& code = "") {
  check_error(r.status, r.body, want_status, type, param, code);
  CHECK(r.headers.count("content-type") == 1);
  if (r.headers.count("content-type")) CHECK(r.headers.at("content-type") == "application/json");
}

// Sends `bytes` over a fresh loopback connection and reads until the server closes.
inline std::string raw_exchange(uint16_t port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  std::string got;
  auto deadline = std::chrono::steady_clock::now() + wait_timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

inline json completion_body(const std::string& prompt, int32_t max_tokens) {
  return {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

// The JSON payloads of an SSE body, checked to end with [DONE] (which is dropped).
inline std::vector<json> sse_chunks(const std::string& body) {
  auto data = actors::sse_data(body);
  REQUIRE(!data.empty());
  CHECK(data.back() == "[DONE]");
  std::vector<json> out;
  for (size_t i = 0; i + 1 < data.size(); ++i) out.push_back(parse(data[i]));
  return out;
}

// One bad request through real HTTP and the error it must get (param, code: empty = null).
struct bad_case {
  const char* name;
  std::string method, target, body;
  int status;
  std::string type, param, code;
};

// The gateway under test limits the context to 64 tokens and bodies to 4,096 bytes.
inline std::vector<bad_case> bad_input_cases() {
  const json user_hi = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto with = [](json j) { return j.dump(); };
  const std::string completions = "/v1/completions", chat = "/v1/chat/completions";
  return {
    {"malformed JSON", "POST", completions, R"({"model": "tiny", "prompt": )", 400, "invalid_request_error", "", ""},
    {"body not an object", "POST", completions, "[1, 2, 3]", 400, "invalid_request_error", "", ""},
    {"unknown model", "POST", completions, with({{"model", "gpt-4"}, {"prompt", "hi"}}), 404, "not_found_error",
     "model", "model_not_found"},
    {"missing prompt", "POST", completions, with({{"model", "tiny"}}), 400, "invalid_request_error", "prompt", ""},
    {"prompt wrong type", "POST", completions, with({{"model", "tiny"}, {"prompt", 42}}), 400,
     "invalid_request_error", "prompt", ""},
    {"empty messages", "POST", chat, with({{"model", "tiny"}, {"messages", json::array()}}), 400,
     "invalid_request_error", "messages", ""},
    {"bad role", "POST", chat,
     with({{"model", "tiny"}, {"messages", json::array({{{"role", "wizard"}, {"content", "hi"}}})}}), 400,
     "invalid_request_error", "messages[0].role", ""},
    {"max_tokens 0", "POST", completions, with({{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 0}}), 400,
     "invalid_request_error", "max_tokens", ""},
    {"max_tokens over the limit", "POST", completions,
     with({{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 5000}}), 400, "invalid_request_error", "max_tokens", ""},
    {"temperature 3", "POST", chat, with({{"model", "tiny"}, {"messages", user_hi}, {"temperature", 3}}), 400,
     "invalid_request_error", "temperature", ""},
    {"top_p 0", "POST", completions, with({{"model", "tiny"}, {"prompt", "hi"}, {"top_p", 0}}), 400,
     "invalid_request_error", "top_p", ""},
    {"n 2", "POST", completions, with({{"model", "tiny"}, {"prompt", "hi"}, {"n", 2}}), 400, "invalid_request_error",
     "n", ""},
    {"stop with 5 strings", "POST", completions,
     with({{"model", "tiny"}, {"prompt", "hi"}, {"stop", {"a", "b", "c", "d", "e"}}}), 400, "invalid_request_error",
     "stop", ""},
    {"stream not bool", "POST", completions, with({{"model", "tiny"}, {"prompt", "hi"}, {"stream", "yes"}}), 400,
     "invalid_request_error", "stream", ""},
    {"prompt over the context length", "POST", completions,
     with({{"model", "tiny"}, {"prompt", std::string(200, 'a')}, {"max_tokens", 4}}), 400, "invalid_request_error",
     "", "context_length_exceeded"},
    {"chat over the context length", "POST", chat,
     with({{"model", "tiny"},
           {"messages", json::array({{{"role", "user"}, {"content", std::string(100, 'b')}}})},
           {"max_tokens", 4}}),
     400, "invalid_request_error", "", "context_length_exceeded"},
    {"prompt token id over the vocabulary", "POST", completions,
     with({{"model", "tiny"}, {"prompt", {1, 2, 99999}}, {"max_tokens", 4}}), 400, "invalid_request_error", "prompt",
     ""},
    {"body over max_body_bytes", "POST", completions,
     with({{"model", "tiny"}, {"prompt", std::string(5000, 'x')}}), 413, "request_too_large", "", ""},
    {"body far over max_body_bytes", "POST", completions,
     with({{"model", "tiny"}, {"prompt", std::string(400'000, 'x')}}), 413, "request_too_large", "", ""},
    {"unknown route", "GET", "/v1/nothing", "", 404, "not_found_error", "", ""},
    {"unknown POST route", "POST", "/v1/embeddings", with({{"model", "tiny"}}), 404, "not_found_error", "", ""},
    {"wrong method on completions", "GET", completions, "", 405, "invalid_request_error", "", ""},
    {"wrong method on models", "DELETE", "/v1/models", "", 405, "invalid_request_error", "", ""},
  };
}


}  // namespace shoal::test::gateway_harness
