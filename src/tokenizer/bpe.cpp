// BPE model: loading (vocab, merges in "a b" or ["a", "b"] form) and the merge loop.
#include "tokenizer/bpe.h"

#include <climits>
#include <cstdio>
#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace dsv4::tok {

namespace {

// Pieces longer than this many symbols use the heap-based merge loop; shorter ones scan a rank array,
// which is faster for the short words that dominate real text. Both give the same result.
constexpr size_t kHeapThreshold = 48;

constexpr uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

bool null_or_empty(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

}  // namespace

BpeModel BpeModel::from_json(const Json& model, const std::string& where) {
  DSV4_CHECK(model.is_object(), where, ": expected a JSON object");
  const auto type_it = model.find("type");
  const std::string type = type_it != model.end() && type_it->is_string() ? type_it->get<std::string>() : "";
  DSV4_CHECK(type == "BPE", where, ".type: unsupported model type '", type, "' (only BPE is supported)");
  const auto dropout = model.find("dropout");
  DSV4_CHECK(dropout == model.end() || dropout->is_null() || (dropout->is_number() && dropout->get<double>() == 0.0),
             where, ".dropout: BPE dropout is not supported for inference");
  DSV4_CHECK(null_or_empty(model, "continuing_subword_prefix"), where,
             ".continuing_subword_prefix: not supported (byte-level BPE does not use it)");
  DSV4_CHECK(null_or_empty(model, "end_of_word_suffix"), where,
             ".end_of_word_suffix: not supported (byte-level BPE does not use it)");

  BpeModel m;
  m.fuse_unk_ = bool_field(model, "fuse_unk", where, false);
  m.byte_fallback_ = bool_field(model, "byte_fallback", where, false);
  m.ignore_merges_ = bool_field(model, "ignore_merges", where, false);

  const Json& vocab = field(model, "vocab", where);
  DSV4_CHECK(vocab.is_object(), where, ".vocab: expected an object {token: id}");
  m.vocab_.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    DSV4_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() < INT32_MAX, where,
               ".vocab[\"", it.key(), "\"]: expected a non-negative integer id");
    const int64_t id = it->get<int64_t>();
    m.vocab_.emplace(it.key(), int32_t(id));
    max_id = std::max(max_id, id);
  }
  m.id_to_token_.resize(size_t(max_id + 1));
  m.has_token_.assign(size_t(max_id + 1), 0);
  for (const auto& [token, id] : m.vocab_) {
    m.id_to_token_[id] = token;
    m.has_token_[id] = 1;
  }

  const auto unk = model.find("unk_token");
  if (unk != model.end() && !unk->is_null()) {
    DSV4_CHECK(unk->is_string(), where, ".unk_token: expected a string or null");
    m.unk_id_ = m.token_to_id(unk->get<std::string>());
    DSV4_CHECK(m.unk_id_.has_value(), where, ".unk_token: '", unk->get<std::string>(), "' is not in the vocabulary");
  }

  const Json& merges = field(model, "merges", where);
  DSV4_CHECK(merges.is_array(), where, ".merges: expected an array");
  size_t capacity = 1024;
  while (capacity < merges.size() * 2) capacity *= 2;
  m.merges_.assign(capacity, MergeSlot{});
  m.merge_mask_ = capacity - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& entry = merges[rank];
    std::string left, right;
    if (entry.is_string()) {
      const std::string text = entry.get<std::string>();
      const size_t space = text.find(' ');
      DSV4_CHECK(space != std::string::npos, where, ".merges[", rank, "]: '", text, "' is not of the form \"a b\"");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      DSV4_CHECK(entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string(), where,
                 ".merges[", rank, "]: expected \"a b\" or [\"a\", \"b\"]");
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    }
    const auto l = m.token_to_id(left), r = m.token_to_id(right), merged = m.token_to_id(left + right);
    DSV4_CHECK(l && r && merged, where, ".merges[", rank, "]: '", left, "' + '", right,
               "' uses a token that is not in the vocabulary");
    m.add_merge(*l, *r, int32_t(rank), *merged);
  }

  const ByteAlphabet& alphabet = byte_alphabet();
  m.byte_symbol_.assign(256, -1);
  m.byte_fallback_id_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    if (const auto id = m.token_to_id(alphabet.utf8(uint8_t(b)))) m.byte_symbol_[b] = *id;
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (const auto id = m.token_to_id(name)) m.byte_fallback_id_[b] = *id;
  }
  return m;
}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  const uint64_t key = pair_key(left, right);
  size_t slot = size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & merge_mask_;
  while (merges_[slot].key != MergeSlot::kEmpty && merges_[slot].key != key) slot = (slot + 1) & merge_mask_;
  merges_[slot] = MergeSlot{key, rank, merged};  // a repeated pair keeps its last rank, as in `tokenizers`
}

const BpeModel::MergeSlot* BpeModel::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  size_t slot = size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & merge_mask_;
  while (true) {
    const MergeSlot& s = merges_[slot];
    if (s.key == key) return &s;
    if (s.key == MergeSlot::kEmpty) return nullptr;
    slot = (slot + 1) & merge_mask_;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::push_unknown(std::string_view ch, std::vector<int32_t>& symbols, bool& previous_unknown) const {
  if (byte_fallback_) {
    bool all = true;
    for (char c : ch) all = all && byte_fallback_id_[static_cast<uint8_t>(c)] >= 0;
    if (all) {
      for (char c : ch) symbols.push_back(byte_fallback_id_[static_cast<uint8_t>(c)]);
      previous_unknown = false;
      return;
    }
  }
  if (!unk_id_) return;  // no unknown token: the character is dropped, as in `tokenizers`
  if (!(fuse_unk_ && previous_unknown)) symbols.push_back(*unk_id_);
  previous_unknown = true;
}

void BpeModel::tokenize(std::string_view piece, bool byte_level, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  const ByteAlphabet& alphabet = byte_alphabet();
  if (ignore_merges_) {
    const auto id = token_to_id(byte_level ? std::string_view(alphabet.encode(piece)) : piece);
    if (id) {
      out.push_back(*id);
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  bool previous_unknown = false;
  if (byte_level) {
    for (char c : piece) {
      const int32_t id = byte_symbol_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        symbols.push_back(id);
        previous_unknown = false;
      } else {
        push_unknown(alphabet.utf8(static_cast<uint8_t>(c)), symbols, previous_unknown);
      }
    }
  } else {
    for (size_t pos = 0; pos < piece.size();) {
      const size_t len = utf8_length(piece, pos);
      const std::string_view ch = piece.substr(pos, len);
      if (const auto id = token_to_id(ch)) {
        symbols.push_back(*id);
        previous_unknown = false;
      } else {
        push_unknown(ch, symbols, previous_unknown);
      }
      pos += len;
    }
  }
  if (symbols.size() > kHeapThreshold)
    merge_symbols_heap(symbols);
  else
    merge_symbols(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

// Short pieces: keep the rank of every adjacent pair in an array; each step merges the leftmost pair of
// lowest rank and refreshes the (at most two) pairs around it.
void BpeModel::merge_symbols(std::vector<int32_t>& symbols) const {
  if (symbols.size() < 2) return;
  thread_local std::vector<int32_t> rank, merged;
  rank.resize(symbols.size() - 1);
  merged.resize(symbols.size() - 1);
  const auto refresh = [&](size_t i) {
    const MergeSlot* m = find_merge(symbols[i], symbols[i + 1]);
    rank[i] = m ? m->rank : INT32_MAX;
    merged[i] = m ? m->merged : -1;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) refresh(i);
  while (!rank.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < rank.size(); ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT32_MAX) break;
    symbols[best] = merged[best];
    symbols.erase(symbols.begin() + std::ptrdiff_t(best) + 1);
    // Pairs: best-1 and best change; the old pair best+1 disappears.
    if (best + 1 < rank.size()) {
      rank.erase(rank.begin() + std::ptrdiff_t(best) + 1);
      merged.erase(merged.begin() + std::ptrdiff_t(best) + 1);
      refresh(best);
    } else {
      rank.pop_back();
      merged.pop_back();
    }
    if (best > 0) refresh(best - 1);
  }
}

// Long pieces: a doubly linked list of symbols and a min-heap of candidate pairs ordered by (rank,
// position). Entries are validated when popped, so stale ones are skipped.
void BpeModel::merge_symbols_heap(std::vector<int32_t>& symbols) const {
  const int32_t n = int32_t(symbols.size());
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto consider = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const MergeSlot* m = find_merge(symbols[pos], symbols[next[pos]]))
      heap.push({m->rank, pos, symbols[pos], symbols[next[pos]]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  std::vector<uint8_t> alive(n, 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || symbols[c.pos] != c.left) continue;
    const int32_t right = next[c.pos];
    if (right < 0 || symbols[right] != c.right) continue;
    symbols[c.pos] = find_merge(c.left, c.right)->merged;
    alive[right] = 0;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  int32_t out = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

}  // namespace dsv4::tok
