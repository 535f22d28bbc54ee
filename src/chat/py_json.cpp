// Python-compatible JSON serialisation (see py_json.h).
#include "chat/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace dsv4::chat {

std::string py_json_string(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

std::string py_float_repr(double x) {
  DSV4_CHECK(std::isfinite(x), "JSON value ", x, " is not finite");
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, e.g. "-1.2345e+17": sign, mantissa digits, exponent.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  DSV4_ASSERT(res.ec == std::errc());
  const std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  const size_t e_pos = sci.find('e');
  DSV4_ASSERT(e_pos != std::string_view::npos);
  std::string digits;
  bool negative = false;
  for (const char c : sci.substr(0, e_pos)) {
    if (c == '-') negative = true;
    else if (c != '.') digits += c;
  }
  const int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  const int point = exponent + 1;  // digits[0:point] is the integer part
  const int n = static_cast<int>(digits.size());

  std::string out = negative ? "-" : "";
  if (point > -4 && point <= 16) {  // Python's repr switches to exponent form outside 1e-4 <= |x| < 1e16
    if (point <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-point), '0');
      out += digits;
    } else if (point >= n) {
      out += digits;
      out.append(static_cast<size_t>(point - n), '0');
      out += ".0";
    } else {
      out.append(digits, 0, static_cast<size_t>(point));
      out += '.';
      out.append(digits, static_cast<size_t>(point));
    }
  } else {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out.append(digits, 1);
    }
    out += exponent < 0 ? "e-" : "e+";
    const int mag = std::abs(exponent);
    if (mag < 10) out += '0';
    out += std::to_string(mag);
  }
  return out;
}

namespace {

void dump(const OrderedJson& v, std::string& out) {
  switch (v.type()) {
    case OrderedJson::value_t::null: out += "null"; return;
    case OrderedJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case OrderedJson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case OrderedJson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case OrderedJson::value_t::number_float: out += py_float_repr(v.get<double>()); return;
    case OrderedJson::value_t::string: out += py_json_string(v.get_ref<const std::string&>()); return;
    case OrderedJson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dump(item, out);
      }
      out += ']';
      return;
    }
    case OrderedJson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += py_json_string(key);
        out += ": ";
        dump(item, out);
      }
      out += '}';
      return;
    }
    default: fail("JSON value of this type (binary or discarded) cannot be written as Python json.dumps does");
  }
}

}  // namespace

std::string py_json_dumps(const OrderedJson& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace dsv4::chat
