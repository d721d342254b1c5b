// libFuzzer target: a chat template (the checkpoint's tokenizer_config.json carries it, so it
// is outside input) parsed and rendered by runtime/chat_template over a fixed conversation.
// Parse and render either succeed or return "chat template: ... at offset N"; no input may
// crash, hang or grow without bound.
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "runtime/serve/chat_template.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::runtime;
  std::string_view source(reinterpret_cast<const char*>(data), size);
  auto t = chat_template::parse(source);
  if (!t) {
    if (t.error().rfind("chat template: ", 0) != 0) std::abort();
    return 0;
  }
  static const std::vector<chat_message> messages = [] {
    std::vector<chat_message> m(3);
    m[0].role = "system", m[0].content = "Be brief.";
    m[1].role = "user", m[1].content = "Hello {{ there }} {% if %}";
    m[2].role = "assistant", m[2].content = "Hi.";
    return m;
  }();
  for (bool gen : {false, true}) {
    auto r = t->render(messages, gen, "<bos>", "<eos>");
    if (!r && r.error().rfind("chat template: ", 0) != 0) std::abort();
  }
  return 0;
}
