// Normalizer and pre-tokenizer stages, following the semantics of Hugging Face `tokenizers`:
// a Split finds all pattern matches in a piece, labels the matches and the gaps between them, applies the
// delimiter behaviour, and drops empty pieces.
#include "tokenizer/pretokenizer.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4::tok {

namespace {

// GPT-2's pattern, used by ByteLevel when use_regex is true (Oniguruma syntax, translated like any other).
constexpr std::string_view kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Span {
  size_t begin, end;
  bool flag;  // is_match while labelling, then "remove"
};

// Labels `text` into matches and gaps (HF's Pattern::find_matches). Never empty for a non-empty text.
void label_matches(const Regex& regex, std::string_view text, bool invert, std::vector<Span>& spans) {
  spans.clear();
  size_t prev = 0;
  regex.for_each_match(text, [&](size_t b, size_t e) {
    if (prev != b) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  });
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});
}

// Turns labelled spans into (range, remove) according to the delimiter behaviour.
void apply_behavior(SplitBehavior behavior, std::vector<Span>& spans, std::vector<Span>& out) {
  out.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) out.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      out = spans;
      break;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.flag == previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back({s.begin, s.end, false});
        previous_match = s.flag;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.flag && !previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back({s.begin, s.end, false});
        previous_match = s.flag;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.flag && !previous_match && !out.empty())
          out.back().begin = s.begin;
        else
          out.push_back({s.begin, s.end, false});
        previous_match = s.flag;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
}

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail(cat(where, ".behavior: unknown split behaviour '", name,
           "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)"));
}

const Regex& leading_space() {
  static const Regex r(R"(\A\s+)", Regex::Syntax::kOniguruma, "Strip normalizer");
  return r;
}
const Regex& trailing_space() {
  static const Regex r(R"(\s+\z)", Regex::Syntax::kOniguruma, "Strip normalizer");
  return r;
}

}  // namespace

Regex compile_pattern(const Json& pattern, const std::string& where) {
  DSV4_CHECK(pattern.is_object() && pattern.size() == 1, where,
             ": expected {\"String\": ...} or {\"Regex\": ...}");
  if (pattern.contains("String")) {
    DSV4_CHECK(pattern["String"].is_string(), where, ".String: expected a string");
    return Regex(pattern["String"].get<std::string>(), Regex::Syntax::kLiteral, where);
  }
  if (pattern.contains("Regex")) {
    DSV4_CHECK(pattern["Regex"].is_string(), where, ".Regex: expected a string");
    return Regex(pattern["Regex"].get<std::string>(), Regex::Syntax::kOniguruma, where);
  }
  fail(cat(where, ": unknown pattern kind '", pattern.begin().key(), "' (expected String or Regex)"));
}

// ---------------------------------------------------------------------------------------------------------
// Normalizer

Normalizer Normalizer::from_json(const Json& j, const std::string& where) {
  Normalizer n;
  if (!j.is_null()) n.add(j, where);
  return n;
}

void Normalizer::add(const Json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    const Json& list = field(j, "normalizers", where);
    DSV4_CHECK(list.is_array(), where, ".normalizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], cat(where, ".normalizers[", i, "]"));
  } else if (type == "Replace") {
    Step s{Kind::kReplace, compile_pattern(field(j, "pattern", where), where + ".pattern"),
           string_field(j, "content", where)};
    steps_.push_back(std::move(s));
  } else if (type == "Prepend") {
    steps_.push_back(Step{Kind::kPrepend, std::nullopt, string_field(j, "prepend", where)});
  } else if (type == "Strip") {
    Step s{Kind::kStrip, std::nullopt, {}};
    s.left = bool_field(j, "strip_left", where, false);
    s.right = bool_field(j, "strip_right", where, false);
    steps_.push_back(std::move(s));
  } else {
    fail(cat(where, ": unsupported normalizer type '", type,
             "' (supported: Sequence, Replace, Prepend, Strip)"));
  }
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kReplace: {
        std::string out;
        size_t prev = 0;
        step.pattern->for_each_match(s, [&](size_t b, size_t e) {
          out.append(s, prev, b - prev);
          out += step.text;
          prev = e;
        });
        out.append(s, prev, std::string::npos);
        s = std::move(out);
        break;
      }
      case Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.text);
        break;
      case Kind::kStrip: {
        size_t b = 0, e = 0;
        if (step.right && trailing_space().search(s, 0, b, e)) s.resize(b);
        if (step.left && leading_space().search(s, 0, b, e)) s.erase(0, e);
        break;
      }
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------------
// PreTokenizer

PreTokenizer PreTokenizer::from_json(const Json& j, const std::string& where) {
  PreTokenizer p;
  if (!j.is_null()) p.add(j, where);
  return p;
}

void PreTokenizer::add(const Json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  DSV4_CHECK(!byte_level_, where, ": a ", type,
             " pre-tokenizer after ByteLevel is not supported (ByteLevel must be the last step)");
  if (type == "Sequence") {
    const Json& list = field(j, "pretokenizers", where);
    DSV4_CHECK(list.is_array(), where, ".pretokenizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], cat(where, ".pretokenizers[", i, "]"));
  } else if (type == "Split") {
    Step s;
    s.pattern = compile_pattern(field(j, "pattern", where), where + ".pattern");
    s.behavior = parse_behavior(string_field(j, "behavior", where), where);
    s.invert = bool_field(j, "invert", where, false);
    steps_.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    Step s;
    s.prefix_space = bool_field(j, "add_prefix_space", where, true);
    if (bool_field(j, "use_regex", where, true))
      s.pattern = Regex(kByteLevelPattern, Regex::Syntax::kOniguruma, where + " (GPT-2 pattern)");
    steps_.push_back(std::move(s));
    byte_level_ = true;
  } else {
    fail(cat(where, ": unsupported pre-tokenizer type '", type, "' (supported: Sequence, Split, ByteLevel)"));
  }
}

void PreTokenizer::split(std::string_view segment, std::vector<std::string_view>& pieces,
                         std::deque<std::string>& arena) const {
  if (segment.empty()) return;
  if (steps_.empty()) {
    pieces.push_back(segment);
    return;
  }
  thread_local std::vector<std::string_view> current, next;
  thread_local std::vector<Span> spans, kept;
  current.assign(1, segment);
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : current) {
      if (step.prefix_space && piece.front() != ' ') {
        std::string& prefixed = arena.emplace_back();
        prefixed.reserve(piece.size() + 1);
        prefixed += ' ';
        prefixed += piece;
        piece = prefixed;
      }
      if (!step.pattern) {
        next.push_back(piece);
        continue;
      }
      label_matches(*step.pattern, piece, step.invert, spans);
      apply_behavior(step.behavior, spans, kept);
      for (const Span& s : kept)
        if (!s.flag && s.end > s.begin) next.push_back(piece.substr(s.begin, s.end - s.begin));
    }
    current.swap(next);
  }
  pieces.insert(pieces.end(), current.begin(), current.end());
}

}  // namespace dsv4::tok
