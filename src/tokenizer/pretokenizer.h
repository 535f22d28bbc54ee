// The text stages before the model: the normalizer and the pre-tokenizer of a tokenizer.json.
//
// Supported normalizers: Sequence, Replace (String or Regex pattern), Prepend, Strip.
// Supported pre-tokenizers: Sequence, Split (String or Regex pattern; every delimiter behaviour; invert)
// and ByteLevel (add_prefix_space, use_regex), which must come last. Anything else is rejected at load
// with an error naming the field, rather than silently tokenizing differently from the reference.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"

namespace dsv4::tok {

// Where the split pattern of a Split pre-tokenizer or Replace normalizer comes from.
Regex compile_pattern(const Json& pattern, const std::string& where);

class Normalizer {
 public:
  Normalizer() = default;  // the identity
  static Normalizer from_json(const Json& j, const std::string& where);  // j may be null

  bool is_identity() const { return steps_.empty(); }
  std::string apply(std::string_view text) const;

 private:
  enum class Kind { kReplace, kPrepend, kStrip };
  struct Step {
    Kind kind;
    std::optional<Regex> pattern;  // Replace only
    std::string text;              // Replace content / Prepend
    bool left = false, right = false;
  };
  void add(const Json& j, const std::string& where);
  std::vector<Step> steps_;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  PreTokenizer() = default;  // no pre-tokenizer: each segment is one piece
  static PreTokenizer from_json(const Json& j, const std::string& where);  // j may be null

  // Appends the pieces of `segment` to `pieces`. Pieces view `segment` or strings kept in `arena`.
  void split(std::string_view segment, std::vector<std::string_view>& pieces, std::deque<std::string>& arena) const;

  // True when the last step is ByteLevel: pieces are raw UTF-8 that the model sees byte by byte.
  bool byte_level() const { return byte_level_; }

 private:
  struct Step {
    std::optional<Regex> pattern;  // absent for ByteLevel with use_regex = false
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool prefix_space = false;  // ByteLevel add_prefix_space, applied before this step's split
  };
  void add(const Json& j, const std::string& where);
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace dsv4::tok
