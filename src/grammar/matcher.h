// Constrained decoding, the matcher: a pushdown automaton over a Grammar that reads an answer one byte at a time.
// Its state is a stack of small frames (the root, then one per open JSON container, DSML call, string, number or
// literal being written). advance() takes one byte or refuses it; every state it accepts has a way to finish, so
// a model that only writes accepted bytes always ends with a valid answer (unless max_tokens stops it first).
//
// The state is plain data, copied by value: the token masks (token_mask.h) walk the vocabulary with copies.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>

#include "grammar/grammar.h"

namespace dsv4::grammar {

enum class FrameKind : uint8_t { kRoot, kString, kRawString, kNumber, kMenu, kObject, kKey, kArray, kInvoke };

struct Frame {
  uint64_t seen = 0;  // kObject / kInvoke: bit i = property i written
  // kString / kRawString: code points written (saturating where no bound needs more); kArray: items (same);
  // kNumber: bytes; kMenu / kKey: bytes matched; kInvoke: parameters written; kRoot: bytes of </think> matched.
  uint32_t count = 0;
  uint16_t node = 0;        // the grammar node (kMenu: the literal set)
  // kMenu / kKey: the items still matching; kRawString: lo = bytes of the closing tag; kNumber: lo = negative,
  // hi = exponent digits.
  uint16_t lo = 0, hi = 0;
  uint16_t prop = 0;        // kObject / kInvoke: the property being written; kKey: the result; kRoot: the tool
  FrameKind kind = FrameKind::kRoot;
  uint8_t phase = 0;
  uint8_t ws = 0;     // whitespace bytes in the current gap
  uint8_t utf8 = 0;   // strings and keys: continuation bytes still expected (<< 3) and their range
  uint8_t guard = 0;  // strings and keys: progress through "<｜" / "</｜"
};

struct State {
  int depth = 0;
  std::array<Frame, kMaxFrames> frames;
};

// The state before the first byte of an answer.
State initial_state(const Grammar& g);
// Copies the frames in use (a State is mostly unused capacity).
void copy_state(State& to, const State& from);
// Reads one byte; false when the grammar does not allow it (the state is then unusable: advance a copy).
bool advance(const Grammar& g, State& s, uint8_t byte);
// Whether the answer may end here (the end-of-sentence token is allowed).
bool can_end(const Grammar& g, const State& s);

// What a text string frame at the top of `s` does with "plain" bytes (printable ASCII but `"` `\` `<`, and whole
// or partial UTF-8 characters): it accepts any run of them that starts at most `budget` characters (kUnbounded:
// any run). -1 when the top frame is not such a string, between characters and clear of "<｜".
int64_t plain_text_budget(const Grammar& g, const State& s);
// Whether the state is the reasoning with no part of </think> matched: any bytes but '<' keep it there.
bool in_free_reasoning(const State& s);

// UTF-8 validation one byte at a time. `state` is 0 between characters; returns -1 for a byte that cannot come
// here (overlong forms, surrogates and code points above U+10FFFF included), 1 when it completes a character.
int utf8_step(uint8_t& state, uint8_t byte);

// A state with its grammar, for callers that feed whole texts.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar)
      : grammar_(std::move(grammar)), state_(initial_state(*grammar_)) {}
  // All or nothing: false leaves the state as it was.
  bool feed(std::string_view bytes);
  bool can_end() const { return grammar::can_end(*grammar_, state_); }
  const Grammar& grammar() const { return *grammar_; }
  const State& state() const { return state_; }

 private:
  std::shared_ptr<const Grammar> grammar_;
  State state_;
};

}  // namespace dsv4::grammar
