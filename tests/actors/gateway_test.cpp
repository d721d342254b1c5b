// The gateway end to end: an in-process cluster (detached engines over a tiny checkpoint written
// to a temp dir, balancers fed a hand-made membership, the gateway on a loopback port) driven
// over real HTTP with http_call. Bad input gets its exact OpenAI error and leaves the gateway
// serving; good requests stream the same greedy tokens as a plain runtime::engine; a client
// leaving cancels its generation; an engine killed mid-stream is replaced without a visible
// seam; drain refuses new requests. Every wait is bounded.
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
#include "runtime/chat_template.hpp"
#include "runtime/engine_setup.hpp"
#include "runtime/openai_api.hpp"
#include "tests/support/image_files.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

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

const checkpoint& tiny_checkpoint() {
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

const model::tokenizer& tok() { return *tiny_checkpoint().model.tokenizer; }

runtime::engine_config engine_config() {
  runtime::engine_config e = runtime::default_engine_config(tiny_checkpoint().model.weights->config, 16);
  e.batch_invariant = true;  // outputs independent of batch composition: re-routing relies on it
  return e;
}

// What a plain engine generates greedily for `prompt` (ignore_eos).
std::vector<int32_t> reference_tokens(const std::vector<int32_t>& prompt, int32_t max_tokens,
                                      std::vector<runtime::prompt_image> images = {},
                                      actors::sampling_options o = {}) {
  runtime::engine e(tiny_checkpoint().model.weights, engine_config());
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  REQUIRE(e.add_request(prompt, actors::to_sampling_params(o), runtime::traffic_class::chat, std::move(images)));
  auto done = e.run_to_completion();
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].output.size() == static_cast<size_t>(max_tokens));
  return done[0].output;
}

// Text as a JSON response carries it: invalid UTF-8 (random bytes of a random model) replaced.
std::string as_json_text(const std::string& raw) {
  return json::parse(json(raw).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

std::vector<int32_t> chat_prompt(const std::vector<runtime::chat_message>& messages) {
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

actors::http_response call(uint16_t port, const std::string& method, const std::string& target,
                           const std::string& body = "", actors::http_call_options opts = {}) {
  opts.timeout = call_timeout;
  auto r = actors::http_call("127.0.0.1", port, method, target, body, opts);
  if (!r) FAIL(method << " " << target << ": " << r.error());
  return *r;
}

actors::http_response post(uint16_t port, const std::string& target, const json& body,
                           actors::http_call_options opts = {}) {
  return call(port, "POST", target, body.dump(), std::move(opts));
}

json parse(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) FAIL("not JSON: " << text);
  return j;
}

// An OpenAI error body: exact status, type, param and code (empty: JSON null), some message.
void check_error(int status, const std::string& body, int want_status, const std::string& type,
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

void check_error(const actors::http_response& r, int want_status, const std::string& type,
                 const std::string& param = "", const std::string& code = "") {
  check_error(r.status, r.body, want_status, type, param, code);
  CHECK(r.headers.count("content-type") == 1);
  if (r.headers.count("content-type")) CHECK(r.headers.at("content-type") == "application/json");
}

// Sends `bytes` over a fresh loopback connection and reads until the server closes.
std::string raw_exchange(uint16_t port, const std::string& bytes) {
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

json completion_body(const std::string& prompt, int32_t max_tokens) {
  return {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

// The JSON payloads of an SSE body, checked to end with [DONE] (which is dropped).
std::vector<json> sse_chunks(const std::string& body) {
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
std::vector<bad_case> bad_input_cases() {
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

}  // namespace

// -- bad input ---------------------------------------------------------------------------------

TEST_CASE("gateway answers bad input with the exact OpenAI error and keeps serving") {
  cluster c(1);
  auto g = cluster::default_gateway();
  g.context_length = 64;
  g.max_body_bytes = 4096;
  uint16_t port = c.start_gateway(g);

  const std::vector<bad_case> cases = bad_input_cases();
  REQUIRE(cases.size() >= 14);
  for (const auto& bc : cases) {
    INFO("case: " << bc.name);
    auto r = call(port, bc.method, bc.target, bc.body);
    check_error(r, bc.status, bc.type, bc.param, bc.code);
  }

  // Not HTTP at all: the server's own 400, still an OpenAI error body.
  std::string raw = raw_exchange(port, "this is not http at all\r\n\r\n");
  REQUIRE(raw.rfind("HTTP/1.1 400", 0) == 0);
  auto head_end = raw.find("\r\n\r\n");
  REQUIRE(head_end != std::string::npos);
  check_error(400, raw.substr(head_end + 4), 400, "invalid_request_error");

  // The gateway still serves.
  auto ok = post(port, "/v1/completions", completion_body("hello", 8));
  CHECK(ok.status == 200);
  json j = parse(ok.body);
  CHECK(j["usage"]["completion_tokens"] == 8);
  CHECK(c.in_flight(c.gateways[0]) == 0);
}

// -- auth --------------------------------------------------------------------------------------

TEST_CASE("gateway bearer auth guards the API but not health") {
  cluster c(1);
  auto g = cluster::default_gateway();
  g.auth_tokens = {"secret"};
  uint16_t port = c.start_gateway(g);
  auto body = completion_body("auth", 4);
  actors::http_call_options wrong, right;
  wrong.headers["Authorization"] = "Bearer nope";
  right.headers["Authorization"] = "Bearer secret";

  check_error(post(port, "/v1/completions", body), 401, "authentication_error", "", "invalid_api_key");
  check_error(post(port, "/v1/completions", body, wrong), 401, "authentication_error", "", "invalid_api_key");
  check_error(post(port, "/v1/chat/completions",
                   {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}),
              401, "authentication_error", "", "invalid_api_key");
  auto ok = post(port, "/v1/completions", body, right);
  CHECK(ok.status == 200);
  CHECK(parse(ok.body)["usage"]["completion_tokens"] == 4);

  check_error(call(port, "GET", "/v1/models"), 401, "authentication_error", "", "invalid_api_key");
  check_error(call(port, "GET", "/v1/models", "", wrong), 401, "authentication_error", "", "invalid_api_key");
  auto models = call(port, "GET", "/v1/models", "", right);
  CHECK(models.status == 200);
  CHECK(parse(models.body)["data"][0]["id"] == "tiny");

  auto health = call(port, "GET", "/health");
  CHECK(health.status == 200);
  CHECK(parse(health.body)["status"] == "ok");
}

// -- good requests -----------------------------------------------------------------------------

TEST_CASE("gateway completions match a plain engine, streamed or not") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const std::string prompt = "The quick brown fox";
  const int32_t n = 24;
  const auto prompt_ids = runtime::encode_prompt(tok(), prompt);
  const std::string want = as_json_text(tok().decode(reference_tokens(prompt_ids, n)));

  auto r = post(port, "/v1/completions", completion_body(prompt, n));
  REQUIRE(r.status == 200);
  json j = parse(r.body);
  CHECK(j["object"] == "text_completion");
  CHECK(j["model"] == "tiny");
  REQUIRE(j["choices"].size() == 1);
  CHECK(j["choices"][0]["text"] == want);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["prompt_tokens"] == prompt_ids.size());
  CHECK(j["usage"]["completion_tokens"] == n);
  CHECK(j["usage"]["total_tokens"] == prompt_ids.size() + n);

  // The same request streamed: text chunks, the last with finish_reason, then [DONE].
  json sb = completion_body(prompt, n);
  sb["stream"] = true;
  auto s = post(port, "/v1/completions", sb);
  REQUIRE(s.status == 200);
  CHECK(s.headers["content-type"] == "text/event-stream");
  auto chunks = sse_chunks(s.body);
  REQUIRE(chunks.size() >= 2);
  std::string text;
  for (size_t i = 0; i < chunks.size(); ++i) {
    CHECK(chunks[i]["object"] == "text_completion");
    CHECK(chunks[i]["id"] == chunks[0]["id"]);
    text += chunks[i]["choices"][0]["text"].get<std::string>();
    if (i + 1 < chunks.size()) CHECK(chunks[i]["choices"][0]["finish_reason"].is_null());
  }
  CHECK(chunks.back()["choices"][0]["finish_reason"] == "length");
  CHECK(text == want);
  CHECK(text == j["choices"][0]["text"]);

  // Token ids as the prompt: the same tokens (the text prompt's ids, BOS included).
  json ib = completion_body(prompt, n);
  ib["prompt"] = prompt_ids;
  auto ids = post(port, "/v1/completions", ib);
  REQUIRE(ids.status == 200);
  CHECK(parse(ids.body)["choices"][0]["text"] == want);
}

TEST_CASE("gateway chat completions stream role, content, finish and usage chunks") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const int32_t n = 20;
  std::vector<runtime::chat_message> msgs = {{"system", "Be brief."}, {"user", "Name a colour."}};
  const auto prompt_ids = chat_prompt(msgs);
  const std::string want = as_json_text(tok().decode(reference_tokens(prompt_ids, n)));
  json body = {{"model", "tiny"},
               {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                         {{"role", "user"}, {"content", "Name a colour."}}})},
               {"max_tokens", n},
               {"temperature", 0},
               {"ignore_eos", true}};

  auto r = post(port, "/v1/chat/completions", body);
  REQUIRE(r.status == 200);
  json j = parse(r.body);
  CHECK(j["object"] == "chat.completion");
  REQUIRE(j["choices"].size() == 1);
  CHECK(j["choices"][0]["message"]["role"] == "assistant");
  CHECK(j["choices"][0]["message"]["content"] == want);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["prompt_tokens"] == prompt_ids.size());
  CHECK(j["usage"]["completion_tokens"] == n);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto s = post(port, "/v1/chat/completions", body);
  REQUIRE(s.status == 200);
  auto chunks = sse_chunks(s.body);
  REQUIRE(chunks.size() >= 4);
  for (const auto& ch : chunks) {
    CHECK(ch["object"] == "chat.completion.chunk");
    CHECK(ch["id"] == chunks[0]["id"]);
  }
  // Role chunk first.
  CHECK(chunks[0]["choices"][0]["delta"]["role"] == "assistant");
  CHECK(chunks[0]["choices"][0]["finish_reason"].is_null());
  // Usage chunk last: no choices.
  const json& usage = chunks.back();
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["prompt_tokens"] == prompt_ids.size());
  CHECK(usage["usage"]["completion_tokens"] == n);
  // Finish chunk before it: empty delta.
  const json& fin = chunks[chunks.size() - 2];
  CHECK(fin["choices"][0]["finish_reason"] == "length");
  CHECK(!fin["choices"][0]["delta"].contains("content"));
  std::string text;
  for (size_t i = 1; i + 2 < chunks.size(); ++i) {
    CHECK(chunks[i]["choices"][0]["finish_reason"].is_null());
    text += chunks[i]["choices"][0]["delta"]["content"].get<std::string>();
  }
  CHECK(text == want);
}

TEST_CASE("gateway stop string truncates the text with finish reason stop") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const std::string prompt = "Once upon a time";
  const int32_t n = 48;
  const std::string raw = tok().decode(reference_tokens(runtime::encode_prompt(tok(), prompt), n));
  // A stop string that occurs in the greedy output: two printable ASCII bytes past the start.
  std::string stop;
  for (size_t i = 1; i + 1 < raw.size() && stop.empty(); ++i)
    if (raw[i] >= 0x20 && raw[i] < 0x7f && raw[i + 1] >= 0x20 && raw[i + 1] < 0x7f) stop = raw.substr(i, 2);
  REQUIRE_MESSAGE(!stop.empty(), "no two printable ASCII bytes in the greedy output");
  const std::string want = as_json_text(raw.substr(0, raw.find(stop)));
  INFO("stop = '" << stop << "'");

  json body = completion_body(prompt, n);
  body["stop"] = stop;
  auto r = post(port, "/v1/completions", body);
  REQUIRE(r.status == 200);
  json j = parse(r.body);
  CHECK(j["choices"][0]["text"] == want);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(j["usage"]["completion_tokens"] < n);

  body["stream"] = true;
  auto s = post(port, "/v1/completions", body);
  REQUIRE(s.status == 200);
  auto chunks = sse_chunks(s.body);
  REQUIRE(!chunks.empty());
  std::string text;
  for (const auto& ch : chunks) text += ch["choices"][0]["text"].get<std::string>();
  CHECK(text == want);
  CHECK(chunks.back()["choices"][0]["finish_reason"] == "stop");

  // The request stopped early: its generation is cancelled and its blocks come back.
  auto deadline = std::chrono::steady_clock::now() + wait_timeout;
  actors::engine_stats_snapshot st = c.stats(0);
  while ((st.requests_running != 0 || st.blocks_free != st.blocks_total) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    st = c.stats(0);
  }
  CHECK(st.requests_running == 0);
  CHECK(st.blocks_free == st.blocks_total);
}

TEST_CASE("gateway logit_bias and penalties reach the engine; a bias outside the vocabulary is a 400") {
  cluster c(1);
  actors::gateway_config g = cluster::default_gateway();
  g.vocab_size = tiny_checkpoint().model.weights->config.vocab_size;
  uint16_t port = c.start_gateway(g);
  const std::string prompt = "Once upon a time";
  const int32_t n = 8;
  const auto z = tok().encode("z");
  REQUIRE(z.size() == 1);
  json body = completion_body(prompt, n);
  body["logit_bias"] = {{std::to_string(z[0]), 100}};  // greedy: +100 makes every token 'z'
  auto r = post(port, "/v1/completions", body);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(parse(r.body)["choices"][0]["text"] == "zzzzzzzz");

  // Penalties: the plain engine with the same penalties gives the same text.
  json pen = completion_body(prompt, 24);
  pen["frequency_penalty"] = 1.5;
  pen["presence_penalty"] = 0.5;
  actors::sampling_options o;
  o.frequency_penalty = 1.5f, o.presence_penalty = 0.5f;
  const auto ids = runtime::encode_prompt(tok(), prompt);
  const std::string want = as_json_text(tok().decode(reference_tokens(ids, 24, {}, o)));
  CHECK(want != as_json_text(tok().decode(reference_tokens(ids, 24))));  // they change the output here
  auto rp = post(port, "/v1/completions", pen);
  REQUIRE_MESSAGE(rp.status == 200, rp.body);
  CHECK(parse(rp.body)["choices"][0]["text"] == want);

  body["logit_bias"] = {{std::to_string(g.vocab_size), 1}};
  auto bad = post(port, "/v1/completions", body);
  CHECK(bad.status == 400);
  CHECK(parse(bad.body)["error"]["param"] == "logit_bias");
}

TEST_CASE("gateway lists its model and exports request metrics") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  auto models = call(port, "GET", "/v1/models");
  REQUIRE(models.status == 200);
  json m = parse(models.body);
  CHECK(m["object"] == "list");
  REQUIRE(m["data"].size() == 1);
  CHECK(m["data"][0]["id"] == "tiny");
  CHECK(m["data"][0]["object"] == "model");

  for (int i = 0; i < 2; ++i) CHECK(post(port, "/v1/completions", completion_body("metrics", 4)).status == 200);
  check_error(post(port, "/v1/completions", {{"model", "tiny"}}), 400, "invalid_request_error", "prompt");
  // Without a context limit (context_length 0: none) requests are not refused as too long.
  auto unlimited = cluster::default_gateway();
  unlimited.context_length = 0;
  uint16_t port0 = c.start_gateway(unlimited);
  auto r0 = post(port0, "/v1/completions", completion_body("no limit", 4));
  CHECK(r0.status == 200);
  CHECK(parse(r0.body)["usage"]["completion_tokens"] == 4);

  auto metrics = call(port, "GET", "/metrics");
  REQUIRE(metrics.status == 200);
  const std::string& text = metrics.body;
  CHECK(text.find("shoal_requests_total{status=\"200\"} 3") != std::string::npos);  // /v1/models too
  CHECK(text.find("shoal_requests_total{status=\"400\"} 1") != std::string::npos);
  CHECK(text.find("shoal_time_to_first_token_seconds_bucket") != std::string::npos);
  CHECK(text.find("shoal_time_to_first_token_seconds_count{model=\"tiny\"} 2") != std::string::npos);
  CHECK(text.find("shoal_generation_tokens_total{model=\"tiny\"} 8") != std::string::npos);
  INFO(text);
}

// -- failures ----------------------------------------------------------------------------------

TEST_CASE("gateway cancels the generation when a streaming client disconnects") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const int32_t n = 2000;
  json body = completion_body("Tell me a very long story", n);
  body["stream"] = true;
  actors::http_call_options opts;
  opts.close_after_body_bytes = 1;  // leave after the first chunk
  auto r = post(port, "/v1/completions", body, opts);
  CHECK(r.status == 200);
  CHECK(!r.body.empty());

  auto deadline = std::chrono::steady_clock::now() + wait_timeout;
  actors::engine_stats_snapshot st = c.stats(0);
  while ((st.requests_running != 0 || st.blocks_free != st.blocks_total) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
    st = c.stats(0);
  }
  CHECK(st.requests_running == 0);
  CHECK(st.blocks_free == st.blocks_total);
  CHECK(st.generated >= 1);
  CHECK(st.generated < n / 4);  // cancelled long before 2,000 tokens
  MESSAGE("tokens generated before the cancel: " << st.generated);

  // The gateway forgot the request and still serves.
  auto gw_deadline = std::chrono::steady_clock::now() + wait_timeout;
  while (c.in_flight(c.gateways[0]) != 0 && std::chrono::steady_clock::now() < gw_deadline)
    std::this_thread::sleep_for(5ms);
  CHECK(c.in_flight(c.gateways[0]) == 0);
  CHECK(post(port, "/v1/completions", completion_body("again", 4)).status == 200);
}

TEST_CASE("gateway re-routes a stream whose engine is killed and the client sees no seam") {
  cluster c(2);
  c.route_to({0});  // the stream starts on engine 0
  uint16_t port = c.start_gateway();
  const std::string prompt = "Re-route me";
  const int32_t n = 300;
  const std::string want = as_json_text(tok().decode(reference_tokens(runtime::encode_prompt(tok(), prompt), n)));

  json body = completion_body(prompt, n);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  actors::http_call_options opts;
  std::atomic<bool> killed{false};
  opts.on_body = [&](std::string_view) {
    if (killed.exchange(true)) return;
    c.route_to({0, 1});
    caf::anon_send_exit(c.engines[0], caf::exit_reason::kill);
  };
  auto r = post(port, "/v1/completions", body, opts);
  REQUIRE(killed);
  REQUIRE(r.status == 200);
  auto chunks = sse_chunks(r.body);
  REQUIRE(chunks.size() >= 3);
  std::string text;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    REQUIRE_MESSAGE(!chunks[i].contains("error"), chunks[i].dump());
    text += chunks[i]["choices"][0]["text"].get<std::string>();
  }
  CHECK(chunks[chunks.size() - 2]["choices"][0]["finish_reason"] == "length");
  CHECK(chunks.back()["usage"]["completion_tokens"] == n);
  CHECK(text == want);
  // Engine 1 recomputed the request from its prompt: all n tokens.
  CHECK(c.stats(1).generated == static_cast<uint64_t>(n));
}

TEST_CASE("gateway drain refuses new requests with 503") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  CHECK(post(port, "/v1/completions", completion_body("before", 4)).status == 200);
  CHECK(call(port, "GET", "/health").status == 200);

  CHECK(c.drain(c.gateways[0]) == std::optional<bool>(true));
  CHECK(c.drain(c.gateways[0]) == std::optional<bool>(false));
  check_error(post(port, "/v1/completions", completion_body("after", 4)), 503, "overloaded_error", "",
              "service_unavailable");
  check_error(post(port, "/v1/chat/completions",
                   {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}),
              503, "overloaded_error", "", "service_unavailable");
  auto health = call(port, "GET", "/health");
  CHECK(health.status == 503);
  CHECK(parse(health.body)["status"] == "draining");
}

// -- images ------------------------------------------------------------------------------------

namespace {

std::string png_url(const test::bytes& png) { return "data:image/png;base64," + test::base64(png); }

test::bytes noise_rgb(int w, int h, uint32_t seed) {
  test::bytes px(static_cast<size_t>(w * h * 3));
  uint32_t x = seed;
  for (auto& b : px) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  return px;
}

json image_chat(const std::string& url, int32_t max_tokens) {
  return {{"model", "tiny"},
          {"messages", json::array({{{"role", "user"},
                                     {"content", json::array({{{"type", "text"}, {"text", "What is in "}},
                                                              {{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                                              {{"type", "text"}, {"text", "?"}}})}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

}  // namespace

TEST_CASE("gateway image chat equals a plain engine with the image; a repeated image is a prefix hit, another is not") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const int32_t n = 12;
  const std::string url = png_url(test::write_png(noise_rgb(40, 30, 1).data(), 40, 30, PNG_FORMAT_RGB));
  const json body = image_chat(url, n);

  // The reference: the same body parsed as the gateway parses it, rendered, expanded, and run
  // on a plain engine with the image.
  auto limits = runtime::api_limits{};
  limits.model_ids = {"tiny"};
  limits.image_token = "<image>";
  limits.image_side = 56, limits.image_patch = 14;
  auto parsed = runtime::parse_completion_request(body.dump(), true, limits);
  REQUIRE(parsed);
  REQUIRE(parsed->images.size() == 1);
  CHECK(parsed->images[0].count == 6);  // 40x30 fits 42x28: 3 x 2 patches
  auto ids = runtime::expand_image_tokens(chat_prompt(parsed->messages), tok().token_id("<image>"), parsed->images);
  REQUIRE(ids);
  const std::string want = as_json_text(tok().decode(reference_tokens(*ids, n, parsed->images)));
  CHECK(want != as_json_text(tok().decode(reference_tokens(*ids, n))));  // the image matters

  auto r = post(port, "/v1/chat/completions", body);
  REQUIRE(r.status == 200);
  json j = parse(r.body);
  CHECK(j["choices"][0]["message"]["content"] == want);
  CHECK(j["usage"]["prompt_tokens"] == ids->size());

  auto again = post(port, "/v1/chat/completions", body);
  REQUIRE(again.status == 200);
  json ja = parse(again.body);
  CHECK(ja["choices"][0]["message"]["content"] == want);
  CHECK(ja["usage"]["prompt_tokens_details"]["cached_tokens"] == (ids->size() - 1) / 16 * 16);

  auto other = post(port, "/v1/chat/completions",
                    image_chat(png_url(test::write_png(noise_rgb(40, 30, 2).data(), 40, 30, PNG_FORMAT_RGB)), n));
  REQUIRE(other.status == 200);
  CHECK(parse(other.body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);  // the image is in block 0
  auto st = c.stats(0);
  CHECK(st.images_encoded == 2);
}

TEST_CASE("gateway refuses bad images with the exact 400 naming the problem, and keeps serving") {
  cluster c(1);
  auto g = cluster::default_gateway();
  g.max_images = 2;
  g.image_limits.max_pixels = 100 * 100;
  g.image_limits.max_bytes = 6000;
  uint16_t port = c.start_gateway(g);
  const auto small = test::write_png(noise_rgb(20, 20, 3).data(), 20, 20, PNG_FORMAT_RGB);
  const auto big = test::write_png(test::bytes(120 * 100 * 3, 128).data(), 120, 100, PNG_FORMAT_RGB);
  const auto heavy = test::write_png(noise_rgb(60, 60, 4).data(), 60, 60, PNG_FORMAT_RGB);
  REQUIRE(heavy.size() > 6000);
  REQUIRE(big.size() < 6000);
  const test::bytes gif = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0};
  const test::bytes text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!'};
  const std::string url_param = "messages[0].content[1].image_url.url";
  struct image_case {
    const char* name;
    json body;
    std::string param, message;
  };
  auto with_url = [&](const std::string& url) { return image_chat(url, 4); };
  json three = image_chat(png_url(small), 4);
  for (int i = 0; i < 2; ++i)
    three["messages"][0]["content"].push_back({{"type", "image_url"}, {"image_url", {{"url", png_url(small)}}}});
  json placeholder = image_chat(png_url(small), 4);
  placeholder["messages"][0]["content"][0]["text"] = "look: <image>";
  json no_url = image_chat(png_url(small), 4);
  no_url["messages"][0]["content"][1]["image_url"] = json::object();
  json bad_detail = image_chat(png_url(small), 4);
  bad_detail["messages"][0]["content"][1]["image_url"]["detail"] = "ultra";
  json bad_type = image_chat(png_url(small), 4);
  bad_type["messages"][0]["content"][1] = {{"type", "input_audio"}, {"input_audio", {{"data", "AAAA"}}}};
  const std::vector<image_case> cases = {
    {"remote https URL", with_url("https://example.com/cat.png"), url_param, "data URL"},
    {"remote http URL", with_url("http://10.0.0.1/cat.jpg"), url_param, "data URL"},
    {"not a URL", with_url("cat.png"), url_param, "not a data URL"},
    {"data URL without base64", with_url("data:image/png,abcd"), url_param, "base64"},
    {"bad base64 character", with_url("data:image/png;base64,iVBO*w0KGgo="), url_param, "'*'"},
    {"bad base64 length", with_url("data:image/png;base64,iVBORw0KGgoAA"), url_param, "base64"},
    {"not an image", with_url(png_url(text)), url_param, "image 1: "},
    {"truncated PNG", with_url(png_url(test::bytes(small.begin(), small.begin() + small.size() / 2))), url_param,
     "truncated"},
    {"GIF bytes", with_url(png_url(gif)), url_param, "GIF"},
    {"WebP media type", with_url("data:image/webp;base64,UklGRg=="), url_param, "webp"},
    {"over the pixel limit", with_url(png_url(big)), url_param, "12000 pixels"},
    {"over the byte limit", with_url(png_url(heavy)), url_param, "6000"},
    {"three images, limit two", three, "messages[0].content[4]", "too many images: at most 2"},
    {"placeholder text in a text part", placeholder, "messages[0].content[0].text", "image placeholder"},
    {"image_url without url", no_url, url_param, "image_url"},
    {"unknown detail", bad_detail, "messages[0].content[1].image_url.detail", "'auto', 'low' or 'high'"},
    {"unknown part type", bad_type, "messages[0].content[1]", "only parts"},
  };
  REQUIRE(cases.size() >= 10);
  for (const auto& ic : cases) {
    INFO("case: " << std::string(ic.name));
    auto r = post(port, "/v1/chat/completions", ic.body);
    check_error(r, 400, "invalid_request_error", ic.param);
    json j = json::parse(r.body, nullptr, false);
    const std::string msg = j.is_object() ? j["error"].value("message", "") : "";
    CHECK_MESSAGE(msg.find(ic.message) != std::string::npos, msg);
  }
  CHECK(c.in_flight(c.gateways[0]) == 0);
  auto ok = post(port, "/v1/chat/completions", image_chat(png_url(small), 4));
  CHECK(ok.status == 200);
  CHECK(c.stats(0).images_encoded == 1);  // nothing of the refused requests reached the engine
}
