// JSON schema and tool definitions -> Grammar. Schemas compile to a graph of nodes ($ref cycles become cycles of
// node ids); a DSML tool call gets, per parameter, the node of a string="true" value (raw text) and of a
// string="false" value (JSON), as chat/chat_parser.cpp reads them back.
#include "grammar/grammar.h"

#include <algorithm>
#include <map>
#include <set>

namespace dsv4::grammar {

namespace {

// Keywords that describe a schema without constraining its values: accepted and without effect.
const std::set<std::string> kAnnotations = {"title",      "description", "default",   "examples", "$schema",
                                            "$id",        "$comment",    "deprecated", "readOnly", "writeOnly",
                                            "$defs",      "definitions"};
const std::set<std::string> kObjectKeywords = {"properties", "required", "additionalProperties"};
const std::set<std::string> kArrayKeywords = {"items", "minItems", "maxItems"};
const std::set<std::string> kStringKeywords = {"minLength", "maxLength"};
const std::set<std::string> kOtherKeywords = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"};
const std::vector<std::string> kTypes = {"string", "number", "integer", "boolean", "null", "object", "array"};

// Text the grammar writes literally (property names, enum values, tool names) must not hold what the chat parser
// reads as a marker: "<｜" starts <｜end▁of▁sentence｜> and <｜DSML｜tool_calls>, "</｜" a closing DSML tag.
bool has_marker(std::string_view text) {
  return text.find("<｜") != std::string_view::npos || text.find("</｜") != std::string_view::npos;
}

bool has_control(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) { return uint8_t(c) < 0x20; });
}

std::string pointer_child(const std::string& path, const std::string& key) {
  std::string escaped;
  for (char c : key) escaped += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return path + "/" + escaped;
}

class Builder {
 public:
  explicit Builder(Grammar& g) : g_(g) {}

  uint16_t add(Node node, const std::string& path, int tool) {
    if (g_.nodes.size() >= kNone - 1) throw SchemaError(path + ": the schema is too large", tool);
    g_.nodes.push_back(std::move(node));
    paths_.push_back(path);
    tools_.push_back(tool);
    return uint16_t(g_.nodes.size() - 1);
  }

  uint16_t add_set(std::vector<std::pair<std::string, uint32_t>> items, bool gated) {
    std::sort(items.begin(), items.end());
    items.erase(std::unique(items.begin(), items.end(),
                            [](const auto& a, const auto& b) { return a.first == b.first; }),
                items.end());
    LiteralSet set;
    set.gated = gated;
    for (auto& [text, value] : items) {
      set.items.push_back(std::move(text));
      set.values.push_back(value);
    }
    g_.sets.push_back(std::move(set));
    return uint16_t(g_.sets.size() - 1);
  }

  uint16_t literals(std::vector<std::string> items, const std::string& path, int tool) {
    std::vector<std::pair<std::string, uint32_t>> entries;
    for (auto& item : items) entries.emplace_back(std::move(item), 0);
    Node n;
    n.kind = NodeKind::kLiterals;
    n.set = add_set(std::move(entries), false);
    return add(std::move(n), path, tool);
  }

  // Any JSON value (one node per grammar): a string, number, true / false / null, or an object or array of them.
  uint16_t any() {
    if (any_ != kNone) return any_;
    Node u;
    u.kind = NodeKind::kUnion;
    any_ = add(u, "#", -1);
    Node object;
    object.kind = NodeKind::kObject;
    object.additional = any_;
    Node array;
    array.kind = NodeKind::kArray;
    array.items = any_;
    Node number;
    number.kind = NodeKind::kNumber;
    std::vector<uint16_t> alternatives = {add(Node{}, "#", -1), add(number, "#", -1),
                                          literals({"false", "null", "true"}, "#", -1),
                                          add(std::move(object), "#", -1), add(std::move(array), "#", -1)};
    g_.nodes[any_].alternatives = std::move(alternatives);
    return any_;
  }

  // The bytes each node's values start with; checks that a union's alternatives start differently.
  void finalize() {
    state_.resize(g_.nodes.size(), 0);
    for (size_t i = 0; i < g_.nodes.size(); ++i) first(uint16_t(i));
    check_productive();
  }

  // The node as a DSML parameter value: string="true" (raw text) and string="false" (JSON) views.
  std::pair<uint16_t, uint16_t> views(uint16_t id) {
    const Node n = g_.nodes[id];
    const std::string& path = paths_[id];
    const int tool = tools_[id];
    switch (n.kind) {
      case NodeKind::kString: {
        Node raw;
        raw.kind = NodeKind::kRawString;
        raw.min = n.min;
        raw.max = n.max;
        return {add(std::move(raw), path, tool), kNone};
      }
      case NodeKind::kLiterals: {
        std::vector<std::string> raw, json;
        for (const std::string& item : g_.sets[n.set].items) {
          if (item[0] != '"') {
            json.push_back(item);
            continue;
          }
          std::string text = Json::parse(item).get<std::string>();
          if (has_marker(text))
            throw SchemaError(path + ": the value " + item + " holds \"<｜\" or \"</｜\", which DSML cannot carry",
                              tool);
          raw.push_back(text + std::string(kDsmlParameterClose));
        }
        return {raw.empty() ? kNone : literals(std::move(raw), path, tool),
                json.empty() ? kNone : json.size() == g_.sets[n.set].items.size() ? id : literals(json, path, tool)};
      }
      case NodeKind::kUnion: {
        uint16_t raw = kNone;
        std::vector<uint16_t> json;
        for (uint16_t alt : n.alternatives) {
          const auto [r, j] = views(alt);
          if (r != kNone) raw = r;  // one alternative at most starts with '"'
          if (j != kNone) json.push_back(j);
        }
        if (json.size() <= 1) return {raw, json.empty() ? kNone : json[0]};
        Node u;
        u.kind = NodeKind::kUnion;
        u.alternatives = std::move(json);
        return {raw, add(std::move(u), path, tool)};
      }
      default: return {kNone, id};
    }
  }

  const std::string& path(uint16_t id) const { return paths_[id]; }
  int tool(uint16_t id) const { return tools_[id]; }

 private:
  const std::bitset<256>& first(uint16_t id) {
    Node& n = g_.nodes[id];
    if (state_[id] == 2) return n.first;
    if (state_[id] == 1)
      throw SchemaError(paths_[id] + ": the schema refers to itself without an object or array in between",
                        tools_[id]);
    state_[id] = 1;
    std::bitset<256> bytes;
    switch (n.kind) {
      case NodeKind::kString: bytes.set('"'); break;
      case NodeKind::kRawString: bytes.set(); break;  // any text, or the closing tag at once
      case NodeKind::kNumber:
        bytes.set('-');
        for (char c = '0'; c <= '9'; ++c) bytes.set(uint8_t(c));
        break;
      case NodeKind::kLiterals:
        for (const std::string& item : g_.sets[n.set].items) bytes.set(uint8_t(item[0]));
        break;
      case NodeKind::kObject: bytes.set('{'); break;
      case NodeKind::kArray: bytes.set('['); break;
      case NodeKind::kInvoke: bytes.set(); break;
      case NodeKind::kUnion: {
        // Nested unions are flattened, so that a value picks its alternative with one look at its first byte.
        std::vector<uint16_t> flat;
        for (uint16_t alt : n.alternatives) {
          const std::bitset<256>& f = first(alt);
          const Node& a = g_.nodes[alt];
          if ((bytes & f).any()) {
            throw SchemaError(paths_[id] + ": the alternatives of 'anyOf' / 'oneOf' / a list of types must start " +
                                  "differently (be of different JSON types); two of them can start with the same " +
                                  "character",
                              tools_[id]);
          }
          bytes |= f;
          if (a.kind == NodeKind::kUnion) flat.insert(flat.end(), a.alternatives.begin(), a.alternatives.end());
          else flat.push_back(alt);
        }
        g_.nodes[id].alternatives = std::move(flat);
        break;
      }
    }
    g_.nodes[id].first = bytes;
    state_[id] = 2;
    return g_.nodes[id].first;
  }

  // Every node must have a finite value, or a model could walk into a value it can never finish.
  void check_productive() {
    std::vector<bool> ok(g_.nodes.size(), false);
    const auto all_required = [&](const Node& n, bool invoke) {
      for (size_t i = 0; i < n.properties.size(); ++i) {
        if (!((n.required >> i) & 1)) continue;
        const Property& p = n.properties[i];
        const bool done = invoke ? (p.raw != kNone && ok[p.raw]) || (p.json != kNone && ok[p.json]) : ok[p.node];
        if (!done) return false;
      }
      return true;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < g_.nodes.size(); ++i) {
        if (ok[i]) continue;
        const Node& n = g_.nodes[i];
        bool now = true;
        switch (n.kind) {
          case NodeKind::kArray: now = n.min == 0 || ok[n.items]; break;
          case NodeKind::kObject: now = all_required(n, false); break;
          case NodeKind::kInvoke: now = all_required(n, true); break;
          case NodeKind::kUnion:
            now = std::any_of(n.alternatives.begin(), n.alternatives.end(), [&](uint16_t a) { return bool(ok[a]); });
            break;
          default: break;
        }
        if (now) ok[i] = changed = true;
      }
    }
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      if (!ok[i])
        throw SchemaError(paths_[i] + ": the schema has no finite value (a required property or item nests " +
                              "the same schema again)",
                          tools_[i]);
  }

  Grammar& g_;
  std::vector<std::string> paths_;  // per node, for errors
  std::vector<int> tools_;
  std::vector<uint8_t> state_;      // first(): 0 not computed, 1 in progress, 2 done
  uint16_t any_ = kNone;
};

// One schema document (the answer's, or one tool's parameters), with its own $ref targets.
class SchemaCompiler {
 public:
  SchemaCompiler(Builder& b, Grammar& g, const Json& root, int tool) : b_(b), g_(g), root_(root), tool_(tool) {}

  uint16_t compile(const Json& s, const std::string& path) {
    // Subschemas nest at most kMaxSchemaDepth deep (a hostile request could otherwise exhaust the stack).
    if (++depth_ > kMaxSchemaDepth) error(path, "the schema nests deeper than " + std::to_string(kMaxSchemaDepth));
    const uint16_t id = compile_node(s, path);
    --depth_;
    return id;
  }

 private:
  static constexpr int kMaxSchemaDepth = 64;
  static constexpr size_t kMaxLiterals = 10000;  // a literal set's items are counted in 16 bits

  uint16_t compile_node(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return b_.any();
      error(path, "the schema false allows no value");
    }
    if (!s.is_object()) error(path, "a schema must be an object or a boolean");
    std::vector<std::string> assertions;  // the keywords that constrain values
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key) || (key == "uniqueItems" && value == false)) continue;
      if (!kObjectKeywords.count(key) && !kArrayKeywords.count(key) && !kStringKeywords.count(key) &&
          !kOtherKeywords.count(key))
        error(path, "'" + key + "' is not supported (supported: type, properties, required, additionalProperties, " +
                        "items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf, allOf of one " +
                        "schema, $ref to #/...)");
      assertions.push_back(key);
    }
    const auto alone = [&](const std::string& keyword, const std::set<std::string>& allowed) {
      for (const std::string& a : assertions)
        if (a != keyword && !allowed.count(a)) error(path, "'" + keyword + "' cannot be combined with '" + a + "'");
    };
    if (s.contains("$ref")) {
      alone("$ref", {});
      return ref(s["$ref"], path);
    }
    if (s.contains("allOf")) {
      alone("allOf", {});
      const Json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) error(path, "'allOf' is supported with exactly one schema");
      return compile(all[0], path + "/allOf/0");
    }
    for (const char* keyword : {"anyOf", "oneOf"}) {
      if (!s.contains(keyword)) continue;
      alone(keyword, {});
      const Json& alts = s[keyword];
      if (!alts.is_array() || alts.empty()) error(path, std::string("'") + keyword + "' must be a non-empty array");
      Node u;
      u.kind = NodeKind::kUnion;
      for (size_t i = 0; i < alts.size(); ++i)
        u.alternatives.push_back(compile(alts[i], path + "/" + keyword + "/" + std::to_string(i)));
      return b_.add(std::move(u), path, tool_);
    }
    const std::vector<std::string> types = type_list(s, path);
    if (s.contains("enum") || s.contains("const")) {
      alone(s.contains("enum") ? "enum" : "const", {"type"});
      return literal_values(s, types, path);
    }
    for (const auto& [keywords, type] : {std::pair{&kObjectKeywords, "object"}, std::pair{&kArrayKeywords, "array"},
                                         std::pair{&kStringKeywords, "string"}}) {
      for (const std::string& a : assertions)
        if (keywords->count(a) && std::find(types.begin(), types.end(), type) == types.end())
          error(path, "'" + a + "' applies to " + type + "s, but 'type' does not allow " + type + "s");
    }
    if (types.empty()) return b_.any();
    std::vector<uint16_t> alternatives;
    for (const std::string& type : types) alternatives.push_back(typed(s, type, path));
    if (alternatives.size() == 1) return alternatives[0];
    Node u;
    u.kind = NodeKind::kUnion;
    u.alternatives = std::move(alternatives);
    return b_.add(std::move(u), path, tool_);
  }

  [[noreturn]] void error(const std::string& path, const std::string& message) const {
    throw SchemaError(path + ": " + message, tool_);
  }

  // "type" as a list; without it, the type its keywords imply (none: any value). "integer" with "number" is a
  // number.
  std::vector<std::string> type_list(const Json& s, const std::string& path) const {
    std::vector<std::string> types;
    if (const auto it = s.find("type"); it != s.end()) {
      const std::vector<Json> listed = it->is_array() ? it->get<std::vector<Json>>() : std::vector<Json>{*it};
      for (const Json& t : listed) {
        if (!t.is_string() || std::find(kTypes.begin(), kTypes.end(), t.get<std::string>()) == kTypes.end())
          error(path, "'type' must be one of string, number, integer, boolean, null, object, array (or a list)");
        if (std::find(types.begin(), types.end(), t.get<std::string>()) == types.end())
          types.push_back(t.get<std::string>());
      }
      if (types.empty()) error(path, "'type' must not be an empty list");
      if (std::find(types.begin(), types.end(), "number") != types.end()) std::erase(types, std::string("integer"));
      return types;
    }
    for (const auto& [keywords, type] : {std::pair{&kObjectKeywords, "object"}, std::pair{&kArrayKeywords, "array"},
                                         std::pair{&kStringKeywords, "string"}}) {
      for (const std::string& k : *keywords)
        if (s.contains(k)) {
          types.push_back(type);
          break;
        }
    }
    if (types.size() > 1) error(path, "keywords of several types need a 'type'");
    return types;
  }

  uint32_t count(const Json& s, const char* keyword, uint32_t otherwise, const std::string& path) const {
    const auto it = s.find(keyword);
    if (it == s.end()) return otherwise;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= int64_t(kUnbounded))
      error(path, std::string("'") + keyword + "' must be a non-negative integer");
    return uint32_t(it->get<int64_t>());
  }

  uint16_t typed(const Json& s, const std::string& type, const std::string& path) {
    Node n;
    if (type == "boolean") return b_.literals({"false", "true"}, path, tool_);
    if (type == "null") return b_.literals({"null"}, path, tool_);
    if (type == "number" || type == "integer") {
      n.kind = NodeKind::kNumber;
      n.integer = type == "integer";
    } else if (type == "string") {
      n.kind = NodeKind::kString;
      n.min = count(s, "minLength", 0, path);
      n.max = count(s, "maxLength", kUnbounded, path);
      if (n.min > n.max) error(path, "'minLength' is larger than 'maxLength'");
    } else if (type == "array") {
      n.kind = NodeKind::kArray;
      n.min = count(s, "minItems", 0, path);
      n.max = count(s, "maxItems", kUnbounded, path);
      if (n.min > n.max) error(path, "'minItems' is larger than 'maxItems'");
      const auto items = s.find("items");
      if (items != s.end() && *items == false) n.max = 0;
      if (n.min > n.max) error(path, "'items': false allows only an empty array, but 'minItems' is above 0");
      n.items = items == s.end() || *items == false ? b_.any() : compile(*items, path + "/items");
    } else {
      return object(s, path);
    }
    return b_.add(std::move(n), path, tool_);
  }

  uint16_t object(const Json& s, const std::string& path) {
    Node n;
    n.kind = NodeKind::kObject;
    const auto properties = s.find("properties");
    if (properties != s.end()) {
      if (!properties->is_object()) error(path, "'properties' must be an object");
      if (properties->size() > size_t(kMaxProperties))
        error(path, "at most " + std::to_string(kMaxProperties) + " properties per object are supported");
      for (const auto& [name, schema] : properties->items()) {
        if (name.find_first_of("\"\\") != std::string::npos || has_control(name) || has_marker(name))
          error(path, "the property name '" + name + "' needs escapes or holds \"<｜\"; such names are not supported");
        n.properties.push_back({name, compile(schema, pointer_child(path + "/properties", name))});
      }
      std::sort(n.properties.begin(), n.properties.end(),
                [](const Property& a, const Property& b) { return a.name < b.name; });
    }
    if (const auto required = s.find("required"); required != s.end()) {
      if (!required->is_array()) error(path, "'required' must be an array of property names");
      for (const Json& name : *required) {
        const auto it = std::find_if(n.properties.begin(), n.properties.end(),
                                     [&](const Property& p) { return name.is_string() && p.name == name; });
        if (it == n.properties.end())
          error(path, "'required' names " + name.dump() + ", which is not in 'properties'");
        n.required |= uint64_t(1) << (it - n.properties.begin());
      }
    }
    const auto additional = s.find("additionalProperties");
    if (additional == s.end() || *additional == true) n.additional = b_.any();
    else if (*additional != false) n.additional = compile(*additional, path + "/additionalProperties");
    return b_.add(std::move(n), path, tool_);
  }

  // enum / const: each allowed value in its compact JSON spelling (values of another type than a given 'type'
  // are dropped).
  uint16_t literal_values(const Json& s, const std::vector<std::string>& types, const std::string& path) {
    std::vector<Json> values;
    if (s.contains("const")) values.push_back(s["const"]);
    else if (s["enum"].is_array() && !s["enum"].empty()) values = s["enum"].get<std::vector<Json>>();
    else error(path, "'enum' must be a non-empty array");
    const auto of_type = [&](const Json& v) {
      if (types.empty()) return true;
      for (const std::string& t : types) {
        if ((t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
            (t == "integer" && v.is_number_integer()) || (t == "boolean" && v.is_boolean()) ||
            (t == "null" && v.is_null()) || (t == "object" && v.is_object()) || (t == "array" && v.is_array()))
          return true;
      }
      return false;
    };
    std::vector<std::string> items;
    for (const Json& v : values) {
      if (!of_type(v)) continue;
      std::string text = v.dump();
      if (has_marker(text)) error(path, "the value " + text + " holds \"<｜\" or \"</｜\"; not supported");
      items.push_back(std::move(text));
    }
    if (items.empty()) error(path, "no value of 'enum' / 'const' has the type 'type' asks for");
    if (items.size() > kMaxLiterals) error(path, "'enum' may hold at most " + std::to_string(kMaxLiterals) + " values");
    return b_.literals(std::move(items), path, tool_);
  }

  // "#" or "#/json/pointer" into this schema document. A target is compiled once: recursion refers to its node.
  uint16_t ref(const Json& target, const std::string& path) {
    if (!target.is_string() || !target.get<std::string>().starts_with("#"))
      error(path, "'$ref' must point into this schema (\"#/$defs/...\")");
    const std::string pointer = target.get<std::string>().substr(1);
    if (const auto it = refs_.find(pointer); it != refs_.end()) return it->second;
    const Json* resolved = nullptr;
    try {
      resolved = &root_.at(Json::json_pointer(pointer));
    } catch (const Json::exception&) {
      error(path, "'$ref' " + target.dump() + " does not resolve");
    }
    const uint16_t id = b_.add(Node{}, path, tool_);
    refs_[pointer] = id;
    resolving_.insert(id);
    const uint16_t compiled = compile(*resolved, "#" + pointer);
    if (resolving_.count(compiled)) error(path, "'$ref' " + target.dump() + " refers to itself");
    resolving_.erase(id);
    g_.nodes[id] = g_.nodes[compiled];
    return id;
  }

  Builder& b_;
  Grammar& g_;
  const Json& root_;
  int tool_;
  std::map<std::string, uint16_t> refs_;
  std::set<uint16_t> resolving_;  // $ref nodes whose target is being compiled (still empty)
  int depth_ = 0;
};

}  // namespace

std::shared_ptr<const Grammar> compile(const Spec& spec) {
  auto g = std::make_shared<Grammar>();
  Builder b(*g);
  g->reasoning = spec.reasoning;
  if (spec.json) g->json_root = SchemaCompiler(b, *g, *spec.json, -1).compile(*spec.json, "#");

  std::vector<uint16_t> objects;  // per tool: its parameters' object node
  std::set<std::string> names;
  if (spec.tools.size() > 10000) throw SchemaError("at most 10000 tools can be called", -1);
  for (size_t t = 0; t < spec.tools.size(); ++t) {
    const Spec::Tool& tool = spec.tools[t];
    const int index = int(t);
    if (tool.name.empty() || tool.name.find('"') != std::string::npos || has_control(tool.name) ||
        has_marker(tool.name))
      throw SchemaError("the tool name '" + tool.name + "' cannot be written in a DSML invoke tag", index);
    if (!names.insert(tool.name).second) throw SchemaError("two tools are named '" + tool.name + "'", index);
    const Json params = tool.parameters.is_null() ? Json{{"type", "object"}, {"additionalProperties", false}}
                                                  : tool.parameters;
    objects.push_back(SchemaCompiler(b, *g, params, index).compile(params, "#"));
  }
  b.finalize();

  // DSML: one kInvoke node per tool, whose gated menu offers each parameter not written yet (string="true" when
  // its schema allows a string, string="false" when it allows anything else) and the close once the required
  // ones are written. A tool's extra parameters (additionalProperties) are not offered.
  std::vector<std::pair<std::string, uint32_t>> first_items, next_items;
  for (size_t t = 0; t < objects.size(); ++t) {
    const Node object = g->nodes[objects[t]];
    if (object.kind != NodeKind::kObject)
      throw SchemaError("#: a tool's parameters must be an object schema", int(t));
    Node invoke;
    invoke.kind = NodeKind::kInvoke;
    invoke.required = object.required;
    std::vector<std::pair<std::string, uint32_t>> menu;
    for (size_t i = 0; i < object.properties.size(); ++i) {
      const Property& p = object.properties[i];
      if (p.name.empty()) throw SchemaError(b.path(p.node) + ": DSML parameters need a non-empty name", int(t));
      const auto [raw, json] = b.views(p.node);
      invoke.properties.push_back({p.name, p.node, raw, json});
      const std::string open = std::string(kDsmlParameterOpen) + p.name + "\" string=\"";
      if (raw != kNone) menu.emplace_back(open + "true\">", uint32_t(i << 1 | 1));
      if (json != kNone) menu.emplace_back(open + "false\">", uint32_t(i << 1));
    }
    menu.emplace_back(std::string(kDsmlInvokeClose), kCloseInvoke);
    menu.emplace_back(cat("\n", kDsmlInvokeClose), kCloseEmptyInvoke);
    invoke.set = b.add_set(std::move(menu), true);
    g->invokes.push_back(b.add(std::move(invoke), "#", int(t)));
    const std::string open = std::string(kDsmlInvokeOpen) + spec.tools[t].name + "\">\n";
    first_items.emplace_back(std::string(kDsmlBlockOpen) + open, uint32_t(t));
    if (!spec.single_call) next_items.emplace_back(cat("\n", open), uint32_t(t));
  }
  if (!objects.empty()) {
    next_items.emplace_back(cat("\n", kDsmlBlockClose), kCloseBlock);
    g->first_call = b.add_set(std::move(first_items), false);
    g->next_call = b.add_set(std::move(next_items), false);
    g->parameter_close = b.add_set({{std::string(kDsmlParameterClose) + "\n", 0}}, false);
    b.finalize();  // the views' new nodes
  }
  return g;
}

}  // namespace dsv4::grammar
