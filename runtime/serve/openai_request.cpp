// Request validation of the OpenAI-compatible API (openai_api.hpp). Each request field has
// one small parse step that fills completion_request or returns the 400 that names it; JSON
// null counts as absent, as in OpenAI's API.
#include "runtime/serve/openai_api.hpp"

#include "runtime/structured/grammar.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>

namespace shoal::runtime {

namespace {

using json = nlohmann::ordered_json;  // a JSON schema's properties keep their order
using ojson = nlohmann::ordered_json;
using check = std::optional<api_error>;

// The field, or nullptr when absent or null.
const json* field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// Integers only (16.0 is not one); values beyond int64 clamp to its maximum for range checks.
std::optional<int64_t> as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > uint64_t(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

api_error bad(std::string message, std::string param) { return invalid_request_error(std::move(message), std::move(param)); }

check parse_model(const json& j, const api_limits& limits, completion_request& r) {
  const json* m = field(j, "model");
  if (!m) return bad("you must provide a model parameter ('model')", "model");
  if (!m->is_string()) return bad("'model' must be a string", "model");
  r.model = m->get<std::string>();
  if (std::find(limits.model_ids.begin(), limits.model_ids.end(), r.model) == limits.model_ids.end())
    return model_not_found_error(r.model);
  return std::nullopt;
}

check parse_prompt(const json& j, completion_request& r) {
  const json* p = field(j, "prompt");
  if (!p) return bad("you must provide a prompt ('prompt')", "prompt");
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];  // ["text"]
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().empty()) return bad("'prompt' must not be empty", "prompt");
    r.prompt = p->get<std::string>();
    return std::nullopt;
  }
  if (!p->is_array()) return bad("'prompt' must be a string or an array of token ids", "prompt");
  if (p->empty()) return bad("'prompt' must not be empty", "prompt");
  std::vector<int32_t> ids;
  for (const json& t : *p) {
    const auto id = as_int64(t);
    if (t.is_string()) return bad("'prompt': batched prompts (more than one string) are not supported", "prompt");
    if (!id || *id < 0 || *id > std::numeric_limits<int32_t>::max())
      return bad("'prompt' must be a string or an array of non-negative integer token ids", "prompt");
    ids.push_back(static_cast<int32_t>(*id));
  }
  r.prompt = std::move(ids);
  return std::nullopt;
}

// One image_url part: a data URL decoded, checked and fit to the encoder's patches.
check parse_image_part(const json& part, const std::string& param, const api_limits& limits, completion_request& r) {
  const std::string label = "image " + std::to_string(r.images.size() + 1);
  if (limits.image_token.empty())
    return bad("'" + param + "': this model has no vision encoder; image_url parts are not accepted", param);
  if (static_cast<int64_t>(r.images.size()) >= limits.max_images)
    return bad("too many images: at most " + std::to_string(limits.max_images) + " per request", param);
  const json* iu = field(part, "image_url");
  const json* url = iu && iu->is_object() ? field(*iu, "url") : (iu && iu->is_string() ? iu : nullptr);
  if (!url || !url->is_string())
    return bad("'" + param + "': an image_url part needs {\"image_url\": {\"url\": \"data:image/...;base64,...\"}}",
               param + ".image_url.url");
  if (const json* detail = iu->is_object() ? field(*iu, "detail") : nullptr;
      detail && !(detail->is_string() && (*detail == "auto" || *detail == "low" || *detail == "high")))
    return bad("'" + param + ".image_url.detail' must be 'auto', 'low' or 'high'", param + ".image_url.detail");
  auto bytes = decode_data_url(url->get_ref<const std::string&>(), limits.image);
  if (!bytes) return bad(label + ": " + bytes.error().message, param + ".image_url.url");
  auto img = decode_image(*bytes, limits.image);
  if (!img) return bad(label + ": " + img.error().message, param + ".image_url.url");
  auto [w, h] = fit_to_patches(img->width, img->height, limits.image_side, limits.image_patch);
  auto fit = std::make_shared<rgb_image>(w == img->width && h == img->height ? std::move(*img) : resize_area(*img, w, h));
  prompt_image pi;
  pi.count = (w / limits.image_patch) * (h / limits.image_patch);
  pi.hash = image_content_hash(*fit);
  pi.pixels = std::move(fit);
  r.images.push_back(std::move(pi));
  return std::nullopt;
}

// Message content: a string, null (assistant only), or parts: {"type": "text", "text": ...}
// and (chat with a vision model) {"type": "image_url", "image_url": {"url": data URL}}, each
// image rendered as one placeholder token text (expanded after tokenisation).
check parse_content(const json& m, const std::string& param, const api_limits& limits, completion_request& r,
                    chat_message& out) {
  const json* c = field(m, "content");
  if (!c) {
    if (out.role == "assistant") return std::nullopt;
    return bad("'" + param + "' is required for role '" + out.role + "'", param);
  }
  auto check_text = [&](const std::string& text, const std::string& where) -> check {
    if (!limits.image_token.empty() && text.find(limits.image_token) != std::string::npos)
      return bad("'" + where + "' contains the image placeholder '" + limits.image_token +
                   "'; send images as image_url parts",
                 where);
    return std::nullopt;
  };
  if (c->is_string()) {
    out.content = c->get<std::string>();
    return check_text(*out.content, param);
  }
  if (!c->is_array()) return bad("'" + param + "' must be a string, an array of content parts or null", param);
  std::string text;
  for (size_t i = 0; i < c->size(); ++i) {
    const json& part = (*c)[i];
    const std::string pp = param + "[" + std::to_string(i) + "]";
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    if (type && *type == "image_url") {
      if (auto e = parse_image_part(part, pp, limits, r)) return e;
      text += limits.image_token;
      continue;
    }
    const json* t = part.is_object() ? field(part, "text") : nullptr;
    if (!type || *type != "text" || !t || !t->is_string())
      return bad("'" + pp + "': only parts {\"type\": \"text\", \"text\": string} and {\"type\": \"image_url\", " +
                   "\"image_url\": {\"url\": data URL}} are supported",
                 pp);
    if (auto e = check_text(t->get_ref<const std::string&>(), pp + ".text")) return e;
    text += t->get<std::string>();
  }
  out.content = std::move(text);
  return std::nullopt;
}

// A function's or a response schema's name: 1 to 64 letters, digits, '_' or '-'.
bool valid_name(const json& n) {
  if (!n.is_string()) return false;
  const auto& s = n.get_ref<const std::string&>();
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

// An assistant message's earlier tool calls ({"id", "type": "function", "function": {"name",
// "arguments": JSON text}}), rendered by the chat template; a tool message's tool_call_id.
check parse_message_tool_calls(const json& m, const std::string& param, chat_message& msg) {
  if (const json* id = field(m, "tool_call_id"); id && (msg.role != "tool" || !id->is_string()))
    return bad("'" + param + ".tool_call_id' must be a string, on a 'tool' message", param + ".tool_call_id");
  const json* tc = field(m, "tool_calls");
  if (!tc) return std::nullopt;
  if (msg.role != "assistant") return bad("'" + param + ".tool_calls' belongs to an 'assistant' message", param + ".tool_calls");
  if (!tc->is_array()) return bad("'" + param + ".tool_calls' must be an array", param + ".tool_calls");
  for (size_t k = 0; k < tc->size(); ++k) {
    const json& c = (*tc)[k];
    const std::string cp = param + ".tool_calls[" + std::to_string(k) + "]";
    const json* type = c.is_object() ? field(c, "type") : nullptr;
    const json* fn = c.is_object() ? field(c, "function") : nullptr;
    if (!type || *type != "function" || !fn || !fn->is_object())
      return bad("'" + cp + "' must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", cp);
    const json* name = field(*fn, "name");
    const json* args = field(*fn, "arguments");
    if (!name || !valid_name(*name))
      return bad("'" + cp + ".function.name' must be 1 to 64 letters, digits, '_' or '-'", cp + ".function.name");
    if (!args || !args->is_string() || !json::accept(args->get_ref<const std::string&>()))
      return bad("'" + cp + ".function.arguments' must be a string of JSON", cp + ".function.arguments");
    const json* id = field(c, "id");
    if (id && !id->is_string()) return bad("'" + cp + ".id' must be a string", cp + ".id");
    msg.tool_calls.push_back({id ? id->get<std::string>() : "", name->get<std::string>(), args->get<std::string>()});
  }
  if (!msg.tool_calls.empty() && msg.content && !msg.content->empty())
    return bad("'" + param + ".content' must be null on an assistant message with tool_calls (the chat template renders one or the other)",
               param + ".content");
  if (!msg.tool_calls.empty()) msg.content.reset();
  return std::nullopt;
}

check parse_messages(const json& j, const api_limits& limits, completion_request& r) {
  const json* ms = field(j, "messages");
  if (!ms) return bad("you must provide 'messages'", "messages");
  if (!ms->is_array()) return bad("'messages' must be an array", "messages");
  if (ms->empty()) return bad("'messages' must not be empty", "messages");
  static constexpr std::array<std::string_view, 4> roles = {"system", "user", "assistant", "tool"};
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad("'" + param + "' must be an object", param);
    const json* role = field(m, "role");
    if (!role || !role->is_string() ||
        std::find(roles.begin(), roles.end(), role->get_ref<const std::string&>()) == roles.end())
      return bad("'" + param + ".role' must be one of 'system', 'user', 'assistant', 'tool'", param + ".role");
    chat_message msg{role->get<std::string>(), std::nullopt, {}};
    if (auto e = parse_content(m, param + ".content", limits, r, msg)) return e;
    if (auto e = parse_message_tool_calls(m, param, msg)) return e;
    r.messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

check parse_max_tokens(const json& j, const api_limits& limits, completion_request& r) {
  const char* name = "max_tokens";
  const json* v = field(j, name);
  if (r.chat && field(j, "max_completion_tokens")) name = "max_completion_tokens", v = field(j, name);
  if (!v) {
    r.max_tokens = r.chat ? std::min(limits.max_tokens_limit, default_chat_max_tokens)
                          : std::min(limits.max_tokens_limit, default_completion_max_tokens);
    return std::nullopt;
  }
  const auto n = as_int64(*v);
  if (!n || *n < 1 || *n > limits.max_tokens_limit)
    return bad("'" + std::string(name) + "' must be an integer from 1 to " + std::to_string(limits.max_tokens_limit) +
                   ", got " + v->dump(),
               name);
  r.max_tokens = static_cast<int32_t>(*n);
  return std::nullopt;
}

check parse_sampling(const json& j, completion_request& r) {
  if (const json* t = field(j, "temperature")) {
    if (!t->is_number() || !(t->get<double>() >= 0.0 && t->get<double>() <= 2.0))
      return bad("'temperature' must be a number from 0 to 2, got " + t->dump(), "temperature");
    r.temperature = t->get<float>();
  }
  if (const json* p = field(j, "top_p")) {
    if (!p->is_number() || !(p->get<double>() > 0.0 && p->get<double>() <= 1.0))
      return bad("'top_p' must be a number in (0, 1], got " + p->dump(), "top_p");
    r.top_p = p->get<float>();
  }
  if (const json* k = field(j, "top_k")) {
    const auto n = as_int64(*k);
    if (!n || *n < 0 || *n > std::numeric_limits<int32_t>::max())
      return bad("'top_k' must be a non-negative integer (0: no top-k), got " + k->dump(), "top_k");
    r.top_k = static_cast<int32_t>(*n);
  }
  if (const json* s = field(j, "seed")) {
    if (!s->is_number_integer() || (!s->is_number_unsigned() && s->get<int64_t>() < 0))
      return bad("'seed' must be a non-negative integer, got " + s->dump(), "seed");
    r.seed = s->get<uint64_t>();
  }
  if (const json* n = field(j, "n"); n && !(as_int64(*n) == 1))
    return bad("'n' must be 1: several choices per request are not supported", "n");
  return std::nullopt;
}

check parse_stop(const json& j, completion_request& r) {
  const json* s = field(j, "stop");
  if (!s) return std::nullopt;
  const auto add = [&](const json& v) -> check {
    if (!v.is_string() || v.get_ref<const std::string&>().empty())
      return bad("'stop' must be a non-empty string or an array of at most 4 of them", "stop");
    r.stop.push_back(v.get<std::string>());
    return std::nullopt;
  };
  if (!s->is_array()) return add(*s);
  if (s->size() > 4) return bad("'stop' may hold at most 4 sequences, got " + std::to_string(s->size()), "stop");
  for (const json& v : *s)
    if (auto e = add(v)) return e;
  return std::nullopt;
}

check parse_stream(const json& j, completion_request& r) {
  if (const json* s = field(j, "stream")) {
    if (!s->is_boolean()) return bad("'stream' must be a boolean", "stream");
    r.stream = s->get<bool>();
  }
  const json* o = field(j, "stream_options");
  if (!o) return std::nullopt;
  if (!r.stream) return bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
  if (!o->is_object()) return bad("'stream_options' must be an object", "stream_options");
  if (const json* u = field(*o, "include_usage")) {
    if (!u->is_boolean()) return bad("'stream_options.include_usage' must be a boolean", "stream_options.include_usage");
    r.include_usage = u->get<bool>();
  }
  return std::nullopt;
}

// Completions: "logprobs" an integer in [0, 5]; chat: "logprobs" a boolean and "top_logprobs"
// an integer in [0, 20] that needs logprobs true.
check parse_logprobs(const json& j, bool chat, completion_request& r) {
  const json* lp = field(j, "logprobs");
  const json* top = field(j, "top_logprobs");
  if (!chat) {
    if (!lp) return std::nullopt;
    auto n = as_int64(*lp);
    if (!n || *n < 0 || *n > 5) return bad("'logprobs' must be an integer from 0 to 5, got " + lp->dump(), "logprobs");
    r.logprobs = static_cast<int32_t>(*n);
    return std::nullopt;
  }
  if (lp && !lp->is_boolean()) return bad("'logprobs' must be a boolean", "logprobs");
  const bool on = lp && lp->get<bool>();
  int64_t n = 0;
  if (top) {
    auto v = as_int64(*top);
    if (!v || *v < 0 || *v > 20) return bad("'top_logprobs' must be an integer from 0 to 20, got " + top->dump(), "top_logprobs");
    if (!on) return bad("'top_logprobs' needs 'logprobs' to be true", "top_logprobs");
    n = *v;
  }
  if (on) r.logprobs = static_cast<int32_t>(n);
  return std::nullopt;
}

// Accepted only at their "off" values: echo, best_of.
check parse_unsupported(const json& j) {
  const auto is_off = [](const json& v) {
    return (v.is_boolean() && !v.get<bool>()) || (v.is_number_integer() && v.get<int64_t>() == 0);
  };
  for (const char* name : {"echo"})
    if (const json* v = field(j, name); v && !is_off(*v))
      return bad("'" + std::string(name) + "' is not supported", name);
  if (const json* b = field(j, "best_of"); b && !(as_int64(*b) == 1))
    return bad("'best_of' is not supported (only 1)", "best_of");
  return std::nullopt;
}

// presence_penalty, frequency_penalty ([−2, 2]) and logit_bias ({"token id": bias in
// [−100, 100]}, ids inside the vocabulary when the limits know it).
check parse_adjustments(const json& j, const api_limits& limits, completion_request& r) {
  for (auto [name, out] : {std::pair{"presence_penalty", &r.presence_penalty}, {"frequency_penalty", &r.frequency_penalty}})
    if (const json* v = field(j, name)) {
      if (!v->is_number() || !(v->get<double>() >= -2.0 && v->get<double>() <= 2.0))
        return bad("'" + std::string(name) + "' must be a number from -2 to 2, got " + v->dump(), name);
      *out = v->get<float>();
    }
  const json* b = field(j, "logit_bias");
  if (!b) return std::nullopt;
  if (!b->is_object()) return bad("'logit_bias' must be an object of token ids to biases", "logit_bias");
  if (b->size() > 300) return bad("'logit_bias' may name at most 300 tokens, got " + std::to_string(b->size()), "logit_bias");
  for (const auto& [key, value] : b->items()) {
    int64_t id = -1;
    const bool digits = !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max() || (limits.vocab_size > 0 && id >= limits.vocab_size))
      return bad("'logit_bias' key '" + key + "' is not a token id" +
                     (limits.vocab_size > 0 ? " in [0, " + std::to_string(limits.vocab_size) + ")" : std::string()),
                 "logit_bias");
    if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0))
      return bad("'logit_bias' of token " + key + " must be a number from -100 to 100, got " + value.dump(), "logit_bias");
    r.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  std::sort(r.logit_bias.begin(), r.logit_bias.end());
  for (size_t i = 1; i < r.logit_bias.size(); ++i)  // "7" and "07" name one token
    if (r.logit_bias[i].first == r.logit_bias[i - 1].first)
      return bad("'logit_bias' names token " + std::to_string(r.logit_bias[i].first) + " twice", "logit_bias");
  return std::nullopt;
}

// Fields the API defines that shoal does not implement yet: accepted only at the value that
// changes nothing, otherwise refused naming the field (never accepted and ignored). Any
// other field that is not read above is refused as unknown.
check parse_neutral_and_unknown(const json& j, bool chat) {
  const auto empty = [](const json& v) { return (v.is_object() || v.is_array()) && v.empty(); };
  if (const json* v = field(j, "functions"); v && !empty(*v))
    return bad("'functions' is not supported: it is deprecated, send 'tools'", "functions");
  if (const json* v = field(j, "function_call"); v && *v != "none")
    return bad("'function_call' is not supported (only \"none\")", "function_call");
  if (const json* v = field(j, "suffix"); v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
    return bad("'suffix' is not supported", "suffix");
  static constexpr std::string_view known[] = {
      "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
      "n", "stop", "stream", "stream_options", "logprobs", "top_logprobs", "echo", "best_of", "ignore_eos",
      "traffic_class", "presence_penalty", "frequency_penalty", "logit_bias", "response_format", "regex", "ebnf", "tools",
      "tool_choice", "functions", "function_call", "suffix",
      // informational: an end-user id
      "user", "parallel_tool_calls"};
  for (const auto& [key, value] : j.items()) {
    if (value.is_null()) continue;  // null means absent
    if (std::find(std::begin(known), std::end(known), key) == std::end(known))
      return bad("unrecognized request argument supplied: '" + key + "'", key);
    if (!chat && (key == "messages" || key == "tools" || key == "tool_choice" || key == "response_format" ||
                  key == "max_completion_tokens" || key == "parallel_tool_calls"))
      return bad("'" + key + "' belongs to /v1/chat/completions, not /v1/completions", key);
    if (!chat && key == "top_logprobs")
      return bad("'top_logprobs' belongs to /v1/chat/completions, not /v1/completions (there 'logprobs' is the count)", key);
    if (chat && (key == "prompt" || key == "suffix" || key == "echo" || key == "best_of"))
      return bad("'" + key + "' belongs to /v1/completions, not /v1/chat/completions", key);
  }
  return std::nullopt;
}

// Structured output: response_format ({"type": "text"}, {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}) and
// the extension fields "regex" and "ebnf"; at most one constraint, and it must compile (the
// error says where in the schema, pattern or grammar).
check parse_constraint(const json& j, completion_request& r) {
  std::string param;
  auto set = [&](constraint_spec c, const char* name) -> check {
    if (r.constraint.active())
      return bad("only one of 'response_format' (json_object, json_schema), 'regex' and 'ebnf' may be given, got '" + param +
                     "' and '" + name + "'",
                 name);
    r.constraint = std::move(c);
    param = name;
    return std::nullopt;
  };
  if (const json* f = field(j, "response_format")) {
    if (!f->is_object()) return bad("'response_format' must be an object", "response_format");
    const json* t = field(*f, "type");
    const std::string type = t && t->is_string() ? t->get<std::string>() : "";
    if (type != "text" && type != "json_object" && type != "json_schema")
      return bad("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
    for (const auto& [key, value] : f->items())
      if (key != "type" && !(type == "json_schema" && key == "json_schema"))
        return bad("unrecognized field 'response_format." + key + "' for type \"" + type + "\"", "response_format." + key);
    if (type == "json_object") {
      if (auto e = set({constraint_kind::json_object, ""}, "response_format")) return e;
    } else if (type == "json_schema") {
      const json* s = field(*f, "json_schema");
      if (!s || !s->is_object()) return bad("'response_format.json_schema' must be an object", "response_format.json_schema");
      for (const auto& [key, value] : s->items())
        if (key != "name" && key != "schema" && key != "strict" && key != "description")
          return bad("unrecognized field 'response_format.json_schema." + key + "'", "response_format.json_schema." + key);
      const json* name = field(*s, "name");
      if (!name || !valid_name(*name))
        return bad("'response_format.json_schema.name' must be 1 to 64 letters, digits, '_' or '-'",
                   "response_format.json_schema.name");
      if (const json* st = field(*s, "strict"); st && !st->is_boolean())
        return bad("'response_format.json_schema.strict' must be a boolean", "response_format.json_schema.strict");
      if (const json* d = field(*s, "description"); d && !d->is_string())
        return bad("'response_format.json_schema.description' must be a string", "response_format.json_schema.description");
      const json* schema = field(*s, "schema");
      if (schema && !schema->is_object() && !schema->is_boolean())
        return bad("'response_format.json_schema.schema' must be a JSON schema (an object)", "response_format.json_schema.schema");
      // strict or not, the output is held to the schema.
      if (auto e = set({constraint_kind::json_schema, schema ? schema->dump() : std::string("{}")}, "response_format"))
        return e;
      param = "response_format.json_schema.schema";
    }
  }
  for (auto [name, kind] : {std::pair{"regex", constraint_kind::regex}, {"ebnf", constraint_kind::ebnf}})
    if (const json* v = field(j, name)) {
      if (!v->is_string() || v->get_ref<const std::string&>().empty())
        return bad("'" + std::string(name) + "' must be a non-empty string", name);
      if (auto e = set({kind, v->get<std::string>()}, name)) return e;
    }
  if (!r.constraint.active()) return std::nullopt;
  grammar g;
  if (auto e = compile(r.constraint, g)) return bad("'" + param + "' is invalid: " + e->text(), param);
  return std::nullopt;
}

// Tool calling: "tools" (functions with JSON-schema parameters), "tool_choice" ("none",
// "auto", "required" or {"type": "function", "function": {"name"}}; "auto" when tools are
// given) and "parallel_tool_calls". With a choice other than none the output is constrained to
// the DeepSeek-V3 call format (auto: calls, or content as response_format says).
check parse_tools(const json& j, completion_request& r) {
  const json* ts = field(j, "tools");
  if (ts && !ts->is_array()) return bad("'tools' must be an array of {\"type\": \"function\", \"function\": {...}}", "tools");
  if (ts && ts->size() > 128) return bad("'tools' may hold at most 128 functions, got " + std::to_string(ts->size()), "tools");
  for (size_t i = 0; ts && i < ts->size(); ++i) {
    const json& t = (*ts)[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    const json* type = t.is_object() ? field(t, "type") : nullptr;
    const json* fn = t.is_object() ? field(t, "function") : nullptr;
    if (!type || *type != "function" || !fn || !fn->is_object())
      return bad("'" + p + "' must be {\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}", p);
    for (const auto& [key, value] : fn->items())
      if (key != "name" && key != "description" && key != "parameters" && key != "strict")
        return bad("unrecognized field '" + p + ".function." + key + "'", p + ".function." + key);
    const json* name = field(*fn, "name");
    if (!name || !valid_name(*name))
      return bad("'" + p + ".function.name' must be 1 to 64 letters, digits, '_' or '-'", p + ".function.name");
    tool_function f;
    f.name = name->get<std::string>();
    for (const auto& g : r.tools.functions)
      if (g.name == f.name) return bad("'" + p + ".function.name': function '" + f.name + "' is defined twice", p + ".function.name");
    if (const json* d = field(*fn, "description")) {
      if (!d->is_string()) return bad("'" + p + ".function.description' must be a string", p + ".function.description");
      f.description = d->get<std::string>();
    }
    if (const json* st = field(*fn, "strict"); st && !st->is_boolean())
      return bad("'" + p + ".function.strict' must be a boolean", p + ".function.strict");
    if (const json* ps = field(*fn, "parameters")) {
      if (!ps->is_object()) return bad("'" + p + ".function.parameters' must be a JSON schema (an object)", p + ".function.parameters");
      f.parameters = ps->dump();
      grammar g;
      if (auto e = compile_json_schema(f.parameters, g))
        return bad("'" + p + ".function.parameters' is invalid: " + e->text(), p + ".function.parameters");
    }
    r.tools.functions.push_back(std::move(f));
  }
  const bool have = !r.tools.functions.empty();
  r.tools.mode = have ? tool_mode::auto_ : tool_mode::none;
  if (const json* c = field(j, "tool_choice")) {
    if (c->is_string() && (*c == "none" || *c == "auto" || *c == "required")) {
      r.tools.mode = *c == "none" ? tool_mode::none : *c == "auto" ? tool_mode::auto_ : tool_mode::required;
    } else if (c->is_object() && field(*c, "type") && *field(*c, "type") == "function" && field(*c, "function") &&
               field(*c, "function")->is_object() && field(*field(*c, "function"), "name") &&
               field(*field(*c, "function"), "name")->is_string()) {
      r.tools.mode = tool_mode::function;
      r.tools.function = field(*field(*c, "function"), "name")->get<std::string>();
      if (std::none_of(r.tools.functions.begin(), r.tools.functions.end(),
                       [&](const tool_function& f) { return f.name == r.tools.function; }))
        return bad("'tool_choice' names function '" + r.tools.function + "', which 'tools' does not define", "tool_choice");
    } else {
      return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                 "tool_choice");
    }
    if (!have && r.tools.mode != tool_mode::none)
      return bad("'tool_choice' is only allowed when 'tools' are given", "tool_choice");
  }
  if (const json* pc = field(j, "parallel_tool_calls")) {
    if (!pc->is_boolean()) return bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    r.tools.parallel = pc->get<bool>();
  }
  if (!r.tools.active()) return std::nullopt;
  r.constraint = tool_constraint(r.tools, r.constraint);
  grammar g;
  if (auto e = compile(r.constraint, g)) return bad("'tools' cannot be constrained: " + e->text(), "tools");
  return std::nullopt;
}

check parse_extensions(const json& j, completion_request& r) {
  if (const json* e = field(j, "ignore_eos")) {
    if (!e->is_boolean()) return bad("'ignore_eos' must be a boolean", "ignore_eos");
    r.ignore_eos = e->get<bool>();
  }
  if (const json* t = field(j, "traffic_class")) {
    auto cls = t->is_string() ? traffic_class_from_name(t->get<std::string>()) : std::nullopt;
    if (!cls) return bad("'traffic_class' must be \"chat\" or \"agent\"", "traffic_class");
    r.cls = *cls;
  }
  return std::nullopt;
}

}  // namespace

std::optional<api_error> check_body_size(size_t body_bytes, const api_limits& limits) {
  if (body_bytes <= limits.max_body_bytes) return std::nullopt;
  return api_error{413, "request_too_large",
                   "request body of " + std::to_string(body_bytes) + " bytes exceeds the limit of " +
                       std::to_string(limits.max_body_bytes) + " bytes",
                   "", ""};
}

std::expected<completion_request, api_error> parse_completion_request(std::string_view body, bool chat,
                                                                      const api_limits& limits) {
  if (auto e = check_body_size(body.size(), limits)) return std::unexpected(*e);
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return std::unexpected(bad("request body is not valid JSON", ""));
  if (!j.is_object()) return std::unexpected(bad("request body must be a JSON object", ""));
  completion_request r;
  r.chat = chat;
  for (check e : {parse_model(j, limits, r), chat ? parse_messages(j, limits, r) : parse_prompt(j, r),
                  parse_max_tokens(j, limits, r), parse_sampling(j, r), parse_stop(j, r), parse_stream(j, r),
                  parse_unsupported(j), parse_extensions(j, r), parse_adjustments(j, limits, r),
                  parse_neutral_and_unknown(j, chat), parse_constraint(j, r), chat ? parse_tools(j, r) : check{},
                  parse_logprobs(j, chat, r)})
    if (e) return std::unexpected(std::move(*e));
  return r;
}

std::expected<std::vector<int32_t>, api_error> expand_image_tokens(const std::vector<int32_t>& ids,
                                                                   int32_t image_token_id,
                                                                   std::vector<prompt_image>& images) {
  const auto found = static_cast<size_t>(std::count(ids.begin(), ids.end(), image_token_id));
  if (found != images.size())
    return std::unexpected(invalid_request_error("the rendered prompt holds " + std::to_string(found) +
                                                   " image placeholders for " + std::to_string(images.size()) +
                                                   " images (the chat template or a system prompt adds or drops some)",
                                                 "messages"));
  std::vector<int32_t> out;
  size_t k = 0;
  for (int32_t t : ids) {
    if (t != image_token_id) {
      out.push_back(t);
      continue;
    }
    images[k].pos = static_cast<int64_t>(out.size());
    out.insert(out.end(), static_cast<size_t>(images[k].count), image_token_id);
    ++k;
  }
  return out;
}

std::optional<api_error> check_context(int64_t prompt_tokens, int32_t max_tokens, int64_t context_length) {
  if (prompt_tokens + max_tokens <= context_length) return std::nullopt;
  return invalid_request_error(
      "This model's maximum context length is " + std::to_string(context_length) + " tokens. However, you requested " +
          std::to_string(prompt_tokens + max_tokens) + " tokens (" + std::to_string(prompt_tokens) +
          " in the prompt, " + std::to_string(max_tokens) +
          " for the completion). Please reduce the length of the prompt or completion.",
      "", "context_length_exceeded");
}

std::vector<chat_message> with_tools_prompt(std::vector<chat_message> messages, const std::vector<tool_function>& functions) {
  if (functions.empty()) return messages;
  const std::string section = tools_prompt(functions);
  if (!messages.empty() && messages.front().role == "system" && messages.front().content) {
    *messages.front().content += "\n\n" + section;
  } else {
    messages.insert(messages.begin(), chat_message{"system", section, {}});
  }
  return messages;
}

}  // namespace shoal::runtime
