// UTF-8 scanning, lossy repair and the byte-level alphabet.
#include "tokenizer/utf8.h"

namespace dsv4::tok {

Utf8Scan scan_utf8(std::string_view s, size_t pos) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = at(pos);
  if (lead < 0x80) return {Utf8Step::kValid, 1};
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (excludes overlongs, surrogates)
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Step::kInvalid, 1};
  }
  for (size_t i = 1; i < length; ++i) {
    if (pos + i >= s.size()) return {Utf8Step::kIncomplete, i};
    const unsigned char b = at(pos + i);
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {Utf8Step::kInvalid, i};
  }
  return {Utf8Step::kValid, length};
}

size_t find_invalid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Scan scan = scan_utf8(s, pos);
    if (scan.step != Utf8Step::kValid) return pos;
    pos += scan.length;
  }
  return std::string_view::npos;
}

void append_utf8_lossy(std::string& out, std::string_view s) {
  size_t pos = 0, clean = 0;  // s[clean, pos) is valid and not yet copied
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Scan scan = scan_utf8(s, pos);
    if (scan.step == Utf8Step::kValid) {
      pos += scan.length;
      continue;
    }
    out.append(s.substr(clean, pos - clean));
    out.append("\xEF\xBF\xBD");
    pos += scan.length;
    clean = pos;
  }
  out.append(s.substr(clean));
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

uint32_t decode_utf8(std::string_view s, size_t pos) {
  const auto at = [&](size_t i) { return uint32_t(static_cast<unsigned char>(s[pos + i])); };
  const uint32_t b = at(0);
  if (b < 0x80) return b;
  if (b < 0xE0) return ((b & 0x1F) << 6) | (at(1) & 0x3F);
  if (b < 0xF0) return ((b & 0x0F) << 12) | ((at(1) & 0x3F) << 6) | (at(2) & 0x3F);
  return ((b & 0x07) << 18) | ((at(1) & 0x3F) << 12) | ((at(2) & 0x3F) << 6) | (at(3) & 0x3F);
}

ByteAlphabet::ByteAlphabet() {
  from_cp_.fill(-1);
  uint32_t next_extra = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    to_cp_[b] = printable ? b : next_extra++;
    append_utf8(to_utf8_[b], to_cp_[b]);
    from_cp_[to_cp_[b]] = int16_t(b);
  }
}

std::string ByteAlphabet::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += to_utf8_[static_cast<uint8_t>(c)];
  return out;
}

void ByteAlphabet::decode(std::string_view token, std::string& out) const {
  const size_t start = out.size();
  for (size_t pos = 0; pos < token.size();) {
    const Utf8Scan scan = scan_utf8(token, pos);
    const int b = scan.step == Utf8Step::kValid ? byte_of(decode_utf8(token, pos)) : -1;
    if (b < 0) {  // not an alphabet character: the decoder keeps the whole token as it is
      out.resize(start);
      out.append(token);
      return;
    }
    out.push_back(char(b));
    pos += scan.length;
  }
}

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

}  // namespace dsv4::tok
