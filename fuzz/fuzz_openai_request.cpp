// libFuzzer target: an OpenAI request body as the gateway parses it (runtime/openai_api).
// The first byte picks the endpoint (chat or completions); the rest is the body. Whatever the
// bytes, the parser returns a request or one 400-class error that names what is wrong.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runtime/serve/openai_api.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::runtime;
  if (size < 1) return 0;
  const bool chat = data[0] & 1;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  static const api_limits limits = [] {
    api_limits l;
    l.model_ids = {"model"};
    l.vocab_size = 1000;
    l.image_token = "<image>";
    l.image_side = 56;
    l.image_patch = 14;
    l.image.max_pixels = 1 << 16;
    return l;
  }();
  if (auto big = check_body_size(body.size(), limits)) return 0;
  auto r = parse_completion_request(body, chat, limits);
  if (!r) {
    // An error is a client error with a message: never an empty one, never a 5xx.
    if (r.error().message.empty() || r.error().status < 400 || r.error().status >= 500) std::abort();
    (void)to_json(r.error());
    return 0;
  }
  // What the parser accepted stays inside the limits it was given.
  if (r->max_tokens < 0 || r->max_tokens > limits.max_tokens_limit) std::abort();
  if (!(r->temperature >= 0 && r->temperature <= 2) || !(r->top_p > 0 && r->top_p <= 1) || r->top_k < 0) std::abort();
  if (r->stop.size() > 4 || (r->chat && r->messages.empty())) std::abort();
  for (const auto& [id, bias] : r->logit_bias)
    if (id < 0 || id >= limits.vocab_size || !(bias >= -100 && bias <= 100)) std::abort();
  return 0;
}
