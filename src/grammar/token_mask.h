// Constrained decoding, the token masks: which tokens of the vocabulary the matcher allows next, as a bit set of
// the vocabulary (bit id % 32 of word id / 32: the layout a GPU sampler can take as it is). The sampler sets the
// logits of the other tokens to -inf, so a token the grammar refuses is never drawn, greedy or sampled.
//
// A mask walks a trie of the vocabulary's byte strings with copies of the matcher state, so the tokens sharing a
// prefix are checked once and a refused prefix skips its whole subtree. Inside a string, subtrees whose tokens are
// all plain text (see plain_text_budget) are decided by their lengths without stepping through them, and a mask
// that starts inside a string (or in free reasoning) starts from the precomputed set of such tokens. Costs:
// docs/design/constrained-decoding.md.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/matcher.h"

namespace dsv4::grammar {

// The vocabulary as the grammar sees it: each token's bytes, in a trie. Immutable; shared by every sequence.
class Vocabulary {
 public:
  // bytes[id]: the bytes token id stands for (empty: an id without a token, never allowed); special[id]: a
  // control token (never allowed, but `eos` where the answer may end).
  Vocabulary(std::vector<std::string> bytes, const std::vector<bool>& special, int32_t eos);

  int32_t size() const { return int32_t(bytes_.size()); }
  int32_t words() const { return (size() + 31) / 32; }  // of a mask
  int32_t eos() const { return eos_; }
  std::string_view bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool special(int32_t id) const { return special_[size_t(id)]; }

  // Fills `bits` ([words()]) with the tokens allowed in `state`; returns how many. `scratch` holds the walk's
  // states (one per trie depth; reused between calls).
  int64_t fill_mask(const Grammar& g, const State& state, std::vector<State>& scratch,
                    std::span<uint32_t> bits) const;

 private:
  // Nodes in preorder: a node's subtree is [i, end); its tokens, and those of its subtree, are consecutive in
  // ids_ from `tokens`.
  struct Node {
    uint32_t end = 0;
    uint32_t tokens = 0;     // first of the node's own tokens in ids_ (then its subtree's)
    uint32_t own = 0;        // how many tokens end at this node
    uint16_t depth = 0;      // bytes from the root (1 for a token's first byte)
    uint16_t chars = 0;      // characters started on the path from the root, this byte included
    uint8_t byte = 0;
    uint8_t plain = 0;       // kPlainText / kNoAngle: every token in the subtree is of that kind
  };
  static constexpr uint8_t kPlainText = 1, kNoAngle = 2;

  std::vector<std::string> bytes_;
  int32_t eos_;
  std::vector<bool> special_;
  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;       // token ids in trie order
  std::vector<uint16_t> chars_;    // per ids_ entry: the characters the token starts
  // Masks of the kPlainText tokens that start at most 0, 1, ..., kShortText characters (a string with that many
  // left), then of all of them; the positions in ids_ of the longer ones; the mask of the kNoAngle tokens.
  static constexpr uint32_t kShortText = 16;
  std::vector<std::vector<uint32_t>> plain_;
  std::vector<uint32_t> long_plain_;
  std::vector<uint32_t> no_angle_;
  size_t max_depth_ = 0;
};

// One sequence's constraint: its matcher state and what the vocabulary allows next.
class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocabulary);

  // The tokens allowed next ([vocabulary().words()] bits); returns how many (0: none, which a grammar never
  // leaves unless its nesting limit is reached).
  int64_t allowed(std::span<uint32_t> bits);
  // Advances by one token; false (and unchanged) if the grammar does not allow it. The end-of-sentence token is
  // allowed where the answer may end and leaves the state as it is.
  bool accept(int32_t token);
  // Advances by text already written (an assistant prefix the answer continues); false (unchanged) if refused.
  bool accept_text(std::string_view text) { return matcher_.feed(text); }
  const Vocabulary& vocabulary() const { return *vocabulary_; }

 private:
  Matcher matcher_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  std::vector<State> scratch_;
};

}  // namespace dsv4::grammar
