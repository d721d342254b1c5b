// Hugging Face byte-level BPE tokenizer read from tokenizer.json: added/special tokens
// matched first, then the pre-tokenizer's regex splits (PCRE2, UTF + UCP), byte-level
// mapping, BPE merges by rank; decode maps ids back to bytes. Handles the DeepSeek-V3
// tokenizer and the byte-level tokenizer of the generated test presets.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/error.hpp"

namespace shoal::model {

class tokenizer {
 public:
  // Reads tokenizer.json (and tokenizer_config.json beside it when present, for bos/eos and
  // the chat template). Errors name the file and the field.
  static result<tokenizer> load(const std::string& tokenizer_json_path);
  static result<tokenizer> parse(std::string_view tokenizer_json, const std::string& file);

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  // Encodes without adding BOS; special tokens in the text are recognised.
  std::vector<int32_t> encode(std::string_view text) const;
  // Decodes ids to UTF-8 bytes (invalid sequences are passed through as bytes).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode_token(int32_t id) const;

  int32_t vocab_size() const;          // max id + 1
  int32_t bos_id() const;              // -1 when unknown
  int32_t eos_id() const;
  int32_t token_id(std::string_view token) const;  // -1 when absent
  // An added token (tokenizer.json "added_tokens": special tokens and the like), matched in
  // text as a whole rather than through BPE.
  bool is_added(int32_t id) const;
  const std::string& chat_template() const;

 private:
  struct impl;
  explicit tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// tokenizer.json text of a byte-level BPE tokenizer: the 256 bytes (id = byte value), 20 merges
// of common English pairs (ids 256..275), then the given special tokens as added tokens (ids
// 276...). Used by the tiny presets.
std::string byte_level_tokenizer_json(const std::vector<std::string>& special_tokens);

}  // namespace shoal::model
