// PCRE2 wrapper: Oniguruma-compatible translation, compilation with JIT, per-thread match scratch.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace dsv4::tok {

namespace {

// Oniguruma's Unicode word characters ([[:word:]]); measured against `tokenizers` over all code points.
constexpr std::string_view kWordProps = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
// NOTE: Oniguruma's \w outside a character class (not [[:word:]], not \w inside a class) also matches the
// Latin-1 digits and fractions ² ³ ¹ ¼ ½ ¾, from its single-byte ctype table; found by the same comparison.
constexpr std::string_view kLatin1WordExtras = "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";

// Members of an Oniguruma POSIX class (Unicode meanings), to be placed inside a PCRE2 character class.
std::string posix_class(std::string_view name, const std::string& where) {
  const bool negated = !name.empty() && name.front() == '^';
  if (negated) name.remove_prefix(1);
  std::string props;
  if (name == "alpha") props = "Alphabetic";
  else if (name == "digit") props = "Nd";
  else if (name == "space") props = "White_Space";
  if (!props.empty()) return (negated ? "\\P{" : "\\p{") + props + "}";
  if (!negated && name == "alnum") return "\\p{Alphabetic}\\p{Nd}";
  if (!negated && name == "xdigit") return "0-9A-Fa-f";
  if (!negated && name == "word") return std::string(kWordProps);
  fail(cat(where, ": POSIX class [:", negated ? "^" : "", name, ":] is not supported"));
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Match data (one ovector pair is all we read) and a JIT stack, one per thread: a Regex is shared by every
// thread that encodes with the same tokenizer.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    DSV4_CHECK(data && context && jit_stack, "tokenizer: out of memory creating regex match data");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

std::string translate_oniguruma(std::string_view pattern, const std::string& where) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  size_t class_start = 0;  // index of the first member of the current class (after '[' or '[^')
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      switch (e) {
        case 's': out += "\\p{White_Space}"; break;
        case 'S': out += "\\P{White_Space}"; break;
        case 'w':  // inside a class Oniguruma drops the Latin-1 extras
          out += in_class ? std::string(kWordProps)
                          : "[" + std::string(kWordProps) + std::string(kLatin1WordExtras) + "]";
          break;
        case 'W':
          DSV4_CHECK(!in_class, where, ": \\W inside a character class is not supported");
          out += "[^" + std::string(kWordProps) + std::string(kLatin1WordExtras) + "]";
          break;
        case 'h': out += in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]"; break;
        case 'H':
          DSV4_CHECK(!in_class, where, ": \\H inside a character class is not supported");
          out += "[^0-9A-Fa-f]";
          break;
        case 'u':  // Ruby's \uHHHH
          DSV4_CHECK(i + 4 < pattern.size(), where, ": incomplete \\u escape");
          out += "\\x{" + std::string(pattern.substr(i + 1, 4)) + "}";
          i += 4;
          break;
        default:
          out += '\\';
          out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[') {  // only a POSIX class such as [:alpha:] may appear inside a class
      const size_t close = pattern.find(":]", i + 2);
      DSV4_CHECK(i + 1 < pattern.size() && pattern[i + 1] == ':' && close != std::string_view::npos, where,
                 ": nested character classes (Oniguruma extension) are not supported");
      out += posix_class(pattern.substr(i + 2, close - i - 2), where);
      i = close + 1;
      continue;
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  std::string where;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, Syntax syntax, const std::string& where) : impl_(std::make_unique<Impl>()) {
  impl_->where = where;
  const std::string source =
      syntax == Syntax::kOniguruma ? translate_oniguruma(pattern, where) : std::string(pattern);
  const uint32_t options =
      syntax == Syntax::kLiteral ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE);
  DSV4_CHECK(find_invalid_utf8(source) == std::string_view::npos, where, ": pattern is not valid UTF-8");
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  DSV4_CHECK(context, "tokenizer: out of memory compiling ", where);
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options, &error, &offset,
                              context);
  pcre2_compile_context_free(context);
  DSV4_CHECK(impl_->code, where, ": cannot compile regex '", std::string(pattern), "': ", pcre2_message(error),
             " at offset ", offset);
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

bool Regex::search(std::string_view subject, size_t start, size_t& match_begin, size_t& match_end) const {
  MatchScratch& s = scratch();
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                             PCRE2_NO_UTF_CHECK, s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  DSV4_CHECK(rc >= 0, impl_->where, ": regex match failed: ", pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s.data);
  match_begin = ovector[0];
  match_end = ovector[1];
  return true;
}

size_t Regex::next_char_length(std::string_view s, size_t pos) { return utf8_length(s, pos); }

}  // namespace dsv4::tok
