// The BPE model of a tokenizer.json: vocabulary, ranked merges, and the merge loop that turns one
// pre-tokenized piece into ids.
//
// Merging follows `tokenizers`: start from one symbol per character (per byte for byte-level pieces), then
// repeatedly merge the adjacent pair with the lowest merge rank, the leftmost one among equal ranks, until
// no adjacent pair has a merge.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_util.h"

namespace dsv4::tok {

class BpeModel {
 public:
  BpeModel() = default;
  // `model` is the tokenizer.json "model" object; `where` names it in errors.
  static BpeModel from_json(const Json& model, const std::string& where);

  // Appends the ids of one piece. For a byte-level piece, `piece` holds raw bytes and each byte starts as
  // the symbol of its byte-level character; otherwise each UTF-8 character starts as its own symbol.
  void tokenize(std::string_view piece, bool byte_level, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the id has no token
  int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }

 private:
  struct MergeSlot {
    uint64_t key = kEmpty;  // (left id << 32) | right id
    int32_t rank = 0;
    int32_t merged = 0;
    static constexpr uint64_t kEmpty = ~uint64_t(0);
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged);
  const MergeSlot* find_merge(int32_t left, int32_t right) const;
  void merge_symbols(std::vector<int32_t>& symbols) const;
  void merge_symbols_heap(std::vector<int32_t>& symbols) const;
  void push_unknown(std::string_view ch, std::vector<int32_t>& symbols, bool& previous_unknown) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> has_token_;
  std::vector<MergeSlot> merges_;  // open addressing, power-of-two size
  uint64_t merge_mask_ = 0;
  std::vector<int32_t> byte_symbol_;  // 256 entries: id of each byte's byte-level character, or -1
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> byte_fallback_id_;  // 256 entries: id of "<0xXX>", or -1
};

}  // namespace dsv4::tok
