// The OpenAI-compatible HTTP API as plain data: request bodies of POST /v1/completions and
// POST /v1/chat/completions parsed and validated into one completion_request, errors as
// OpenAI-style api_error values, and response bodies (whole, streamed SSE chunks, model list)
// built as JSON text. The HTTP server and actors call this; JSON stays inside openai_request.cpp
// (parsing) and openai_response.cpp (writing).
#pragma once

#include "runtime/serve/chat_template.hpp"
#include "runtime/structured/constraint.hpp"
#include "runtime/vision/image.hpp"
#include "runtime/vision/prompt_image.hpp"
#include "runtime/structured/tool_calls.hpp"
#include "runtime/base/traffic_class.hpp"
#include "runtime/base/ids.hpp"
#include "runtime/base/finish_reason.hpp"

#include <cstddef>
#include <memory>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace shoal::runtime {

// One error response: HTTP status plus the body fields of {"error": {...}}; empty param or
// code are written as null.
struct api_error {
  int status = 400;
  std::string type;     // invalid_request_error, authentication_error, not_found_error, ...
  std::string message;  // names the field at fault
  std::string param;    // the request field, e.g. "max_tokens", "messages[2].role"
  std::string code;     // e.g. "model_not_found", "context_length_exceeded"
  bool operator==(const api_error&) const = default;
};

// {"error":{"message":...,"type":...,"param":...|null,"code":...|null}}
std::string to_json(const api_error& e);

api_error invalid_request_error(std::string message, std::string param = "", std::string code = "");  // 400
api_error authentication_error(std::string message);  // 401, code invalid_api_key
api_error model_not_found_error(const std::string& model);  // 404 not_found_error, code model_not_found
api_error not_found_error(std::string message);  // 404 (unknown route)
api_error server_error(std::string message);  // 500 server_error
api_error overloaded_error(std::string message);  // 503 overloaded_error, code service_unavailable

// What the node serves; requests are validated against it.
struct api_limits {
  std::vector<std::string> model_ids;  // accepted values of "model"
  int32_t max_tokens_limit = 4096;     // largest max_tokens accepted
  int64_t context_length = 4096;       // prompt + completion tokens
  int64_t vocab_size = 0;              // token ids logit_bias may name; 0 = not checked here
  size_t max_body_bytes = size_t{1} << 20;
  // Chat image_url parts: refused when image_token is empty (the model has no vision encoder).
  std::string image_token;      // the placeholder text one image renders as in the template
  int64_t image_side = 0;       // the encoder's largest side and patch (images are fit to them)
  int64_t image_patch = 0;
  int32_t max_images = 8;       // per request
  image_limits image;
};

inline constexpr int32_t default_completion_max_tokens = 16;  // OpenAI's default for /v1/completions
inline constexpr int32_t default_chat_max_tokens = 256;       // chat default: min(limit, this)

// One request of either endpoint. Sampling defaults are OpenAI's (temperature 1, top_p 1);
// top_k 0 means no top-k cut.
struct completion_request {
  bool chat = false;
  std::string model;
  std::variant<std::string, std::vector<int32_t>> prompt;  // completions: text or token ids
  std::vector<chat_message> messages;                      // chat: non-empty
  int32_t max_tokens = default_completion_max_tokens;
  float temperature = 1.0f;  // [0, 2]
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // >= 0
  std::vector<std::string> stop;  // at most 4, none empty
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a final usage-only chunk
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id → bias in [−100, 100], ids ascending
  float presence_penalty = 0.0f;                     // [−2, 2]
  float frequency_penalty = 0.0f;                    // [−2, 2]
  // Structured output: response_format json_object / json_schema, or the extension fields
  // "regex" and "ebnf" (at most one of them), checked to compile.
  // With active tools it is their tool_calls constraint, holding the content's one (auto).
  constraint_spec constraint;
  tool_config tools;  // chat: "tools", "tool_choice", "parallel_tool_calls"
  // −1: no logprobs; n ≥ 0: each token's log probability and the n likeliest (completions:
  // "logprobs": n ≤ 5; chat: "logprobs": true with "top_logprobs": n ≤ 20).
  int32_t logprobs = -1;
  traffic_class cls = traffic_class::chat;  // shoal extension field "traffic_class": "chat" or "agent"
  // chat: the image_url parts in message order, decoded and fit to the encoder's patches;
  // pos and count are set by expand_image_tokens.
  std::vector<prompt_image> images;
};

// 413 when a body of `body_bytes` exceeds limits.max_body_bytes; the server calls it with the
// Content-Length before reading the body.
std::optional<api_error> check_body_size(size_t body_bytes, const api_limits& limits);

// Parses and validates a request body (`chat`: /v1/chat/completions). Unknown fields are
// ignored, as OpenAI does; every rejected field yields its own 400 with `param` set.
std::expected<completion_request, api_error> parse_completion_request(std::string_view body, bool chat,
                                                                      const api_limits& limits);

// After tokenisation of a chat request with images: each image's one placeholder token
// (`image_token_id`) becomes the image's patch count of them, and r.images get their
// positions. 400 when the placeholders do not match the images one to one (a text part
// holding the placeholder text is refused before this, by the parser).
std::expected<std::vector<int32_t>, api_error> expand_image_tokens(const std::vector<int32_t>& ids,
                                                                   int32_t image_token_id,
                                                                   std::vector<prompt_image>& images);

// After tokenisation: prompt_tokens + max_tokens must fit context_length (400,
// code context_length_exceeded, message with the numbers).
std::optional<api_error> check_context(int64_t prompt_tokens, int32_t max_tokens, int64_t context_length);


// The messages the chat template renders for a request with tools: the tools' description
// (tools_prompt) appended to the first system message, or a system message of its own first.
std::vector<chat_message> with_tools_prompt(std::vector<chat_message> messages, const std::vector<tool_function>& functions);

struct usage_info {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// Fields every response and chunk of one request repeats.
struct response_meta {
  std::string id;       // make_response_id
  int64_t created = 0;  // unix seconds
  std::string model;
};

// "cmpl-<id>" or "chatcmpl-<id>": the request's id as every layer prints it (to_string).
std::string make_response_id(bool chat, request_id id);

// One generated token's log probabilities as a response shows them: its bytes (invalid
// UTF-8 written with U+FFFD in "token"; chat also lists the bytes), where it starts in the
// output text (completions' text_offset), and the likeliest tokens'. −inf is written −9999.
struct token_logprob {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
  int64_t text_offset = 0;
};
using logprob_list = std::vector<token_logprob>;

// Whole responses (stream = false). Text that is not valid UTF-8 is written with U+FFFD.
// `lp`: the tokens' log probabilities when the request asked for them ("logprobs": null else).
std::string completion_response_json(const response_meta& m, const std::string& text, finish_reason f,
                                     const usage_info& u, const logprob_list* lp = nullptr);
// `calls` (non-empty): the message's tool_calls; its content is null when `content` is empty.
std::string chat_completion_response_json(const response_meta& m, const std::string& content,
                                          finish_reason f, const usage_info& u, const logprob_list* lp = nullptr,
                                          const std::vector<tool_call>* calls = nullptr);

// Streamed chunks (stream = true), each sent as sse_event(...). Completions: text chunks, the
// last with its finish_reason. Chat: chat_role_chunk_json first (delta {role, content ""}),
// then content deltas (or chat_tool_calls_chunk_json), then chat_finish_chunk_json (empty delta, finish_reason). With
// include_usage, usage_chunk_json (choices []) goes last, before sse_done().
std::string completion_chunk_json(const response_meta& m, const std::string& text, finish_reason f,
                                  const logprob_list* lp = nullptr);
std::string chat_role_chunk_json(const response_meta& m);
std::string chat_content_chunk_json(const response_meta& m, const std::string& content,
                                    const logprob_list* lp = nullptr);
// A reply's tool calls, whole, as one delta ({"tool_calls": [{"index", "id", "type", "function"}]}),
// with the log probabilities of the tokens that wrote them when asked.
std::string chat_tool_calls_chunk_json(const response_meta& m, const std::vector<tool_call>& calls,
                                       const logprob_list* lp = nullptr);
std::string chat_finish_chunk_json(const response_meta& m, finish_reason f);
std::string usage_chunk_json(const response_meta& m, bool chat, const usage_info& u);

std::string sse_event(std::string_view json);  // "data: " + json + "\n\n"
std::string sse_done();                        // "data: [DONE]\n\n"

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by":"shoal"}]}
std::string models_json(const std::vector<std::string>& model_ids, int64_t created);

}  // namespace shoal::runtime
