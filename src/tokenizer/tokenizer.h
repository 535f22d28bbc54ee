// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (the DeepSeek-V3 / V4 format), with ids
// identical to the `tokenizers` library: added and special tokens found in the text, the normalizer, the
// pre-tokenizer sequence (Split regexes with Unicode classes, ByteLevel), ranked merges and the ByteLevel
// decoder. StreamDecoder turns ids into text while generating without ever emitting broken UTF-8.
//
// A Tokenizer is immutable after loading; encode / decode may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class Tokenizer {
 public:
  // Loads tokenizer.json (a directory means DIR/tokenizer.json, e.g. a checkpoint directory). BOS / EOS come
  // from tokenizer_config.json in the same directory when present
  // ("bos_token" / "eos_token"), else from the DeepSeek names <｜begin▁of▁sentence｜> / <｜end▁of▁sentence｜>.
  // Throws Error naming the file and the field on a missing file, invalid JSON or an unsupported component.
  static Tokenizer from_file(const std::string& file_or_dir);
  // Same from the text of a tokenizer.json (`source` names it in errors); BOS / EOS use the DeepSeek names.
  static Tokenizer from_json(std::string_view json_text, const std::string& source = "<tokenizer.json>");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `text` must be valid UTF-8 (Error otherwise). Added / special token strings inside the text become their
  // ids; with allow_special = false the tokens marked special are tokenized as plain text instead (use it for
  // untrusted user content). add_bos prepends the BOS id (Error if the tokenizer has none).
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false, bool allow_special = true) const;

  // Concatenates the tokens' bytes and repairs invalid UTF-8 with U+FFFD as `tokenizers` does. Ids without a
  // token are skipped, as in `tokenizers`; skip_special drops the tokens marked special.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;  // the vocabulary string (byte-level form)
  bool is_special(int32_t id) const;
  // The bytes a token decodes to (may be an incomplete UTF-8 sequence); empty for an id without a token.
  std::string_view token_bytes(int32_t id) const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // Size of the id space: the largest id + 1 (129,280 for DeepSeek-V4 = the embedding rows).
  int32_t vocab_size() const;
  const std::string& source() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming: feed ids one at a time, get back only text whose UTF-8 is complete.
// A multi-byte character split across tokens is held back until its last byte arrives. Bytes that can never
// become valid are emitted as U+FFFD exactly where decode() would put them, so the concatenation of every
// push() and the final finish() equals decode() of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  std::string push(int32_t id);
  std::string push(std::span<const int32_t> ids);
  // Emits whatever is held back (an incomplete tail becomes U+FFFD) and starts over.
  std::string finish();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string drain();
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsv4
