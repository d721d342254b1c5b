// The gateway: the OpenAI-compatible HTTP API (GET /v1/models, POST /v1/completions and
// /v1/chat/completions with SSE streaming, GET /health, GET /metrics) over http_server. Each
// generation request is tokenized on its connection thread and handed to a request relay
// (actors/request_relay.hpp) that routes, streams and re-routes it; the gateway actor keeps
// the table of requests in flight and answers the node agent.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/interfaces.hpp"
#include "model/config.hpp"
#include "model/tokenizer.hpp"
#include "runtime/vision/image.hpp"

namespace shoal::actors {

struct gateway_config {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                        // 0: any free port
  std::vector<std::string> auth_tokens;     // accepted bearer tokens; empty = no auth
  std::string model_id;                     // the one model served (/v1/models)
  int64_t context_length = 0;               // prompt + max_tokens limit; 0 = none
  int64_t vocab_size = 0;                   // token ids a request may name (logit_bias); 0 = unchecked
  int32_t max_tokens_limit = 4096;          // largest max_tokens accepted
  size_t max_body_bytes = 1 << 20;          // larger bodies: 413
  std::chrono::milliseconds request_timeout{60'000};
  // Requests served at once: HTTP connections (a thread each) and shell submits (a stream pump
  // each) share this one bound; one more is refused at once (HTTP 429 naming the limit).
  int32_t max_in_flight = 256;
  std::filesystem::path tokenizer_config;   // tokenizer_config.json (chat template, bos/eos)
  // Images in chat requests (the model's vision encoder; not present: image parts are refused).
  model::vision_config vision;
  int32_t max_images = 8;                   // per request
  runtime::image_limits image_limits;
  // Called once per finished HTTP generation with a line naming its request id (the node log).
  std::function<void(const std::string&)> request_log;
};

// Reads an auth token file: one token per line, blank lines and '#' comments skipped.
std::expected<std::vector<std::string>, std::string> read_auth_tokens(const std::filesystem::path& file);

struct gateway_start {
  gateway_actor actor;
  uint16_t port = 0;  // the HTTP port bound
};

// Starts the HTTP server and the gateway actor; an error names what failed (bind, template).
std::expected<gateway_start, std::string> spawn_gateway(caf::actor_system& sys, balancers bal,
                                                       std::shared_ptr<const model::tokenizer> tok,
                                                       gateway_config config);

}  // namespace shoal::actors
