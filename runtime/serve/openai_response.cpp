// Response JSON of the OpenAI-compatible API (openai_api.hpp), and its errors. Responses are
// built with nlohmann::ordered_json so fields come out in OpenAI's order, and invalid UTF-8 in
// generated text (a token boundary inside a character) is replaced rather than thrown on.
#include "runtime/serve/openai_api.hpp"

#include <nlohmann/json.hpp>

namespace shoal::runtime {

namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// The API knows stop, length and tool_calls; the gateway sends an engine's other endings
// (error, aborted) as error events.
const char* finish_string(finish_reason f) {
  return f == finish_reason::stop ? "stop" : f == finish_reason::tool_calls ? "tool_calls" : "length";
}

ojson tool_calls_json(const std::vector<tool_call>& calls, bool indexed) {
  ojson a = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson c;
    if (indexed) c["index"] = i;
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    a.push_back(std::move(c));
  }
  return a;
}
ojson finish_json(finish_reason f) { return f == finish_reason::none ? ojson(nullptr) : ojson(finish_string(f)); }

ojson usage_json(const usage_info& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

ojson envelope(const response_meta& m, const char* object) {
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}

}  // namespace

std::string to_json(const api_error& e) {
  const auto null_if_empty = [](const std::string& s) { return s.empty() ? ojson(nullptr) : ojson(s); };
  return dump({{"error", {{"message", e.message}, {"type", e.type}, {"param", null_if_empty(e.param)},
                          {"code", null_if_empty(e.code)}}}});
}

api_error invalid_request_error(std::string message, std::string param, std::string code) {
  return {400, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}
api_error authentication_error(std::string message) {
  return {401, "authentication_error", std::move(message), "", "invalid_api_key"};
}
api_error model_not_found_error(const std::string& model) {
  return {404, "not_found_error", "The model '" + model + "' does not exist", "model", "model_not_found"};
}
api_error not_found_error(std::string message) { return {404, "not_found_error", std::move(message), "", ""}; }
api_error server_error(std::string message) { return {500, "server_error", std::move(message), "", ""}; }
api_error overloaded_error(std::string message) {
  return {503, "overloaded_error", std::move(message), "", "service_unavailable"};
}

std::string make_response_id(bool chat, request_id id) { return (chat ? "chatcmpl-" : "cmpl-") + to_string(id); }

namespace {

double finite_logprob(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }

// The token's bytes as valid UTF-8 (U+FFFD for what is not), as a key of top_logprobs.
std::string valid_text(const std::string& bytes) {
  return ojson::parse(ojson(bytes).dump(-1, ' ', false, ojson::error_handler_t::replace)).get<std::string>();
}

// Completions' legacy shape: parallel lists.
ojson completion_logprobs(const logprob_list* lp) {
  if (!lp) return nullptr;
  ojson tokens = ojson::array(), values = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const token_logprob& t : *lp) {
    tokens.push_back(t.token);
    values.push_back(finite_logprob(t.logprob));
    ojson top = ojson::object();
    for (const auto& [tok, v] : t.top) {
      const std::string key = valid_text(tok);
      if (!top.contains(key)) top[key] = finite_logprob(v);  // two tokens may decode alike: the likelier stays
    }
    tops.push_back(std::move(top));
    offsets.push_back(t.text_offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

ojson byte_list(const std::string& s) {
  ojson b = ojson::array();
  for (char c : s) b.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return b;
}

// Chat's shape: one entry per token with its bytes.
ojson chat_logprobs(const logprob_list* lp) {
  if (!lp) return nullptr;
  ojson content = ojson::array();
  for (const token_logprob& t : *lp) {
    ojson top = ojson::array();
    for (const auto& [tok, v] : t.top)
      top.push_back({{"token", tok}, {"logprob", finite_logprob(v)}, {"bytes", byte_list(tok)}});
    content.push_back({{"token", t.token}, {"logprob", finite_logprob(t.logprob)}, {"bytes", byte_list(t.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

}  // namespace

std::string completion_response_json(const response_meta& m, const std::string& text, finish_reason f,
                                     const usage_info& u, const logprob_list* lp) {
  ojson j = envelope(m, "text_completion");
  j["choices"] = ojson::array(
      {{{"index", 0}, {"text", text}, {"logprobs", completion_logprobs(lp)}, {"finish_reason", finish_json(f)}}});
  j["usage"] = usage_json(u);
  return dump(j);
}

std::string chat_completion_response_json(const response_meta& m, const std::string& content, finish_reason f,
                                          const usage_info& u, const logprob_list* lp,
                                          const std::vector<tool_call>* calls) {
  ojson j = envelope(m, "chat.completion");
  ojson message = {{"role", "assistant"}, {"content", content}};
  if (calls && !calls->empty()) {
    if (content.empty()) message["content"] = nullptr;
    message["tool_calls"] = tool_calls_json(*calls, false);
  }
  j["choices"] = ojson::array({{{"index", 0},
                                {"message", std::move(message)},
                                {"logprobs", chat_logprobs(lp)},
                                {"finish_reason", finish_json(f)}}});
  j["usage"] = usage_json(u);
  return dump(j);
}

std::string completion_chunk_json(const response_meta& m, const std::string& text, finish_reason f,
                                  const logprob_list* lp) {
  ojson j = envelope(m, "text_completion");
  j["choices"] = ojson::array(
      {{{"index", 0}, {"text", text}, {"logprobs", completion_logprobs(lp)}, {"finish_reason", finish_json(f)}}});
  return dump(j);
}

namespace {
std::string chat_chunk(const response_meta& m, ojson delta, finish_reason f, const logprob_list* lp = nullptr) {
  ojson j = envelope(m, "chat.completion.chunk");
  j["choices"] = ojson::array(
      {{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", chat_logprobs(lp)}, {"finish_reason", finish_json(f)}}});
  return dump(j);
}
}  // namespace

std::string chat_role_chunk_json(const response_meta& m) {
  return chat_chunk(m, {{"role", "assistant"}, {"content", ""}}, finish_reason::none);
}
std::string chat_content_chunk_json(const response_meta& m, const std::string& content, const logprob_list* lp) {
  return chat_chunk(m, {{"content", content}}, finish_reason::none, lp);
}
std::string chat_tool_calls_chunk_json(const response_meta& m, const std::vector<tool_call>& calls,
                                       const logprob_list* lp) {
  return chat_chunk(m, {{"tool_calls", tool_calls_json(calls, true)}}, finish_reason::none, lp);
}
std::string chat_finish_chunk_json(const response_meta& m, finish_reason f) {
  return chat_chunk(m, ojson::object(), f);
}

std::string usage_chunk_json(const response_meta& m, bool chat, const usage_info& u) {
  ojson j = envelope(m, chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = ojson::array();
  j["usage"] = usage_json(u);
  return dump(j);
}

std::string sse_event(std::string_view json_text) { return "data: " + std::string(json_text) + "\n\n"; }
std::string sse_done() { return "data: [DONE]\n\n"; }

std::string models_json(const std::vector<std::string>& model_ids, int64_t created) {
  ojson data = ojson::array();
  for (const std::string& id : model_ids)
    data.push_back({{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "shoal"}});
  return dump({{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace shoal::runtime
