// PCRE2 wrapper for the tokenizer's split patterns. Hugging Face `tokenizers` compiles its patterns with
// Oniguruma (Ruby syntax); this wrapper translates the few escapes whose meaning differs in PCRE2 so that
// both engines match the same characters (see translate_oniguruma).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv4::tok {

// Rewrites an Oniguruma pattern into an equivalent PCRE2 (UTF + UCP) pattern:
//   \s \S  -> \p{White_Space} / \P{White_Space}   (PCRE2's \s also matches U+180E, Oniguruma's does not)
//   \w \W  -> Oniguruma's word characters: Alphabetic, marks, decimal digits, connector punctuation
//            (plus ² ³ ¹ ¼ ½ ¾, an Oniguruma quirk)
//   \h \H  -> hexadecimal digit / not one (in Oniguruma \h is not horizontal space)
//   \uHHHH -> \x{HHHH}
//   [:alpha:] [:digit:] [:space:] [:alnum:] [:xdigit:] [:word:] -> their Unicode properties (others rejected)
// Nested character classes (an Oniguruma extension) are rejected. `where` names the pattern in errors.
std::string translate_oniguruma(std::string_view pattern, const std::string& where);

class Regex {
 public:
  // kOniguruma: a tokenizer.json pattern (translated); kLiteral: a plain string; kPcre2: used as is.
  enum class Syntax { kOniguruma, kLiteral, kPcre2 };

  // Compiles with PCRE2_UTF | PCRE2_UCP (| PCRE2_MULTILINE, as ^ and $ are line anchors in Oniguruma)
  // and JIT-compiles when available. Throws Error naming `where` on a bad pattern.
  Regex(std::string_view pattern, Syntax syntax, const std::string& where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match at or after `start`; returns false when there is none. `subject` must be valid
  // UTF-8 and `start` a character boundary.
  bool search(std::string_view subject, size_t start, size_t& match_begin, size_t& match_end) const;

  // All matches, in order, as Oniguruma's iterator reports them: an empty match right where the previous
  // match ended is skipped by advancing one character.
  template <class Fn>
  void for_each_match(std::string_view subject, Fn&& fn) const {
    size_t pos = 0, begin = 0, end = 0;
    bool has_last = false;
    size_t last_end = 0;
    while (pos <= subject.size() && search(subject, pos, begin, end)) {
      if (begin == end && has_last && last_end == end) {
        if (pos >= subject.size()) break;
        pos += next_char_length(subject, pos);
        continue;
      }
      fn(begin, end);
      pos = end;
      has_last = true;
      last_end = end;
    }
  }

 private:
  static size_t next_char_length(std::string_view s, size_t pos);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::tok
