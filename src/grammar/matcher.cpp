// The matcher's byte step: each frame kind is a small state machine; a frame that needs a child value pushes it
// and hands it the byte, a finished frame pops and tells its parent (finish_child). Values whose end is only
// known from the next byte (numbers, enum values such as 1 and 12) pop and hand that byte back to the parent.
#include "grammar/matcher.h"

#include <algorithm>
#include <cstring>
#include <optional>

namespace dsv4::grammar {

namespace {

// What a frame did with a byte.
enum class Step : uint8_t {
  kReject,
  kStay,       // consumed
  kDone,       // consumed, and the frame is complete
  kDoneRetry,  // the frame was complete before this byte, which goes to the parent
  kPush,       // a child frame was pushed and gets the byte
};

// Phases, per frame kind.
enum RootPhase : uint8_t { kReason, kAnswer, kJsonPending, kMenuPending, kCall, kInvokePending, kNext, kEnd };
enum ObjectPhase : uint8_t { kObjOpen, kObjFirstKey, kObjKey, kObjKeyPending, kObjColon, kObjValue, kObjValuePending,
                             kObjAfterValue };
enum KeyPhase : uint8_t { kKeyOpen, kKeyMatch, kKeyFree };
enum ArrayPhase : uint8_t { kArrOpen, kArrFirst, kArrItem, kArrItemPending, kArrAfterItem };
enum StringPhase : uint8_t { kStrOpen, kStrContent, kStrEscape, kU0, kU1, kU1D, kU2, kU3, kU2H, kU3H, kLowBackslash,
                             kLowU, kL0, kL1, kL2, kL3, kRawTerminator };
enum NumberPhase : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign,
                             kNumExpDigits };
enum InvokePhase : uint8_t { kInvMenu, kInvMenuPending, kInvRaw, kInvRawPending, kInvJson, kInvJsonPending,
                             kInvNewline, kInvClose, kInvClosePending };

constexpr uint16_t kAdditionalKey = kNone;  // kKey result: a property outside `properties`

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

// "<｜" and "</｜" inside text: 1 '<', 2 '</', 3 '<' EF, 4 '</' EF, 5 '<' EF BD, 6 '</' EF BD. A JSON string
// refuses both; a raw DSML value ends at "</｜" (the start of </｜DSML｜parameter>).
constexpr uint8_t kGuardForbidden = 7, kGuardTerminator = 8;
uint8_t guard_next(uint8_t g, uint8_t b) {
  switch (g) {
    case 1: return b == '/' ? 2 : b == 0xEF ? 3 : b == '<' ? 1 : 0;
    case 2: return b == 0xEF ? 4 : b == '<' ? 1 : 0;
    case 3: return b == 0xBD ? 5 : 0;
    case 4: return b == 0xBD ? 6 : 0;
    case 5: return b == 0x9C ? kGuardForbidden : 0;
    case 6: return b == 0x9C ? kGuardTerminator : 0;
    default: return b == '<' ? 1 : 0;
  }
}
// Characters a raw value holds back while they may still be the closing tag ('<', '/').
constexpr uint32_t kGuardHeld[] = {0, 1, 2, 1, 2, 1, 2};
bool guard_extends(uint8_t from, uint8_t to) {
  return (from == 1 && to == 2) || (from >= 1 && from <= 4 && to == from + 2);
}

// A string's count after one more character: saturates at the largest bound that still matters.
bool count_char(Frame& f, const Node& n, uint32_t chars = 1) {
  if (uint64_t(f.count) + chars > n.max) return false;
  const uint32_t cap = n.max == kUnbounded ? n.min : n.max;
  f.count = std::min<uint32_t>(f.count + chars, cap);
  return true;
}

Step push(State& s, Frame f) {
  if (s.depth == kMaxFrames) return Step::kReject;
  s.frames[s.depth++] = f;
  return Step::kPush;
}

Step push_menu(State& s, const Grammar& g, uint16_t set) {
  Frame f;
  f.kind = FrameKind::kMenu;
  f.node = set;
  f.hi = uint16_t(g.sets[set].items.size());
  return push(s, f);
}

// A value of `node` starting with byte b.
Step push_value(State& s, const Grammar& g, uint16_t id, uint8_t b) {
  const Node* n = &g.nodes[id];
  if (!n->first[b]) return Step::kReject;
  if (n->kind == NodeKind::kUnion) {  // flattened: the alternative is the one that starts with b
    for (uint16_t alt : n->alternatives) {
      if (g.nodes[alt].first[b]) {
        id = alt;
        break;
      }
    }
    n = &g.nodes[id];
  }
  if (n->kind == NodeKind::kLiterals) return push_menu(s, g, n->set);
  Frame f;
  f.node = id;
  switch (n->kind) {
    case NodeKind::kString: f.kind = FrameKind::kString; break;
    case NodeKind::kRawString: f.kind = FrameKind::kRawString, f.phase = kStrContent; break;
    case NodeKind::kNumber: f.kind = FrameKind::kNumber; break;
    case NodeKind::kObject: f.kind = FrameKind::kObject; break;
    case NodeKind::kArray: f.kind = FrameKind::kArray; break;
    case NodeKind::kInvoke: f.kind = FrameKind::kInvoke; break;
    default: return Step::kReject;
  }
  return push(s, f);
}

// kMenu: whether item i may be chosen (a gated menu asks its kInvoke parent).
bool menu_item_open(const Grammar& g, const State& s, int at, const LiteralSet& set, uint16_t i) {
  if (!set.gated) return true;
  const Frame& parent = s.frames[at - 1];
  const Node& invoke = g.nodes[parent.node];
  const uint32_t v = set.values[i];
  const bool required_done = (invoke.required & ~parent.seen) == 0;
  if (v == kCloseInvoke) return parent.count > 0 && required_done;
  if (v == kCloseEmptyInvoke) return parent.count == 0 && required_done;
  return !((parent.seen >> (v >> 1)) & 1);
}

bool any_open(const Grammar& g, const State& s, int at, const LiteralSet& set, uint16_t lo, uint16_t hi) {
  for (uint16_t i = lo; i < hi; ++i)
    if (menu_item_open(g, s, at, set, i)) return true;
  return false;
}

// The items of [lo, hi) (sharing their first `pos` bytes) whose byte `pos` is b.
std::pair<uint16_t, uint16_t> narrow(const std::vector<std::string>& items, uint16_t lo, uint16_t hi, uint32_t pos,
                                     uint8_t b) {
  const auto at = [&](uint16_t i) { return items[i].size() > pos ? int(uint8_t(items[i][pos])) : -1; };
  uint16_t first = lo, last = hi;
  for (uint16_t step = uint16_t(hi - lo); step > 0;) {  // first item with at() >= b
    const uint16_t half = step / 2;
    if (at(uint16_t(first + half)) < b) first = uint16_t(first + half + 1), step = uint16_t(step - half - 1);
    else step = half;
  }
  last = first;
  while (last < hi && at(last) == b) ++last;
  return {first, last};
}

bool menu_exact(const Grammar& g, const State& s, int at) {
  const Frame& f = s.frames[at];
  const LiteralSet& set = g.sets[f.node];
  return f.lo < f.hi && set.items[f.lo].size() == f.count && menu_item_open(g, s, at, set, f.lo);
}

Step step_menu(const Grammar& g, State& s, int at, uint8_t b) {
  Frame& f = s.frames[at];
  const LiteralSet& set = g.sets[f.node];
  const auto [lo, hi] = narrow(set.items, f.lo, f.hi, f.count, b);
  if (lo < hi && any_open(g, s, at, set, lo, hi)) {
    f.lo = lo, f.hi = hi, ++f.count;
    // Complete when the exact item is the only open one left (no longer item can follow).
    if (set.items[lo].size() == f.count && menu_item_open(g, s, at, set, lo) &&
        !any_open(g, s, at, set, uint16_t(lo + 1), hi))
      return Step::kDone;
    return Step::kStay;
  }
  return menu_exact(g, s, at) ? Step::kDoneRetry : Step::kReject;
}

// A byte of text inside a JSON string or key (not '"', not '\'): UTF-8, no control characters, no "<｜".
bool json_text_byte(Frame& f, uint8_t b, bool& completes) {
  if (b < 0x20) return false;
  const int r = utf8_step(f.utf8, b);
  if (r < 0) return false;
  f.guard = guard_next(f.guard, b);
  if (f.guard >= kGuardForbidden) return false;
  completes = r == 1;
  return true;
}

Step step_string(const Grammar& g, Frame& f, uint8_t b) {
  const Node& n = g.nodes[f.node];
  const auto to = [&](uint8_t phase) {
    f.phase = phase;
    return Step::kStay;
  };
  switch (f.phase) {
    case kStrOpen: return b == '"' ? to(kStrContent) : Step::kReject;
    case kStrContent: {
      if (b == '"') return f.utf8 == 0 && f.count >= n.min ? Step::kDone : Step::kReject;
      if (b == '\\') {
        if (f.utf8 != 0 || uint64_t(f.count) + 1 > n.max) return Step::kReject;
        f.guard = 0;
        return to(kStrEscape);
      }
      // A character that starts here must fit (a multi-byte one is counted when it completes).
      if (f.utf8 == 0 && uint64_t(f.count) + 1 > n.max) return Step::kReject;
      bool completes = false;
      if (!json_text_byte(f, b, completes)) return Step::kReject;
      return !completes || count_char(f, n) ? Step::kStay : Step::kReject;
    }
    case kStrEscape:
      if (b == 'u') return to(kU0);
      if (b == 0 || !std::strchr("\"\\/bfnrt", b)) return Step::kReject;
      f.phase = kStrContent;
      return count_char(f, n) ? Step::kStay : Step::kReject;
    default: break;
  }
  // \uXXXX: \uD800-\uDBFF must be followed by \uDC00-\uDFFF (a surrogate pair, one character); a lone
  // \uDC00-\uDFFF is not a character.
  if (f.phase == kLowBackslash) return b == '\\' ? to(kLowU) : Step::kReject;
  if (f.phase == kLowU) return b == 'u' ? to(kL0) : Step::kReject;
  if (f.phase == kL0) return b == 'd' || b == 'D' ? to(kL1) : Step::kReject;
  if (f.phase == kL1) return (b >= 'c' && b <= 'f') || (b >= 'C' && b <= 'F') ? to(kL2) : Step::kReject;
  if (!is_hex(b)) return Step::kReject;
  switch (f.phase) {
    case kU0: return to(b == 'd' || b == 'D' ? kU1D : kU1);
    case kU1D:
      if (is_digit(b)) return to(b >= '8' ? kU2H : kU2);
      return (b >= 'a' && b <= 'b') || (b >= 'A' && b <= 'B') ? to(kU2H) : Step::kReject;
    case kU1: return to(kU2);
    case kU2: return to(kU3);
    case kU2H: return to(kU3H);
    case kU3H: return to(kLowBackslash);
    case kL2: return to(kL3);
    case kU3:
    case kL3: f.phase = kStrContent; return count_char(f, n) ? Step::kStay : Step::kReject;
    default: return Step::kReject;
  }
}

// Whether a raw value with `count` characters, guard state g and `partial` (a character begun) can still reach
// its closing tag within its bounds: a character begun must fit, and so must the held '<' / '/' it releases,
// unless it may still become the tag (then only min must be met).
bool raw_viable(const Node& n, uint32_t count, uint8_t g, bool partial) {
  const uint64_t c = count;
  switch (g) {
    case 0: return !partial || c + 1 <= n.max;
    case 1: return true;  // '<' alone: "/｜..." closes, or it is text (c < min <= max leaves room for it)
    case 2: return c >= n.min || c + 2 <= n.max;
    case 3:
    case 5: return c + 2 <= n.max;  // "<｜" is refused, so the character is text
    default: return c >= n.min || c + 3 <= n.max;
  }
}

// A DSML string="true" value: raw text (tabs and newlines allowed), ended by </｜DSML｜parameter>. The '<' and
// '/' that may start the closing tag are counted only once they turn out to be text.
Step step_raw_string(const Grammar& g, Frame& f, uint8_t b) {
  static constexpr std::string_view kRest = kDsmlParameterClose.substr(std::string_view("</｜").size());
  const Node& n = g.nodes[f.node];
  if (f.phase == kRawTerminator) {
    if (b != uint8_t(kRest[f.lo])) return Step::kReject;
    return ++f.lo == kRest.size() ? Step::kDone : Step::kStay;
  }
  if (b < 0x20 && b != '\t' && b != '\n' && b != '\r') return Step::kReject;
  const int r = utf8_step(f.utf8, b);
  if (r < 0) return Step::kReject;
  const uint8_t before = f.guard;
  f.guard = guard_next(before, b);
  if (f.guard == kGuardForbidden) return Step::kReject;
  if (f.guard == kGuardTerminator) {
    if (f.count < n.min) return Step::kReject;
    f.phase = kRawTerminator;
    f.lo = 0;
    return Step::kStay;
  }
  uint32_t chars = 0;
  if (!guard_extends(before, f.guard)) chars += kGuardHeld[before];  // no longer a possible tag
  if (r == 1 && f.guard != 1 && f.guard != 2) chars += 1;           // this character, unless held
  if (chars > 0 && !count_char(f, n, chars)) return Step::kReject;
  return raw_viable(n, f.count, f.guard, f.utf8 != 0) ? Step::kStay : Step::kReject;
}

Step step_number(const Grammar& g, Frame& f, uint8_t b) {
  const bool integer = g.nodes[f.node].integer;
  const bool accepting = f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExpDigits;
  int next = -1;
  switch (f.phase) {
    case kNumStart: next = b == '-' ? kNumMinus : b == '0' ? kNumZero : is_digit(b) ? kNumInt : -1; break;
    case kNumMinus: next = b == '0' ? kNumZero : is_digit(b) ? kNumInt : -1; break;
    case kNumZero: next = integer ? -1 : b == '.' ? kNumDot : (b == 'e' || b == 'E') ? kNumExp : -1; break;
    case kNumInt:
      next = is_digit(b) ? kNumInt : integer ? -1 : b == '.' ? kNumDot : (b == 'e' || b == 'E') ? kNumExp : -1;
      break;
    case kNumDot: next = is_digit(b) ? kNumFrac : -1; break;
    case kNumFrac: next = is_digit(b) ? kNumFrac : (b == 'e' || b == 'E') ? kNumExp : -1; break;
    case kNumExp: next = (b == '+' || b == '-') ? kNumExpSign : is_digit(b) ? kNumExpDigits : -1; break;
    case kNumExpSign:
    case kNumExpDigits: next = is_digit(b) ? kNumExpDigits : -1; break;
  }
  if (next < 0) return accepting ? Step::kDoneRetry : Step::kReject;
  // Within the limits, with room left to finish (a phase that is not accepting needs one more digit): an integer
  // has at most kMaxIntegerDigits digits, any number kMaxNumberBytes bytes and kMaxExponentDigits exponent digits,
  // so that every value reads back as an int64 or a finite double. lo: the sign byte; hi: exponent digits.
  const bool next_accepting = next == kNumZero || next == kNumInt || next == kNumFrac || next == kNumExpDigits;
  const uint32_t limit = integer ? kMaxIntegerDigits + (b == '-' || f.lo) : kMaxNumberBytes;
  if (f.count + 1 + (next_accepting ? 0 : 1) > limit) return Step::kReject;
  if (next == kNumExpDigits && ++f.hi > kMaxExponentDigits) return Step::kReject;
  if (b == '-' && f.phase == kNumStart) f.lo = 1;
  ++f.count;
  f.phase = uint8_t(next);
  return Step::kStay;
}

// Whitespace in a gap between JSON tokens: one space, or a newline and up to kMaxIndent spaces or tabs (what
// JSON writers produce; a model left free to write whitespace can spend its tokens on it). ws: 0 nothing yet,
// 1 a space, 2 + k a newline and k indents.
Step gap_ws(Frame& f, uint8_t b) {
  if (f.ws == 0 && (b == ' ' || b == '\n')) f.ws = b == ' ' ? 1 : 2;
  else if (f.ws >= 2 && f.ws < 2 + kMaxIndent && (b == ' ' || b == '\t')) ++f.ws;
  else return Step::kReject;
  return Step::kStay;
}

// What an object or array does with its opening byte (phase 0: `open`, then phase 1) and with whitespace between
// its parts; nothing for any other byte.
std::optional<Step> container_open_or_gap(Frame& f, uint8_t b, uint8_t open) {
  if (f.phase == 0) {
    if (b != open) return Step::kReject;
    f.phase = 1;
    return Step::kStay;
  }
  if (is_ws(b)) return gap_ws(f, b);
  f.ws = 0;
  return std::nullopt;
}

Step step_object(const Grammar& g, State& s, Frame& f, uint8_t b) {
  static_assert(kObjOpen == 0 && kObjFirstKey == 1);
  if (const auto done = container_open_or_gap(f, b, '{')) return *done;
  const Node& n = g.nodes[f.node];
  const bool required_done = (n.required & ~f.seen) == 0;
  switch (f.phase) {
    case kObjFirstKey:
      if (b == '}') return required_done ? Step::kDone : Step::kReject;
      [[fallthrough]];
    case kObjKey: {
      if (b != '"') return Step::kReject;
      f.phase = kObjKeyPending;
      Frame key;
      key.kind = FrameKind::kKey;
      key.node = f.node;
      return push(s, key);
    }
    case kObjColon:
      if (b != ':') return Step::kReject;
      f.phase = kObjValue;
      return Step::kStay;
    case kObjValue:
      f.phase = kObjValuePending;
      return push_value(s, g, f.prop == kAdditionalKey ? n.additional : n.properties[f.prop].node, b);
    case kObjAfterValue: {
      if (b == '}') return required_done ? Step::kDone : Step::kReject;
      const uint64_t all = n.properties.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.properties.size()) - 1;
      if (b != ',' || (n.additional == kNone && f.seen == all)) return Step::kReject;
      f.phase = kObjKey;
      return Step::kStay;
    }
    default: return Step::kReject;
  }
}

// An object key after its opening '"': the declared names still matching (lo, hi), or, once it matches none, any
// other key if the object takes other properties. Keys are written without escapes.
Step step_key(const Grammar& g, State& s, int at, uint8_t b) {
  Frame& f = s.frames[at];
  const Node& n = g.nodes[f.node];
  const uint64_t seen = s.frames[at - 1].seen;
  if (f.phase == kKeyOpen) {  // the parent saw the '"'
    f.phase = n.properties.empty() ? kKeyFree : kKeyMatch;
    f.hi = uint16_t(n.properties.size());
    return Step::kStay;
  }
  const bool other_keys = n.additional != kNone;
  if (b == '"') {
    if (f.utf8 != 0) return Step::kReject;
    if (f.phase == kKeyMatch && f.lo < f.hi && n.properties[f.lo].name.size() == f.count) {
      if ((seen >> f.lo) & 1) return Step::kReject;  // a duplicate key
      f.prop = f.lo;
      return Step::kDone;
    }
    if (!other_keys) return Step::kReject;
    f.prop = kAdditionalKey;
    return Step::kDone;
  }
  if (b == '\\') return Step::kReject;
  bool completes = false;
  if (!json_text_byte(f, b, completes)) return Step::kReject;
  if (f.phase == kKeyFree) return Step::kStay;
  uint16_t lo = f.lo, hi = f.lo;
  for (uint16_t i = f.lo; i < f.hi; ++i) {  // the names sharing the key so far, that continue with b
    const std::string& name = n.properties[i].name;
    const bool match = name.size() > f.count && uint8_t(name[f.count]) == b;
    if (match && hi == lo) lo = i, hi = uint16_t(i + 1);
    else if (match) hi = uint16_t(i + 1);
  }
  if (lo == hi) {
    if (!other_keys) return Step::kReject;
    f.phase = kKeyFree;
    return Step::kStay;
  }
  bool unseen = other_keys;
  for (uint16_t i = lo; i < hi && !unseen; ++i) unseen = !((seen >> i) & 1);
  if (!unseen) return Step::kReject;
  f.lo = lo, f.hi = hi, ++f.count;
  return Step::kStay;
}

Step step_array(const Grammar& g, State& s, Frame& f, uint8_t b) {
  static_assert(kArrOpen == 0 && kArrFirst == 1);
  if (const auto done = container_open_or_gap(f, b, '[')) return *done;
  const Node& n = g.nodes[f.node];
  switch (f.phase) {
    case kArrFirst:
      if (b == ']') return n.min == 0 ? Step::kDone : Step::kReject;
      if (n.max == 0) return Step::kReject;
      [[fallthrough]];
    case kArrItem:
      f.phase = kArrItemPending;
      return push_value(s, g, n.items, b);
    case kArrAfterItem:
      if (b == ']') return f.count >= n.min ? Step::kDone : Step::kReject;
      if (b != ',' || f.count >= n.max) return Step::kReject;
      f.phase = kArrItem;
      return Step::kStay;
    default: return Step::kReject;
  }
}

Step step_invoke(const Grammar& g, State& s, Frame& f, uint8_t b) {
  const Node& n = g.nodes[f.node];
  switch (f.phase) {
    case kInvMenu: f.phase = kInvMenuPending; return push_menu(s, g, n.set);
    case kInvRaw: f.phase = kInvRawPending; return push_value(s, g, n.properties[f.prop].raw, b);
    case kInvJson: f.phase = kInvJsonPending; return push_value(s, g, n.properties[f.prop].json, b);
    case kInvNewline:
      if (b != '\n') return Step::kReject;
      f.phase = kInvMenu;
      return Step::kStay;
    case kInvClose: f.phase = kInvClosePending; return push_menu(s, g, g.parameter_close);
    default: return Step::kReject;
  }
}

Step step_root(const Grammar& g, State& s, Frame& f, uint8_t b) {
  switch (f.phase) {
    case kReason:
      if (b == uint8_t(kThinkEnd[f.count])) {
        if (++f.count == kThinkEnd.size()) f.phase = kAnswer, f.count = 0;
      } else {
        f.count = b == '<' ? 1 : 0;
      }
      return Step::kStay;
    case kAnswer:
      if (g.json_root != kNone && g.nodes[g.json_root].first[b]) {
        f.phase = kJsonPending;
        return push_value(s, g, g.json_root, b);
      }
      if (g.first_call == kNone) return Step::kReject;
      f.phase = kMenuPending;
      return push_menu(s, g, g.first_call);
    case kCall: {
      f.phase = kInvokePending;
      Frame invoke;
      invoke.kind = FrameKind::kInvoke;
      invoke.node = g.invokes[f.prop];
      return push(s, invoke);
    }
    case kNext: f.phase = kMenuPending; return push_menu(s, g, g.next_call);
    default: return Step::kReject;
  }
}

// A child frame finished: the parent moves on. Returns true when that completes the parent too.
bool finish_child(const Grammar& g, Frame& parent, const Frame& child) {
  switch (parent.kind) {
    case FrameKind::kRoot:
      if (parent.phase == kJsonPending) {
        parent.phase = kEnd;  // only the end of the answer follows (no trailing whitespace to spend tokens on)
      } else if (parent.phase == kMenuPending) {
        const uint32_t v = g.sets[child.node].values[child.lo];
        if (v == kCloseBlock) parent.phase = kEnd;
        else parent.phase = kCall, parent.prop = uint16_t(v);
      } else {
        parent.phase = kNext;
      }
      return false;
    case FrameKind::kObject:
      if (parent.phase == kObjKeyPending) {
        parent.prop = child.prop;
        if (child.prop != kAdditionalKey) parent.seen |= uint64_t(1) << child.prop;
        parent.phase = kObjColon;
      } else {
        parent.phase = kObjAfterValue;
      }
      return false;
    case FrameKind::kArray: {
      const Node& n = g.nodes[parent.node];
      const uint32_t cap = n.max == kUnbounded ? n.min : n.max;
      parent.count = std::min(parent.count + 1, cap);
      parent.phase = kArrAfterItem;
      return false;
    }
    case FrameKind::kInvoke:
      switch (parent.phase) {
        case kInvMenuPending: {
          const uint32_t v = g.sets[child.node].values[child.lo];
          if (v == kCloseInvoke || v == kCloseEmptyInvoke) return true;
          parent.prop = uint16_t(v >> 1);
          parent.seen |= uint64_t(1) << parent.prop;
          ++parent.count;
          parent.phase = (v & 1) ? kInvRaw : kInvJson;
          return false;
        }
        case kInvRawPending: parent.phase = kInvNewline; return false;
        case kInvJsonPending: parent.phase = kInvClose; return false;
        default: parent.phase = kInvMenu; return false;
      }
    default: return false;
  }
}

// Pops the top frame (and every parent it completes).
void pop(const Grammar& g, State& s) {
  while (finish_child(g, s.frames[s.depth - 2], s.frames[s.depth - 1])) --s.depth;
  --s.depth;
}

Step step(const Grammar& g, State& s, uint8_t b) {
  const int at = s.depth - 1;
  Frame& f = s.frames[at];
  switch (f.kind) {
    case FrameKind::kRoot: return step_root(g, s, f, b);
    case FrameKind::kString: return step_string(g, f, b);
    case FrameKind::kRawString: return step_raw_string(g, f, b);
    case FrameKind::kNumber: return step_number(g, f, b);
    case FrameKind::kMenu: return step_menu(g, s, at, b);
    case FrameKind::kObject: return step_object(g, s, f, b);
    case FrameKind::kKey: return step_key(g, s, at, b);
    case FrameKind::kArray: return step_array(g, s, f, b);
    case FrameKind::kInvoke: return step_invoke(g, s, f, b);
  }
  return Step::kReject;
}

// Whether the top frame is complete without another byte (a number, or an enum value some longer one extends).
bool frame_can_end(const Grammar& g, const State& s) {
  const Frame& f = s.frames[s.depth - 1];
  if (f.kind == FrameKind::kNumber)
    return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExpDigits;
  return f.kind == FrameKind::kMenu && menu_exact(g, s, s.depth - 1);
}

}  // namespace

// The state is (continuation bytes still expected << 3) | the range class of the next one (the exceptions after
// E0, ED, F0, F4).
int utf8_step(uint8_t& st, uint8_t b) {
  if (st == 0) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) st = 1 << 3;
    else if (b == 0xE0) st = 2 << 3 | 1;
    else if (b == 0xED) st = 2 << 3 | 2;
    else if (b >= 0xE1 && b <= 0xEF) st = 2 << 3;
    else if (b == 0xF0) st = 3 << 3 | 3;
    else if (b >= 0xF1 && b <= 0xF3) st = 3 << 3;
    else if (b == 0xF4) st = 3 << 3 | 4;
    else return -1;
    return 0;
  }
  static constexpr uint8_t kLo[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
  static constexpr uint8_t kHi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
  const int range = st & 7;
  if (b < kLo[range] || b > kHi[range]) return -1;
  st = uint8_t(((st >> 3) - 1) << 3);
  return st == 0 ? 1 : 0;
}

State initial_state(const Grammar& g) {
  State s;
  s.depth = 1;
  s.frames[0].kind = FrameKind::kRoot;
  s.frames[0].phase = g.reasoning ? kReason : kAnswer;
  return s;
}

void copy_state(State& to, const State& from) {
  to.depth = from.depth;
  std::memcpy(to.frames.data(), from.frames.data(), sizeof(Frame) * size_t(from.depth));
}

bool advance(const Grammar& g, State& s, uint8_t byte) {
  while (true) {
    switch (step(g, s, byte)) {
      case Step::kReject: return false;
      case Step::kStay: return true;
      case Step::kDone: pop(g, s); return true;
      case Step::kDoneRetry: pop(g, s); break;
      case Step::kPush: break;
    }
  }
}

bool can_end(const Grammar& g, const State& state) {
  State s;
  copy_state(s, state);
  while (s.depth > 1) {
    if (!frame_can_end(g, s)) return false;
    pop(g, s);
  }
  return s.frames[0].phase == kEnd;
}

int64_t plain_text_budget(const Grammar& g, const State& s) {
  const Frame& f = s.frames[s.depth - 1];
  if (f.utf8 != 0 || f.guard != 0) return -1;
  if (f.kind == FrameKind::kKey) {  // still matching declared names, plain text is accepted if others may follow
    const bool other_keys = g.nodes[f.node].additional != kNone;
    return f.phase == kKeyFree || (f.phase == kKeyMatch && other_keys) ? int64_t(kUnbounded) : -1;
  }
  if ((f.kind != FrameKind::kString && f.kind != FrameKind::kRawString) || f.phase != kStrContent) return -1;
  const Node& n = g.nodes[f.node];
  return n.max == kUnbounded ? kUnbounded : n.max - f.count;
}

bool in_free_reasoning(const State& s) {
  return s.depth == 1 && s.frames[0].phase == kReason && s.frames[0].count == 0;
}

bool Matcher::feed(std::string_view bytes) {
  State next;
  copy_state(next, state_);
  for (const char c : bytes)
    if (!advance(*grammar_, next, uint8_t(c))) return false;
  copy_state(state_, next);
  return true;
}

}  // namespace dsv4::grammar
