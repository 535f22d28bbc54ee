// Added (and special) tokens of a tokenizer.json: found in the text before any other processing and
// turned straight into their ids, as Hugging Face `tokenizers` does.
//
// Matching is leftmost-longest over two token sets, in two passes: tokens with normalized = false are
// matched on the raw text first; each remaining gap is then normalized and searched for the tokens with
// normalized = true (whose contents are normalized the same way). single_word, lstrip and rstrip behave as
// in `tokenizers`: single_word drops a match touching a word character, lstrip / rstrip absorb the
// adjacent whitespace into the token.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pretokenizer.h"

namespace dsv4::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// A run of text for the pre-tokenizer (id < 0) or one added token (id >= 0).
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

// Byte trie over token contents for leftmost-longest search.
class TokenTrie {
 public:
  void insert(std::string_view key, int32_t value);  // key is not empty; the first insert of a key wins
  bool empty() const { return nodes_.size() <= 1; }
  // The leftmost match starting at or after `pos`, longest among those at that start; false if none.
  bool find(std::string_view text, size_t pos, size_t& begin, size_t& end, int32_t& value) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;  // sorted by byte
    int32_t value = -1;
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_byte_{};  // bytes that start some key
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer& normalizer);

  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Splits `text` into segments. With allow_special = false, tokens marked special are not matched (their
  // text is tokenized as ordinary text); non-special added tokens still are, as in `tokenizers`.
  void split(std::string_view text, const Normalizer& normalizer, bool allow_special, std::vector<Segment>& out,
             std::deque<std::string>& arena) const;

 private:
  void find_in(std::string_view text, const TokenTrie& trie, bool allow_special, std::vector<Segment>& out) const;
  std::vector<AddedToken> tokens_;
  TokenTrie raw_, normalized_;  // values index tokens_
};

}  // namespace dsv4::tok
