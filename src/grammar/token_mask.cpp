// The vocabulary trie and the mask walk (a preorder scan that skips refused or bulk-accepted subtrees).
#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>

namespace dsv4::grammar {

namespace {

// Whether a token's bytes are plain text from a character boundary (see plain_text_budget): no `"` `\` `<` or
// control character, and UTF-8 that is valid as far as it goes.
bool plain_text(std::string_view bytes) {
  uint8_t utf8 = 0;
  for (const char c : bytes) {
    const uint8_t b = uint8_t(c);
    if (b < 0x20 || b == '"' || b == '\\' || b == '<' || utf8_step(utf8, b) < 0) return false;
  }
  return true;
}

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> bytes, const std::vector<bool>& special, int32_t eos)
    : bytes_(std::move(bytes)), eos_(eos), special_(special) {
  DSV4_CHECK(special_.size() == bytes_.size(), "grammar vocabulary: ", special_.size(), " special flags for ",
             bytes_.size(), " tokens");
  DSV4_CHECK(eos >= 0 && eos < size(), "grammar vocabulary: the end-of-sentence id ", eos, " is outside it");
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id)
    if (!special_[size_t(id)] && !bytes_[size_t(id)].empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });

  // Preorder construction from the sorted strings: `path` holds the open nodes of the current prefix; a node is
  // closed (its subtree's end and plainness final) when a string no longer shares it.
  plain_.assign(kShortText + 2, std::vector<uint32_t>(size_t(words()), 0));
  no_angle_.assign(size_t(words()), 0);
  std::vector<uint32_t> path;
  const auto close = [&] {
    Node& n = nodes_[path.back()];
    n.end = uint32_t(nodes_.size());
    path.pop_back();
    if (path.empty()) return;
    Node& parent = nodes_[path.back()];
    parent.plain &= n.plain;
  };
  std::string_view previous;
  for (const int32_t id : order) {
    const std::string_view s = bytes_[size_t(id)];
    size_t common = 0;
    while (common < std::min(s.size(), previous.size()) && s[common] == previous[common] && common < path.size())
      ++common;
    while (path.size() > common) close();
    for (size_t d = path.size(); d < s.size(); ++d) {
      Node n;
      n.tokens = uint32_t(ids_.size());
      n.depth = uint16_t(d + 1);
      n.byte = uint8_t(s[d]);
      n.chars = uint16_t((path.empty() ? 0 : nodes_[path.back()].chars) + ((n.byte & 0xC0) != 0x80));
      n.plain = kPlainText | kNoAngle;
      path.push_back(uint32_t(nodes_.size()));
      nodes_.push_back(n);
    }
    Node& leaf = nodes_[path.back()];
    ++leaf.own;
    const uint32_t bit = 1u << (id & 31);
    if (plain_text(s)) {
      for (uint32_t up_to = std::min<uint32_t>(leaf.chars, kShortText + 1); up_to <= kShortText + 1; ++up_to)
        plain_[up_to][size_t(id >> 5)] |= bit;
      if (leaf.chars > kShortText) long_plain_.push_back(uint32_t(ids_.size()));
    } else {
      leaf.plain &= uint8_t(~kPlainText);
    }
    if (s.find('<') == std::string_view::npos) no_angle_[size_t(id >> 5)] |= bit;
    else leaf.plain &= uint8_t(~kNoAngle);
    ids_.push_back(id);
    chars_.push_back(leaf.chars);
    max_depth_ = std::max(max_depth_, s.size());
    previous = s;
  }
  while (!path.empty()) close();
}

int64_t Vocabulary::fill_mask(const Grammar& g, const State& state, std::vector<State>& scratch,
                              std::span<uint32_t> bits) const {
  DSV4_ASSERT(bits.size() == size_t(words()));
  const auto allow = [&](uint32_t i) { bits[size_t(ids_[i] >> 5)] |= 1u << (ids_[i] & 31); };
  // Inside a string every plain-text token that fits is allowed, in free reasoning every token without '<': the
  // mask starts from that set and the walk skips the subtrees made of such tokens.
  const int64_t start_budget = plain_text_budget(g, state);
  const uint8_t preset = start_budget >= 0 ? kPlainText : in_free_reasoning(state) ? kNoAngle : 0;
  if (preset == kPlainText) {
    const auto& fitting = plain_[size_t(std::min<int64_t>(start_budget, kShortText + 1))];
    std::copy(fitting.begin(), fitting.end(), bits.begin());
    if (start_budget > kShortText && start_budget != kUnbounded)  // the long tokens that still fit
      for (uint32_t t : long_plain_)
        if (chars_[t] > start_budget) bits[size_t(ids_[t] >> 5)] &= ~(1u << (ids_[t] & 31));
  } else if (preset == kNoAngle) {
    std::copy(no_angle_.begin(), no_angle_.end(), bits.begin());
  } else {
    std::fill(bits.begin(), bits.end(), 0u);
  }

  // Per depth: the walk's state after that many bytes, its plain-text budget and whether it is free reasoning.
  scratch.resize(max_depth_ + 1);
  std::vector<int64_t> budget(max_depth_ + 1);
  std::vector<uint8_t> free(max_depth_ + 1);
  copy_state(scratch[0], state);
  budget[0] = start_budget;
  free[0] = in_free_reasoning(state);
  for (size_t i = 0; i < nodes_.size();) {
    const Node& n = nodes_[i];
    const size_t d = n.depth;
    const uint32_t subtree_end = n.end < nodes_.size() ? nodes_[n.end].tokens : uint32_t(ids_.size());
    if (n.plain & preset) {
      i = n.end;
      continue;
    }
    if ((n.plain & kPlainText) && budget[d - 1] >= 0) {
      // Plain text from here on: a token is allowed when the characters it starts past the prefix fit.
      const uint32_t before = n.chars - ((n.byte & 0xC0) != 0x80);
      for (uint32_t t = n.tokens; t < subtree_end; ++t)
        if (chars_[t] - before <= budget[d - 1]) allow(t);
      i = n.end;
      continue;
    }
    if ((n.plain & kNoAngle) && free[d - 1]) {
      for (uint32_t t = n.tokens; t < subtree_end; ++t) allow(t);
      i = n.end;
      continue;
    }
    State& s = scratch[d];
    copy_state(s, scratch[d - 1]);
    if (!advance(g, s, n.byte)) {
      i = n.end;
      continue;
    }
    budget[d] = plain_text_budget(g, s);
    free[d] = in_free_reasoning(s);
    for (uint32_t t = n.tokens; t < n.tokens + n.own; ++t) allow(t);
    ++i;
  }
  if (can_end(g, state)) bits[size_t(eos_ >> 5)] |= 1u << (eos_ & 31);
  int64_t allowed = 0;
  for (const uint32_t word : bits) allowed += std::popcount(word);
  return allowed;
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocabulary)
    : matcher_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {}

int64_t TokenConstraint::allowed(std::span<uint32_t> bits) {
  return vocabulary_->fill_mask(matcher_.grammar(), matcher_.state(), scratch_, bits);
}

bool TokenConstraint::accept(int32_t token) {
  const Vocabulary& v = *vocabulary_;
  if (token < 0 || token >= v.size()) return false;
  if (token == v.eos()) return matcher_.can_end();
  if (v.special(token) || v.bytes(token).empty()) return false;
  return matcher_.feed(v.bytes(token));
}

}  // namespace dsv4::grammar
