// Field accessors for tokenizer.json: every failure names the file and the JSON path of the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace dsv4::tok {

using Json = nlohmann::json;

inline const Json& field(const Json& j, const char* key, const std::string& where) {
  DSV4_CHECK(j.is_object(), where, ": expected a JSON object");
  const auto it = j.find(key);
  DSV4_CHECK(it != j.end(), where, ": missing field '", key, "'");
  return *it;
}

inline std::string string_field(const Json& j, const char* key, const std::string& where) {
  const Json& v = field(j, key, where);
  DSV4_CHECK(v.is_string(), where, ".", key, ": expected a string");
  return v.get<std::string>();
}

// An optional boolean: absent or null gives `fallback`.
inline bool bool_field(const Json& j, const char* key, const std::string& where, bool fallback) {
  DSV4_CHECK(j.is_object(), where, ": expected a JSON object");
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  DSV4_CHECK(it->is_boolean(), where, ".", key, ": expected true or false");
  return it->get<bool>();
}

// The "type" tag of a normalizer / pre-tokenizer / model / decoder object.
inline std::string type_of(const Json& j, const std::string& where) { return string_field(j, "type", where); }

}  // namespace dsv4::tok
