// Added-token matching: a byte trie searched leftmost-longest, then the single_word / lstrip / rstrip rules.
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace dsv4::tok {

namespace {

// Character tests at a given byte offset. `tokenizers` uses Rust's regex crate here, not Oniguruma: its \w is
// Unicode's word class (Alphabetic, marks, decimal digits, connector punctuation, joiners) and \s is
// White_Space.
const Regex& word_char_at() {
  static const Regex r(R"(\G[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])", Regex::Syntax::kPcre2,
                       "added-token word test");
  return r;
}
const Regex& spaces_at() {
  static const Regex r(R"(\G\p{White_Space}*)", Regex::Syntax::kPcre2, "added-token whitespace test");
  return r;
}
const Regex& space_char_at() {
  static const Regex r(R"(\G\p{White_Space})", Regex::Syntax::kPcre2, "added-token whitespace test");
  return r;
}

bool matches_at(const Regex& r, std::string_view text, size_t pos) {
  size_t b = 0, e = 0;
  return r.search(text, pos, b, e);
}

// Start of the whitespace run that ends at `end`.
size_t whitespace_run_start(std::string_view text, size_t end) {
  while (end > 0) {
    const size_t prev = utf8_previous(text, end);
    if (!matches_at(space_char_at(), text, prev)) break;
    end = prev;
  }
  return end;
}

}  // namespace

void TokenTrie::insert(std::string_view key, int32_t value) {
  int32_t node = 0;
  for (char c : key) {
    const auto byte = static_cast<uint8_t>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = int32_t(nodes_.size());
      auto& edges = nodes_[node].edges;
      edges.insert(std::lower_bound(edges.begin(), edges.end(), std::make_pair(byte, int32_t(-1))),
                   std::make_pair(byte, next));
      nodes_.emplace_back();
    }
    node = next;
  }
  if (nodes_[node].value < 0) nodes_[node].value = value;
  first_byte_[static_cast<uint8_t>(key.front())] = true;
}

int32_t TokenTrie::child(int32_t node, uint8_t byte) const {
  for (const auto& [b, next] : nodes_[node].edges)
    if (b == byte) return next;
  return -1;
}

bool TokenTrie::find(std::string_view text, size_t pos, size_t& begin, size_t& end, int32_t& value) const {
  for (size_t i = pos; i < text.size(); ++i) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      if (nodes_[node].value >= 0) {
        best = nodes_[node].value;
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      begin = i;
      end = best_end;
      value = best;
      return true;
    }
  }
  return false;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer& normalizer)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty()) continue;
    if (!t.normalized) {
      raw_.insert(t.content, int32_t(i));
    } else {
      const std::string key = normalizer.apply(t.content);
      if (!key.empty()) normalized_.insert(key, int32_t(i));
    }
  }
}

void AddedVocabulary::find_in(std::string_view text, const TokenTrie& trie, bool allow_special,
                              std::vector<Segment>& out) const {
  size_t start_offset = 0, pos = 0, b = 0, e = 0;
  int32_t index = -1;
  while (!trie.empty() && trie.find(text, pos, b, e, index)) {
    pos = e;  // the search resumes after the match even when the match is then discarded
    const AddedToken& t = tokens_[index];
    if (t.special && !allow_special) continue;
    if (t.single_word) {
      const bool space_before = b == 0 || !matches_at(word_char_at(), text, utf8_previous(text, b));
      const bool space_after = e == text.size() || !matches_at(word_char_at(), text, e);
      if (!space_before || !space_after) continue;
    }
    if (t.lstrip) b = std::max(whitespace_run_start(text, b), start_offset);
    if (t.rstrip) {
      size_t sb = 0, se = e;
      spaces_at().search(text, e, sb, se);
      e = se;
    }
    if (start_offset < b) out.push_back({text.substr(start_offset, b - start_offset), -1});
    out.push_back({text.substr(b, e - b), t.id});
    start_offset = e;
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1});
}

void AddedVocabulary::split(std::string_view text, const Normalizer& normalizer, bool allow_special,
                            std::vector<Segment>& out, std::deque<std::string>& arena) const {
  thread_local std::vector<Segment> first;
  first.clear();
  find_in(text, raw_, allow_special, first);
  for (const Segment& s : first) {
    if (s.id >= 0) {
      out.push_back(s);
      continue;
    }
    std::string_view piece = s.text;
    if (!normalizer.is_identity()) {
      arena.push_back(normalizer.apply(piece));
      piece = arena.back();
    }
    find_in(piece, normalized_, allow_special, out);
  }
}

}  // namespace dsv4::tok
