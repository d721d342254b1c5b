// Offline inference: a list of prompts in, completions out, through one engine with
// continuous batching. Usage: offline_inference MODEL_DIR [PROMPTS_FILE] (one prompt a line;
// without a file a few built-in prompts are used).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/engine/engine_setup.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [PROMPTS_FILE]\n", argv[0]);
    return 2;
  }
  std::vector<std::string> prompts = {"Hello, my name is", "The capital of France is",
                                      "The future of AI is", "DeepSeek-style mixture of experts"};
  if (argc > 2) {
    std::ifstream f(argv[2]);
    if (!f) {
      std::fprintf(stderr, "cannot read prompts file %s\n", argv[2]);
      return 2;
    }
    prompts.clear();
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) prompts.push_back(line);
  }
  auto m = shoal::runtime::load_model_dir(argv[1], true);
  if (!m) {
    std::fprintf(stderr, "%s\n", m.error().message.c_str());
    return 1;
  }
  auto cfg = shoal::runtime::default_engine_config(m->weights->config, 512);
  shoal::runtime::engine eng(m->weights, cfg, m->tokenizer);
  shoal::runtime::sampling_params params;
  params.temperature = 0.6f;
  params.top_p = 0.95f;
  params.max_tokens = 24;
  for (size_t i = 0; i < prompts.size(); ++i) {
    params.seed = i;
    auto id = eng.add_request(shoal::runtime::encode_prompt(*m->tokenizer, prompts[i]), params);
    if (!id) {
      std::fprintf(stderr, "prompt %zu: %s\n", i, id.error().message.c_str());
      return 1;
    }
  }
  auto done = eng.run_to_completion();
  for (size_t i = 0; i < done.size(); ++i)
    std::printf("Prompt: %s\nCompletion (%zu tokens): %s\n\n", prompts[i].c_str(), done[i].output.size(),
                done[i].text.c_str());
  auto s = eng.stats();
  std::printf("steps %llu, prefill tokens %llu, decode tokens %llu, forward %.2f s\n",
              static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.prefill_tokens),
              static_cast<unsigned long long>(s.decode_tokens), s.forward_s);
  return 0;
}
