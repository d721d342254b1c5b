// The gateway's shared state (config, tokenizer, chat template, metrics, requests in flight),
// the HTTP handler that runs on each connection's thread, and the gateway actor answering the
// node agent. The OpenAI wire format (parsing, validation, response JSON) and the metrics
// text live in runtime/ (openai_api, chat_template, metrics); this file only plumbs them.
#include "actors/gateway_actor.hpp"

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/core.h>

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/http_server.hpp"
#include "actors/request_relay.hpp"
#include "runtime/serve/chat_template.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "runtime/serve/metric_families.hpp"
#include "runtime/serve/openai_api.hpp"

namespace shoal::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct request_entry {
  bool chat = false;
  int64_t prompt_tokens = 0;
  int64_t generated = 0;
  clock_type::time_point started;
};

// Everything the connection threads and the gateway actor share.
struct gateway_shared {
  caf::actor_system* sys = nullptr;
  balancers bal;
  std::shared_ptr<const model::tokenizer> tok;
  gateway_config config;
  std::optional<runtime::chat_template> chat;
  std::string bos_token, eos_token;
  runtime::metrics_registry metrics;
  runtime::gateway_metrics metrics_set = runtime::add_gateway_metrics(metrics);
  int64_t started_unix = 0;
  int64_t first_id = 0;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> next_id{0};
  std::mutex mu;
  std::map<int64_t, request_entry> table;
  std::unique_ptr<http_server> server;
  std::shared_ptr<admission_bound> admission;  // HTTP connections and submits together

  runtime::api_limits limits() const {
    runtime::api_limits l;
    l.model_ids = {config.model_id};
    l.max_tokens_limit = config.max_tokens_limit;
    l.context_length = config.context_length;
    l.vocab_size = config.vocab_size;
    l.max_body_bytes = config.max_body_bytes;
    if (config.vision.present && tok) {
      l.image_token = tok->decode_token(static_cast<int32_t>(config.vision.image_token_id));
      l.image_side = config.vision.image_size;
      l.image_patch = config.vision.patch_size;
    }
    l.max_images = config.max_images;
    l.image = config.image_limits;
    return l;
  }
};

std::string error_json(int status, const std::string& message) {
  if (status == 413) {
    runtime::api_error e{413, "request_too_large", message, "", ""};
    return runtime::to_json(e);
  }
  if (status == 429) {  // OpenAI's type and code for a rate limit
    runtime::api_error e{429, "rate_limit_error", message, "", "rate_limit_exceeded"};
    return runtime::to_json(e);
  }
  if (status >= 500) return runtime::to_json(status == 503 ? runtime::overloaded_error(message)
                                                            : runtime::server_error(message));
  return runtime::to_json(runtime::invalid_request_error(message));
}

bool send_error(http_writer& w, const runtime::api_error& e) {
  return w.respond(e.status, "application/json", runtime::to_json(e));
}

// The HTTP status and OpenAI error of a request that failed for good after routing.
runtime::api_error routing_error(const error_reply& r) {
  switch (r.code) {
    case errc::invalid_request: return runtime::invalid_request_error(r.message);
    case errc::timed_out: {
      runtime::api_error e = runtime::server_error(r.message);
      e.status = 504;
      e.code = "timeout";
      return e;
    }
    case errc::no_engine:
    case errc::unreachable:
    case errc::draining: return runtime::overloaded_error(r.message);
    default: return runtime::server_error(r.message);
  }
}

std::optional<runtime::api_error> check_auth(const gateway_shared& g, const http_request& req) {
  if (g.config.auth_tokens.empty()) return std::nullopt;
  auto it = req.headers.find("authorization");
  const std::string prefix = "Bearer ";
  if (it == req.headers.end() || it->second.rfind(prefix, 0) != 0)
    return runtime::authentication_error("missing bearer token (header 'Authorization: Bearer <token>')");
  std::string token = it->second.substr(prefix.size());
  for (const auto& t : g.config.auth_tokens)
    if (t == token) return std::nullopt;
  return runtime::authentication_error("invalid bearer token");
}

// End of the longest prefix of `text` that ends on a UTF-8 character boundary.
size_t utf8_complete_end(const std::string& text) {
  size_t n = text.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

// Token ids → text deltas: holds back an incomplete UTF-8 character and anything that could
// still become a stop string; a stop string ends the text before it.
class text_stream {
 public:
  text_stream(const model::tokenizer& tok, std::vector<std::string> stops) : tok_(tok), stops_(std::move(stops)) {
    for (const auto& s : stops_) hold_ = std::max(hold_, s.size() - 1);
  }
  // Adds a token; returns the new text that is safe to show.
  std::string add(int32_t token) {
    ids_.push_back(token);
    text_ = tok_.decode(ids_);
    for (const auto& s : stops_)
      if (auto at = text_.find(s); at != std::string::npos && (!stop_at_ || at < *stop_at_)) stop_at_ = at;
    size_t end = stop_at_ ? *stop_at_ : utf8_complete_end(text_);
    if (!stop_at_) end = std::min(end, text_.size() > hold_ ? text_.size() - hold_ : 0);
    return take(end);
  }
  // The rest once generation ended.
  std::string flush() { return take(stop_at_ ? *stop_at_ : text_.size()); }
  bool stopped() const { return stop_at_.has_value(); }
  int64_t tokens() const { return static_cast<int64_t>(ids_.size()); }

 private:
  std::string take(size_t end) {
    if (end <= shown_) return {};
    std::string out = text_.substr(shown_, end - shown_);
    shown_ = end;
    return out;
  }
  const model::tokenizer& tok_;
  std::vector<std::string> stops_;
  size_t hold_ = 0;
  std::vector<int32_t> ids_;
  std::string text_;
  size_t shown_ = 0;
  std::optional<size_t> stop_at_;
};

// The prompt's token ids (chat: the rendered template, each image's placeholder expanded to
// its patches and r.images placed), or a 400.
std::expected<std::vector<int32_t>, runtime::api_error> prompt_ids(const gateway_shared& g,
                                                                   runtime::completion_request& r) {
  if (r.chat) {
    if (!g.chat) return std::unexpected(runtime::invalid_request_error("this model has no chat template", "messages"));
    auto text = r.tools.functions.empty() ? g.chat->render(r.messages, true, g.bos_token, g.eos_token)
                                          : g.chat->render(runtime::with_tools_prompt(r.messages, r.tools.functions),
                                                           true, g.bos_token, g.eos_token);
    if (!text) return std::unexpected(runtime::invalid_request_error(text.error(), "messages"));
    auto ids = g.tok->encode(*text);
    if (r.images.empty()) return ids;
    return runtime::expand_image_tokens(ids, static_cast<int32_t>(g.config.vision.image_token_id), r.images);
  }
  if (const auto* text = std::get_if<std::string>(&r.prompt)) return runtime::encode_prompt(*g.tok, *text);
  const auto& ids = std::get<std::vector<int32_t>>(r.prompt);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= g.tok->vocab_size())
      return std::unexpected(runtime::invalid_request_error(
        "prompt[" + std::to_string(i) + "] = " + std::to_string(ids[i]) + " is not a token id (vocabulary size " +
          std::to_string(g.tok->vocab_size()) + ")",
        "prompt"));
  return ids;
}

generation_request make_generation(int64_t id, std::vector<int32_t> prompt, const runtime::completion_request& r) {
  generation_request req;
  req.id = request_id(id);
  req.prompt = std::move(prompt);
  req.sampling.temperature = r.temperature;
  req.sampling.top_k = r.top_k;
  req.sampling.top_p = r.top_p;
  req.sampling.max_tokens = r.max_tokens;
  req.sampling.ignore_eos = r.ignore_eos;
  req.sampling.seed = r.seed.value_or(static_cast<uint64_t>(id));  // re-routing recomputes the same tokens
  req.sampling.stop_strings = r.stop;  // the engine stops at the first match
  req.sampling.logit_bias.assign(r.logit_bias.begin(), r.logit_bias.end());
  req.sampling.presence_penalty = r.presence_penalty;
  req.sampling.frequency_penalty = r.frequency_penalty;
  req.sampling.constraint = r.constraint;
  req.sampling.logprobs = r.logprobs;
  req.cls = r.cls;
  req.images = r.images;
  return req;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// One generation from an HTTP request to its last byte: the relay's tokens become text
// (streamed chunks or one response), log probabilities and, with active tools, a held calls
// block sent as one tool_calls delta at the end.
class generation_reply {
 public:
  generation_reply(gateway_shared& g, int64_t id, const runtime::completion_request& r, http_writer& w)
      : g_(g), r_(r), w_(w), meta_{runtime::make_response_id(r.chat, request_id(id)), unix_now(), r.model},
        text_(*g.tok, r.stop), want_logprobs_(r.logprobs >= 0),
        kind_(r.chat && r.tools.active() ? reply::undecided : reply::content),
        calls_begin_id_(g.tok->token_id(runtime::tool_calls_begin_token)) {}

  // Opens the stream (its role chunk first for chat); false when the client left.
  bool open() {
    if (!r_.stream) return true;
    client_ok_ = w_.start_stream("text/event-stream");
    if (client_ok_ && r_.chat) client_ok_ = w_.send(runtime::sse_event(runtime::chat_role_chunk_json(meta_)));
    return client_ok_;
  }

  // Takes the relay's items until the last (or the deadline, or the client leaving); the
  // last item, or nullopt when the client left.
  std::optional<stream_item> pump(int64_t id, stream_channel& channel, const caf::actor& relay,
                                  clock_type::time_point started) {
    const auto deadline = started + g_.config.request_timeout + std::chrono::seconds(5);
    while (client_ok_) {
      auto item = channel.pop(deadline);
      if (!item)
        return stream_item{-1, true, runtime::finish_reason::error,
                           error_reply{errc::timed_out, "no token within the request timeout"}, 0};
      if (item->finished) return item;
      if (!first_token_) {
        first_token_ = clock_type::now();
        g_.metrics_set.ttft.observe(seconds_since(started), r_.model);
      }
      add_logprobs(*item);
      if (kind_ == reply::undecided) kind_ = item->token == calls_begin_id_ ? reply::calls : reply::content;
      emit(text_.add(item->token));
      {
        std::lock_guard lock(g_.mu);
        g_.table[id].generated = text_.tokens();
      }
      if (text_.stopped()) {
        caf::anon_send(relay, cancel_atom_v);
        if (!client_ok_) break;
        return stream_item{-1, true, runtime::finish_reason::stop, std::nullopt, 0};
      }
    }
    return std::nullopt;
  }

  // The rest of the text, the usage counters and the response or the stream's last chunks.
  int finish(const stream_item& last, int64_t n_prompt) {
    if (last.error && text_.tokens() == 0 && !r_.stream) {
      runtime::api_error e = routing_error(*last.error);
      send_error(w_, e);
      return e.status;
    }
    emit(text_.flush(), true);
    const int64_t n_out = text_.tokens();
    count(last, n_prompt, n_out);
    runtime::finish_reason fin =
      last.reason == runtime::finish_reason::stop ? runtime::finish_reason::stop : runtime::finish_reason::length;
    std::optional<runtime::tool_output> calls = take_calls(last, fin);
    runtime::usage_info usage{n_prompt, n_out, last.cached_tokens};
    const runtime::logprob_list* lp = want_logprobs_ ? &logprobs_ : nullptr;
    if (!r_.stream) {
      w_.respond(200, "application/json",
                 r_.chat ? runtime::chat_completion_response_json(meta_, calls ? calls->content : whole_, fin, usage, lp,
                                                                  calls ? &calls->calls : nullptr)
                         : runtime::completion_response_json(meta_, whole_, fin, usage, lp));
      return 200;
    }
    if (calls) w_.send(runtime::sse_event(runtime::chat_tool_calls_chunk_json(meta_, calls->calls, lp)));
    if (last.error) {  // mid-stream failure: an error event, then the end of the stream
      w_.send(runtime::sse_event(runtime::to_json(routing_error(*last.error))));
    } else {
      w_.send(runtime::sse_event(r_.chat ? runtime::chat_finish_chunk_json(meta_, fin)
                                         : runtime::completion_chunk_json(meta_, "", fin)));
      if (r_.include_usage) w_.send(runtime::sse_event(runtime::usage_chunk_json(meta_, r_.chat, usage)));
    }
    w_.send(runtime::sse_done());
    return 200;
  }

 private:
  // With active tools the reply is content or tool calls (the grammar allows one or the
  // other), decided by the first token: the calls-begin token itself (not text that spells
  // it) opens a calls block, held whole.
  enum class reply { undecided, content, calls };

  void emit(const std::string& delta, bool force = false) {
    if (kind_ == reply::calls) {
      held_ += delta;
      return;
    }
    if (delta.empty() && !(force && !logprobs_.empty())) return;
    if (!r_.stream) {
      whole_ += delta;
      return;
    }
    const runtime::logprob_list* lp = want_logprobs_ ? &logprobs_ : nullptr;
    std::string chunk = r_.chat ? runtime::chat_content_chunk_json(meta_, delta, lp)
                                : runtime::completion_chunk_json(meta_, delta, runtime::finish_reason::none, lp);
    client_ok_ = client_ok_ && w_.send(runtime::sse_event(chunk));
    logprobs_.clear();
  }

  // Log probabilities (when asked): every token's, sent with the first chunk whose text
  // follows it (streamed), or all in the response.
  void add_logprobs(const stream_item& item) {
    if (!want_logprobs_ || !item.logprobs) return;
    runtime::token_logprob t{g_.tok->decode_token(item.token), item.logprobs->logprob, {}, text_offset_};
    text_offset_ += static_cast<int64_t>(t.token.size());
    for (const auto& [id, v] : item.logprobs->top) t.top.emplace_back(g_.tok->decode_token(id), v);
    logprobs_.push_back(std::move(t));
  }

  void count(const stream_item& last, int64_t n_prompt, int64_t n_out) {
    g_.metrics_set.prompt_tokens.inc(static_cast<double>(n_prompt), r_.model);
    g_.metrics_set.generated_tokens.inc(static_cast<double>(n_out), r_.model);
    g_.metrics_set.cached_tokens.inc(static_cast<double>(last.cached_tokens), r_.model);
    if (first_token_ && n_out > 1)
      g_.metrics_set.tpot.observe(seconds_since(*first_token_) / static_cast<double>(n_out - 1), r_.model);
  }

  // A calls block: its whole calls, finish "tool_calls" when the block closed ("length" when
  // max_tokens cut it; a cut before the first whole call leaves the raw text as content).
  std::optional<runtime::tool_output> take_calls(const stream_item& last, runtime::finish_reason& fin) {
    if (kind_ != reply::calls) return std::nullopt;
    auto calls = runtime::parse_tool_calls(held_, "call_" + meta_.id.substr(meta_.id.find('-') + 1) + "_");
    if (calls && calls->calls.empty()) calls.reset();
    if (calls && calls->complete && !last.error) fin = runtime::finish_reason::tool_calls;
    if (!calls && !r_.stream) whole_ += held_;
    if (!calls && r_.stream && !held_.empty()) {
      client_ok_ = w_.send(
        runtime::sse_event(runtime::chat_content_chunk_json(meta_, held_, want_logprobs_ ? &logprobs_ : nullptr)));
      logprobs_.clear();
    }
    return calls;
  }

  gateway_shared& g_;
  const runtime::completion_request& r_;
  http_writer& w_;
  const runtime::response_meta meta_;
  text_stream text_;
  std::string whole_;  // the response's text (not streamed)
  bool client_ok_ = true;
  const bool want_logprobs_;
  runtime::logprob_list logprobs_;
  int64_t text_offset_ = 0;
  reply kind_;
  const int32_t calls_begin_id_;
  std::string held_;  // a calls block, whole
  std::optional<clock_type::time_point> first_token_;
};

// One generation from an HTTP request to its last byte. Returns the HTTP status sent.
int serve_generation(gateway_shared& g, int64_t id, const runtime::completion_request& r, std::vector<int32_t> prompt,
                     http_writer& w) {
  const auto started = clock_type::now();
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  {
    std::lock_guard lock(g.mu);
    g.table[id] = {r.chat, n_prompt, 0, started};
  }
  auto channel = std::make_shared<stream_channel>();
  relay_options ro;
  ro.request_timeout = g.config.request_timeout;
  caf::actor relay = spawn_request_relay(*g.sys, g.bal, make_generation(id, std::move(prompt), r), channel, ro);
  generation_reply reply(g, id, r, w);
  std::optional<stream_item> last;
  if (reply.open()) last = reply.pump(id, *channel, relay, started);
  {
    std::lock_guard lock(g.mu);
    g.table.erase(id);
  }
  if (!last) {  // the client left: stop generating, free the blocks
    caf::anon_send(relay, cancel_atom_v);
    return 499;
  }
  return reply.finish(*last, n_prompt);
}

// tool_choice "none" with tools described in the prompt: the tool-call tokens get logit bias
// −100 (OpenAI's ban), unless the request biases them itself.
void ban_tool_tokens(const model::tokenizer& tok, runtime::completion_request& r) {
  for (auto t : {runtime::tool_calls_begin_token, runtime::tool_call_begin_token, runtime::tool_sep_token,
                 runtime::tool_call_end_token, runtime::tool_calls_end_token}) {
    const int32_t id = tok.token_id(t);
    auto at = std::lower_bound(r.logit_bias.begin(), r.logit_bias.end(), std::pair<int32_t, float>{id, -1e30f});
    if (id >= 0 && (at == r.logit_bias.end() || at->first != id)) r.logit_bias.insert(at, {id, -100.0f});
  }
}

int serve_generate(gateway_shared& g, const http_request& req, http_writer& w, bool chat) {
  if (auto e = check_auth(g, req)) return send_error(w, *e), e->status;
  if (g.draining) {
    auto e = runtime::overloaded_error("this gateway is draining: it takes no new requests");
    return send_error(w, e), e.status;
  }
  auto parsed = runtime::parse_completion_request(req.body, chat, g.limits());
  if (!parsed) return send_error(w, parsed.error()), parsed.error().status;
  if (!parsed->tools.functions.empty() && !parsed->tools.active()) ban_tool_tokens(*g.tok, *parsed);
  auto ids = prompt_ids(g, *parsed);
  if (!ids) return send_error(w, ids.error()), ids.error().status;
  if (g.config.context_length > 0)  // 0: no limit (gateway_config); check_context would refuse everything
    if (auto e = runtime::check_context(static_cast<int64_t>(ids->size()), parsed->max_tokens, g.config.context_length))
      return send_error(w, *e), e->status;
  const int64_t id = g.next_id++;
  const auto started = clock_type::now();
  const int64_t n_prompt = static_cast<int64_t>(ids->size());
  const int status = serve_generation(g, id, *parsed, std::move(*ids), w);
  if (g.config.request_log)
    g.config.request_log(fmt::format("request {} {} status={} prompt_tokens={} seconds={:.3f}", to_string(request_id(id)),
                                     chat ? "chat" : "completion", status, n_prompt, seconds_since(started)));
  return status;
}

int handle(gateway_shared& g, const http_request& req, http_writer& w) {
  std::string path = req.target.substr(0, req.target.find('?'));
  bool get = req.method == "GET", post = req.method == "POST";
  if (path == "/health" && get) {
    bool ok = !g.draining;
    w.respond(ok ? 200 : 503, "application/json", ok ? R"({"status":"ok"})" : R"({"status":"draining"})");
    return ok ? 200 : 503;
  }
  if (path == "/metrics" && get) {
    {
      std::lock_guard lock(g.mu);
      g.metrics_set.queue_depth.set(static_cast<double>(g.table.size()));
    }
    w.respond(200, "text/plain; version=0.0.4", g.metrics.render());
    return 200;
  }
  if (path == "/v1/models" && get) {
    if (auto e = check_auth(g, req)) return send_error(w, *e), e->status;
    w.respond(200, "application/json", runtime::models_json({g.config.model_id}, g.started_unix));
    return 200;
  }
  if ((path == "/v1/completions" || path == "/v1/chat/completions") && post)
    return serve_generate(g, req, w, path == "/v1/chat/completions");
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/models" || path == "/health" ||
      path == "/metrics") {
    runtime::api_error e = runtime::invalid_request_error("method " + req.method + " is not allowed on " + path);
    e.status = 405;
    return send_error(w, e), 405;
  }
  auto e = runtime::not_found_error("no route " + req.method + " " + path);
  return send_error(w, e), e.status;
}

// -- the gateway actor ------------------------------------------------------------------------

struct gateway_state {
  static inline const char* name = "gateway";
  std::shared_ptr<gateway_shared> shared;
};

// Streams an operator's request (the shell's submit) as text_events to `sink`.
void pump_text(std::shared_ptr<gateway_shared> g, std::shared_ptr<stream_channel> channel, request_id id,
               caf::actor sink) {
  text_stream text(*g->tok, {});
  auto deadline = clock_type::now() + g->config.request_timeout + std::chrono::seconds(5);
  for (;;) {
    auto item = channel->pop(deadline);
    if (!item) {
      caf::anon_send(sink, text_event{id, text.flush(), true, runtime::finish_reason::error,
                                      "no token within the request timeout"});
      return;
    }
    if (item->finished) {
      if (item->error) caf::anon_send(sink, text_event{id, text.flush(), true, runtime::finish_reason::error, item->error->message});
      else caf::anon_send(sink, text_event{id, text.flush(), true, item->reason, ""});
      return;
    }
    if (auto delta = text.add(item->token); !delta.empty()) caf::anon_send(sink, text_event{id, delta, false, runtime::finish_reason::none, ""});
  }
}

gateway_actor::behavior_type gateway_behavior(gateway_actor::stateful_pointer<gateway_state> self,
                                              std::shared_ptr<gateway_shared> shared) {
  self->state.shared = std::move(shared);
  return {
    [self](requests_atom) {
      auto& g = *self->state.shared;
      std::vector<std::string> out;
      std::lock_guard lock(g.mu);
      for (const auto& [id, e] : g.table)
        out.push_back(fmt::format("request {} {} prompt={} generated={} age={:.1f}s", to_string(request_id(id)),
                                  e.chat ? "chat" : "completion",
                                  e.prompt_tokens, e.generated, seconds_since(e.started)));
      return out;
    },
    [self](drain_atom) { return !self->state.shared->draining.exchange(true); },
    [self](describe_atom) {
      auto& g = *self->state.shared;
      std::lock_guard lock(g.mu);
      return fmt::format("gateway http={}:{} model={} in_flight={} requests_started={}{}", g.config.host,
                         g.server ? g.server->port() : 0, g.config.model_id, g.table.size(), g.next_id.load() - g.first_id,
                         g.draining ? " draining" : "");
    },
    [self](stats_atom) {
      auto& g = *self->state.shared;
      std::lock_guard lock(g.mu);
      return static_cast<int64_t>(g.table.size());
    },
    [self](submit_atom, std::string& prompt, int32_t max_tokens, caf::actor& sink) -> caf::result<request_id> {
      auto g = self->state.shared;
      if (g->draining) return make_error(errc::draining, "the gateway is draining");
      if (max_tokens < 1) return make_error(errc::invalid_request, "max_tokens must be >= 1");
      runtime::completion_request r;
      r.max_tokens = max_tokens;
      r.temperature = 0;
      if (!g->admission->try_acquire())
        return make_error(errc::too_many_requests, "too many requests in flight (limit " +
                                                       std::to_string(g->admission->limit()) + "): try again later");
      int64_t id = g->next_id++;
      auto channel = std::make_shared<stream_channel>();
      relay_options ro;
      ro.request_timeout = g->config.request_timeout;
      spawn_request_relay(*g->sys, g->bal, make_generation(id, runtime::encode_prompt(*g->tok, prompt), r), channel,
                          ro);
      std::thread([g, channel, id, sink = std::move(sink)]() mutable {
        pump_text(g, channel, request_id(id), std::move(sink));
        g->admission->release();
      }).detach();
      return request_id(id);
    },
  };
}

}  // namespace

std::expected<std::vector<std::string>, std::string> read_auth_tokens(const std::filesystem::path& file) {
  std::ifstream f(file);
  if (!f) return std::unexpected("cannot read auth token file " + file.string());
  std::vector<std::string> tokens;
  for (std::string line; std::getline(f, line);) {
    auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    tokens.push_back(line.substr(b, line.find_last_not_of(" \t\r") - b + 1));
  }
  if (tokens.empty()) return std::unexpected("auth token file " + file.string() + " has no token");
  return tokens;
}

std::expected<gateway_start, std::string> spawn_gateway(caf::actor_system& sys, balancers bal,
                                                       std::shared_ptr<const model::tokenizer> tok,
                                                       gateway_config config) {
  auto g = std::make_shared<gateway_shared>();
  g->sys = &sys;
  g->bal = std::move(bal);
  g->tok = std::move(tok);
  g->config = std::move(config);
  g->started_unix = unix_now();
  g->first_id = static_cast<int64_t>(std::random_device{}() & 0x3fffffff) << 32;  // unique per gateway process
  g->next_id = g->first_id;
  if (auto t = runtime::load_chat_template(g->config.tokenizer_config)) {
    g->chat = t->tmpl;
    g->bos_token = t->bos_token;
    g->eos_token = t->eos_token;
  }
  if (g->config.max_in_flight < 1) return std::unexpected("gateway max_in_flight must be >= 1");
  g->admission = std::make_shared<admission_bound>(g->config.max_in_flight);
  http_server_options opts;
  opts.max_body_bytes = g->config.max_body_bytes;
  opts.admission = g->admission;
  opts.error_body = error_json;
  std::weak_ptr<gateway_shared> weak = g;
  auto server = http_server::start(
    g->config.host, g->config.port,
    [weak](const http_request& req, http_writer& w) {
      if (auto gs = weak.lock()) {
        int status = handle(*gs, req, w);
        gs->metrics_set.requests.inc(1, std::to_string(status));
      }
    },
    opts);
  if (!server) return std::unexpected(server.error());
  g->server = std::move(*server);
  uint16_t port = g->server->port();
  auto actor = sys.spawn(gateway_behavior, g);
  return gateway_start{actor, port};
}

}  // namespace shoal::actors
