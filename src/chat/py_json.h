// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it, which is what DeepSeek's
// encoder uses for tool schemas and non-string tool-call arguments: ", " and ": " separators, keys in
// insertion order (hence nlohmann::ordered_json), non-ASCII characters unescaped, floats as Python's repr().
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsv4::chat {

using OrderedJson = nlohmann::ordered_json;

// json.dumps(value, ensure_ascii=False). Throws Error for NaN / infinity (Python would write NaN, which is
// not JSON) and for binary values.
std::string py_json_dumps(const OrderedJson& value);

// json.dumps(text, ensure_ascii=False) for a string: quotes, escapes for `"` `\` and control characters
// (\n \r \t \b \f, otherwise \u00xx); bytes >= 0x80 are copied as they are.
std::string py_json_string(std::string_view text);

// repr(float(x)): the shortest digits that round-trip, fixed notation for 1e-4 <= |x| < 1e16 (with ".0"
// when integral), otherwise d.ddde±XX.
std::string py_float_repr(double x);

}  // namespace dsv4::chat
