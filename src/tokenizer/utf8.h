// UTF-8 helpers for the tokenizer: validation, lossy repair (as Rust's String::from_utf8_lossy, which is
// what Hugging Face `tokenizers` applies when decoding) and the byte-level alphabet of GPT-2 style BPE.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::tok {

// How the UTF-8 sequence starting at one position ends.
enum class Utf8Step : uint8_t {
  kValid,       // a complete, well-formed code point of `length` bytes
  kInvalid,     // `length` bytes form a maximal ill-formed subpart: one U+FFFD replaces them
  kIncomplete,  // the input ends inside a well-formed prefix of `length` bytes (more bytes may complete it)
};

struct Utf8Scan {
  Utf8Step step;
  size_t length;
};

// Classifies the sequence at s[pos] (pos < s.size()). Follows the Unicode "maximal subpart" rule, so
// E2 82 41 is one invalid subpart (E2 82) followed by 'A'.
Utf8Scan scan_utf8(std::string_view s, size_t pos);

// Byte offset of the first ill-formed or truncated sequence, or npos when `s` is valid UTF-8.
size_t find_invalid_utf8(std::string_view s);

// Appends `s`, replacing every maximal ill-formed subpart (including a truncated tail) with U+FFFD.
void append_utf8_lossy(std::string& out, std::string_view s);

// Length in bytes of the code point starting at s[pos]; s must be valid UTF-8.
inline size_t utf8_length(std::string_view s, size_t pos) {
  const auto b = static_cast<unsigned char>(s[pos]);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// Start of the code point that ends right before `pos` (pos > 0); s must be valid UTF-8.
inline size_t utf8_previous(std::string_view s, size_t pos) {
  do --pos;
  while (pos > 0 && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80);
  return pos;
}

// Appends the UTF-8 encoding of code point `cp`.
void append_utf8(std::string& out, uint32_t cp);

// Decodes the (valid) code point at s[pos].
uint32_t decode_utf8(std::string_view s, size_t pos);

// The byte-level alphabet of GPT-2 style BPE: every byte maps to one printable code point. Bytes that are
// already printable and not a space ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to themselves; the
// other 68 bytes map, in increasing byte order, to U+0100, U+0101, ...
class ByteAlphabet {
 public:
  ByteAlphabet();
  uint32_t code_point(uint8_t byte) const { return to_cp_[byte]; }
  const std::string& utf8(uint8_t byte) const { return to_utf8_[byte]; }
  // The byte a code point stands for, or -1 when the code point is not in the alphabet.
  int byte_of(uint32_t cp) const { return cp < from_cp_.size() ? from_cp_[cp] : -1; }

  // Maps raw bytes to their alphabet characters (the ByteLevel pre-tokenizer).
  std::string encode(std::string_view bytes) const;
  // Inverse mapping used by the ByteLevel decoder: if every character of `token` is in the alphabet the
  // bytes it stands for are appended; otherwise the token's own UTF-8 is appended unchanged.
  void decode(std::string_view token, std::string& out) const;

 private:
  std::array<uint32_t, 256> to_cp_{};
  std::array<std::string, 256> to_utf8_;
  std::array<int16_t, 324> from_cp_{};  // 0x100 + 68 code points at most
};

const ByteAlphabet& byte_alphabet();

}  // namespace dsv4::tok
