// Constrained decoding: the matcher against accepted and refused answers (JSON syntax, odd escapes and UTF-8,
// numbers, nesting, schema keywords, DSML tool calls that chat::ChatParser reads back), the schema errors, and the
// token masks against a brute-force check of every token on random walks (the shipped tiny vocabulary and
// DeepSeek-V4's).
#include <gtest/gtest.h>

#include <array>
#include <random>

#include "chat/chat_parser.h"
#include "grammar/token_mask.h"
#include "harness/files.h"
#include "server/completion_service.h"
#include "tokenizer/fixtures.h"

namespace dsv4::grammar {
namespace {

std::shared_ptr<const Grammar> json_grammar(const std::string& schema, bool reasoning = false) {
  Spec spec;
  spec.reasoning = reasoning;
  spec.json = Json::parse(schema);
  return compile(spec);
}

// Whether `text` is a whole answer of the grammar (every byte accepted, and the answer may end there).
bool accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  Matcher m(g);
  return m.feed(text) && m.can_end();
}

// Whether `text` can start an answer.
bool starts(const std::shared_ptr<const Grammar>& g, std::string_view text) { return Matcher(g).feed(text); }

std::string schema_error(const std::string& schema) {
  try {
    json_grammar(schema);
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarMatcher, AnyJsonObject) {
  const auto g = json_grammar(R"({"type": "object"})");
  for (const char* ok : {"{}", R"({"a": 1})", "{ \"a\" :\n  [1, 2.5e-3, -0, \"x\", true, false, null, {\"b\": {}}] }",
                         R"({"":""})", "{\"k\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"[]", "1", R"("a")", R"({"a" 1})", "{,}", R"({"a":1,})", R"({"a":01})", R"({"a":-})",
                          R"({"a":1.})", R"({"a":.5})", R"({"a":+1})", R"({"a":1e})", R"({'a':1})", R"({"a":tru})",
                          "{\"a\":\"\x01\"}", " {}", R"({"a":1}})", "{} ", "{}\n"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  EXPECT_TRUE(starts(g, R"({"a": [1, {"b")"));
  EXPECT_FALSE(Matcher(g).can_end());
}

TEST(GrammarMatcher, StringEscapesAndUtf8) {
  const auto g = json_grammar(R"({"type": "string"})");
  for (const char* ok : {R"("")", R"("\"\\\/\b\f\n\r\t")", R"("\u0000\u00e9\uFFFF")", R"("\ud83d\ude00")",
                         R"("\uD83D\uDE00")", R"("\uDBFF\uDFFF")", "\"\xf4\x8f\xbf\xbf\"", "\"a<b</c\""})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {R"("\ud800")", R"("\udc00")", R"("\ud800\u0041")", R"("\ud800x")", R"("\x")", R"("\u12")",
                          R"("\uD800\uD800")", "\"\xc0\x80\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
                          "\"\xe2\x82\"", "\"\x80\"", "\"\xff\"", "\"a\nb\""})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  // "<｜" (the start of the chat markers) and "</｜" are refused inside strings, written out or escaped apart.
  EXPECT_FALSE(starts(g, "\"<｜"));
  EXPECT_FALSE(starts(g, "\"a</｜"));
  EXPECT_TRUE(accepts(g, R"("<\uff5c")"));
  EXPECT_TRUE(accepts(g, "\"<<a｜\""));
}

TEST(GrammarMatcher, Numbers) {
  const auto number = json_grammar(R"({"type": "number"})");
  for (const char* ok : {"0", "-0", "12.5e+3", "1E-7", "-3.25", "10", "0.0"}) EXPECT_TRUE(accepts(number, ok)) << ok;
  for (const char* bad : {"01", "+1", "1e", "--1", "-", ".1", "1.", "1e+", "0x1", "NaN", "Infinity"})
    EXPECT_FALSE(accepts(number, bad)) << bad;
  const auto integer = json_grammar(R"({"type": "integer"})");
  EXPECT_TRUE(accepts(integer, "-120"));
  for (const char* bad : {"1.0", "1e3", "-"}) EXPECT_FALSE(accepts(integer, bad)) << bad;
  // Integers fit an int64; numbers have at most kMaxNumberBytes bytes and a two-digit exponent (a finite double);
  // never a prefix that cannot finish within them.
  const std::string most(kMaxIntegerDigits, '9');
  EXPECT_TRUE(accepts(integer, most));
  EXPECT_TRUE(accepts(integer, "-" + most));
  EXPECT_FALSE(starts(integer, most + "9"));
  EXPECT_FALSE(starts(integer, "-" + most + "9"));
  EXPECT_TRUE(accepts(number, std::string(kMaxNumberBytes, '1')));
  EXPECT_FALSE(starts(number, std::string(kMaxNumberBytes + 1, '1')));
  EXPECT_FALSE(starts(number, std::string(kMaxNumberBytes - 1, '1') + "."));
  EXPECT_TRUE(accepts(number, std::string(kMaxNumberBytes - 2, '1') + ".5"));
  EXPECT_TRUE(accepts(number, "-9.5e-99"));
  EXPECT_FALSE(starts(number, "1e100"));
}

TEST(GrammarMatcher, WhitespaceAndNestingLimits) {
  const auto g = json_grammar("{}");
  // A gap is empty, one space, or a newline and up to kMaxIndent spaces or tabs.
  EXPECT_TRUE(accepts(g, "[\n" + std::string(kMaxIndent, ' ') + "1, 2 ,\n\t3\n]"));
  EXPECT_FALSE(starts(g, "[\n" + std::string(kMaxIndent + 1, ' ')));
  for (const char* bad : {"[  1]", "[\n\n1]", "[ \n1]", "[\t1]", "[\r\n1]", "1\n"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  const int deepest = kMaxFrames - 2;  // the root frame and the innermost value's frame
  EXPECT_TRUE(accepts(g, std::string(deepest, '[') + "1" + std::string(deepest, ']')));
  EXPECT_FALSE(starts(g, std::string(deepest + 1, '[') + "1"));
  EXPECT_TRUE(accepts(g, std::string(deepest + 1, '[') + std::string(deepest + 1, ']')));
}

TEST(GrammarMatcher, ObjectSchema) {
  const auto g = json_grammar(R"({"type": "object", "additionalProperties": false, "required": ["name", "age"],
      "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer"},
                     "a": {"type": "boolean"}, "ab": {"type": "null"}, "tags": {"type": "array",
                     "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 2}}})");
  for (const char* ok : {R"({"name":"Ann","age":3})", R"({"age": 3, "name": "Ann"})",
                         R"({"name":"Ann","age":3,"a":true,"ab":null})", R"({"name":"","age":0,"tags":["x","y"]})",
                         R"({"name":"\u00e9\ud83d\ude00abc","age":1})"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {R"({"name":"Ann"})", R"({"name":"Ann","age":3,"x":1})", R"({"age":1,"age":2})",
                          R"({"name":"Ann","age":"3"})", R"({"name":"Annabel","age":3})", R"({"abc":1})",
                          R"({"name":"A","age":1,"tags":[]})", R"({"name":"A","age":1,"tags":["x","x","x"]})",
                          R"({"name":"A","age":1,"tags":["z"]})", R"({"na\u006de":"A","age":1})"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  // After the last allowed property only the close can follow.
  EXPECT_FALSE(starts(g, R"({"name":"A","age":1,"a":true,"ab":null,"tags":["x"],)"));
}

TEST(GrammarMatcher, EnumsConstUnionsAndRefs) {
  const auto e = json_grammar(R"({"enum": ["red", "green", 1, 12, null, {"k": [1]}]})");
  for (const char* ok : {R"("red")", "1", "12", "null", R"({"k":[1]})"}) EXPECT_TRUE(accepts(e, ok)) << ok;
  for (const char* bad : {R"("blue")", "2", "123", R"({"k": [1]})", R"("Red")"}) EXPECT_FALSE(accepts(e, bad)) << bad;
  EXPECT_TRUE(accepts(json_grammar(R"({"const": "x"})"), R"("x")"));
  EXPECT_TRUE(accepts(json_grammar(R"({"type": "string", "enum": ["a", 1]})"), R"("a")"));
  EXPECT_FALSE(accepts(json_grammar(R"({"type": "string", "enum": ["a", 1]})"), "1"));

  const auto optional = json_grammar(R"({"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}]})");
  EXPECT_TRUE(accepts(optional, R"("ab")"));
  EXPECT_TRUE(accepts(optional, "null"));
  EXPECT_FALSE(accepts(optional, R"("a")"));
  EXPECT_TRUE(accepts(json_grammar(R"({"type": ["integer", "boolean"]})"), "true"));

  // A recursive schema through $defs: a tree of nodes.
  const auto tree = json_grammar(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"], "additionalProperties": false}}})");
  EXPECT_TRUE(accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"v":1,"kids":[{}]})"));
  const auto extra = json_grammar(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(accepts(extra, R"({"a":1,"b":2})"));
  EXPECT_FALSE(accepts(extra, R"({"a":"x"})"));
}

TEST(GrammarMatcher, ReasoningIsFreeUpToThinkEnd) {
  const auto g = json_grammar(R"({"type": "object"})", /*reasoning=*/true);
  EXPECT_TRUE(accepts(g, "Let me think: <b> is {not} json</thi</think>{\"a\":1}"));
  EXPECT_FALSE(Matcher(g).can_end());
  EXPECT_FALSE(accepts(g, "no answer"));
  EXPECT_FALSE(starts(g, "</think>["));
}

TEST(GrammarSchema, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(schema_error(R"({"type": "integer", "minimum": 0})").find("'minimum' is not supported"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "string", "pattern": "a+"})").find("'pattern'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"properties": {"d": {"type": "string", "format": "date"}}})").find("#/properties/d"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})").find("start differently"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "object", "required": ["x"]})").find("not in 'properties'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "string", "properties": {}})").find("applies to objects"), std::string::npos);
  EXPECT_NE(schema_error(R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})").find("itself"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})")
                .find("no finite value"),
            std::string::npos);
  EXPECT_NE(schema_error("false").find("no value"), std::string::npos);
  EXPECT_NE(schema_error(R"({"enum": []})").find("non-empty"), std::string::npos);
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 1000; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_NE(schema_error(deep).find("nests deeper than"), std::string::npos);
  EXPECT_EQ(schema_error(R"({"title": "T", "description": "d", "type": "string", "default": "x"})"), "");
}

Spec weather_tools(bool single_call = false) {
  Spec spec;
  spec.tools.push_back({"get_weather", Json::parse(R"({"type": "object", "properties": {
      "town": {"type": "string", "maxLength": 10}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
      "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["town"]})")});
  spec.tools.push_back({"now", Json()});
  spec.single_call = single_call;
  return spec;
}

std::string invoke(const std::string& name, const std::string& params) {
  return std::string(kDsmlInvokeOpen) + name + "\">\n" + params + std::string(kDsmlInvokeClose);
}
std::string param(const std::string& name, bool is_string, const std::string& value) {
  return std::string(kDsmlParameterOpen) + name + "\" string=\"" + (is_string ? "true" : "false") + "\">" + value +
         std::string(kDsmlParameterClose) + "\n";
}
std::string block(const std::vector<std::string>& invokes) {
  std::string out(kDsmlBlockOpen);
  for (size_t i = 0; i < invokes.size(); ++i) out += (i ? "\n" : "") + invokes[i];
  return out + "\n" + std::string(kDsmlBlockClose);
}

TEST(GrammarDsml, ToolCallsParseBackToValidArguments) {
  const auto g = compile(weather_tools());
  const std::string call = block({invoke("get_weather", param("town", true, "Bath <3") + param("days", false, "2") +
                                                            param("unit", true, "c") + param("note", false, "null")),
                                  invoke("now", "\n")});
  ASSERT_TRUE(accepts(g, call));
  const chat::ChatParseResult parsed = chat::parse_chat_output(call, /*thinking=*/false);
  ASSERT_EQ(parsed.tool_calls.size(), 2u);
  EXPECT_EQ(parsed.content, "");
  EXPECT_EQ(Json::parse(parsed.tool_calls[0].arguments),
            Json::parse(R"({"town": "Bath <3", "days": 2, "unit": "c", "note": null})"));
  EXPECT_EQ(parsed.tool_calls[1].name, "now");
  EXPECT_EQ(parsed.tool_calls[1].arguments, "{}");

  for (const std::string& bad :
       {block({invoke("get_weather", param("days", false, "2"))}),              // the required town is missing
        block({invoke("get_weather", param("town", false, "\"Bath\""))}),      // a string goes as string="true"
        block({invoke("get_weather", param("town", true, "Bathwick upon Avon"))}),  // maxLength 10
        block({invoke("get_weather", param("town", true, "a</｜b"))}),         // only the closing tag may follow
        block({invoke("get_weather", param("town", true, "a") + param("town", true, "b"))}),
        block({invoke("get_weather", param("town", true, "a") + param("unit", true, "k"))}),
        block({invoke("get_weather", param("town", true, "a") + param("days", false, "2.5"))}),
        block({invoke("weather", "\n")}), block({invoke("now", "")}), std::string("{}"), std::string("Sure!")})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  EXPECT_FALSE(accepts(compile(weather_tools(/*single_call=*/true)), call));
  EXPECT_TRUE(accepts(compile(weather_tools(true)), block({invoke("now", "\n")})));
}

TEST(GrammarDsml, JsonOrToolCall) {
  Spec spec = weather_tools();
  spec.json = Json::parse(R"({"type": "object", "properties": {"answer": {"type": "string"}}})");
  spec.reasoning = true;
  const auto g = compile(spec);
  EXPECT_TRUE(accepts(g, "hmm</think>{\"answer\": \"rain\"}"));
  EXPECT_TRUE(accepts(g, "hmm</think>" + block({invoke("now", "\n")})));
  EXPECT_FALSE(accepts(g, "hmm</think>Rain."));
}

// The grammar vocabulary of a tokenizer file, with the model's EOS.
std::shared_ptr<const Vocabulary> vocabulary(const Tokenizer& tokenizer) {
  return server::grammar_vocabulary(tokenizer, tokenizer.vocab_size(), *tokenizer.eos_id());
}

// Walks random answers token by token and checks every mask: each token against a brute-force feed of its bytes
// into a copy of the matcher (when brute_force), and always that some token is allowed (no dead end). A step
// draws among the allowed tokens of at most 1, 2, 4 or 64 bytes (at random), so that the walks leave long
// strings and reach the structure. Returns the walk's text, with "<EOS>" if it ended.
std::string walk(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const Vocabulary>& vocab, uint32_t seed,
                 int steps, bool brute_force) {
  TokenConstraint constraint(g, vocab);
  Matcher shadow(g);
  std::mt19937 rng(seed);
  std::vector<uint32_t> bits(size_t(vocab->words()));
  State state;
  std::string text;
  for (int step = 0; step < steps; ++step) {
    const int64_t count = constraint.allowed(bits);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < vocab->size(); ++id) {
      const bool bit = (bits[size_t(id >> 5)] >> (id & 31)) & 1;
      if (bit) allowed.push_back(id);
      if (!brute_force) continue;
      bool expected = id == vocab->eos() ? shadow.can_end() : !vocab->special(id) && !vocab->bytes(id).empty();
      if (expected && id != vocab->eos()) {
        copy_state(state, shadow.state());
        for (const char c : vocab->bytes(id)) expected = expected && advance(*g, state, uint8_t(c));
      }
      EXPECT_EQ(bit, expected) << "seed " << seed << " step " << step << " token " << id << " '" << vocab->bytes(id)
                               << "' after '" << text << "'";
      if (bit != expected) return text;
    }
    EXPECT_EQ(count, int64_t(allowed.size()));
    EXPECT_FALSE(allowed.empty()) << "seed " << seed << ": a dead end after '" << text << "'";
    if (allowed.empty()) return text;
    const size_t limit = std::array<size_t, 4>{1, 2, 4, 64}[rng() % 4];
    std::vector<int32_t> pool;
    for (const int32_t id : allowed)
      if (id == vocab->eos() || vocab->bytes(id).size() <= limit) pool.push_back(id);
    if (pool.empty()) pool = allowed;
    const int32_t token = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    if (token == vocab->eos()) return text + "<EOS>";
    EXPECT_TRUE(constraint.accept(token));
    shadow.feed(vocab->bytes(token));
    text += vocab->bytes(token);
  }
  return text;
}

std::vector<std::shared_ptr<const Grammar>> walk_grammars() {
  Spec tools = weather_tools();
  tools.reasoning = true;
  Spec bounded;
  bounded.tools.push_back({"f", Json::parse(R"({"type": "object", "properties": {"s": {"type": "string",
      "minLength": 3, "maxLength": 4}, "e": {"enum": ["a<b", "x", 3]}}, "required": ["s"]})")});
  return {json_grammar(R"({"type": "object"})"),
          json_grammar(R"({"type": "object", "additionalProperties": false, "properties": {
              "name": {"type": "string", "minLength": 2, "maxLength": 3}, "n": {"type": "number"},
              "bio": {"type": "string", "maxLength": 30},
              "tags": {"type": "array", "items": {"type": "string", "maxLength": 2}, "minItems": 1, "maxItems": 3},
              "ok": {"enum": [true, "maybe", 10, 1]}, "opt": {"type": ["integer", "null"]}},
              "required": ["name", "n", "tags"]})"),
          json_grammar(R"({"type": "array", "items": {"type": "array", "items": {"type": "integer"}}})"),
          compile(weather_tools()), compile(tools), compile(bounded)};
}

TEST(GrammarMask, MatchesBruteForceOnTheTinyVocabulary) {
  const Tokenizer tokenizer = Tokenizer::from_file(test::source_path("models/tiny"));
  const auto vocab = vocabulary(tokenizer);
  for (const auto& g : walk_grammars())
    for (uint32_t seed = 1; seed <= 8; ++seed) walk(g, vocab, seed, 80, /*brute_force=*/true);
}

TEST(GrammarMask, MatchesBruteForceOnTheDeepSeekV4Vocabulary) {
  const Tokenizer tokenizer = tokfix::load(test::source_path("tests/data/tokenizer"), "deepseek-v4");
  const auto vocab = vocabulary(tokenizer);
  for (const auto& g : walk_grammars()) walk(g, vocab, 7, 20, /*brute_force=*/true);
}

// Many walks to their end: no state the grammar accepts is a dead end, and many walks finish their answer.
TEST(GrammarMask, RandomWalksNeverDeadEnd) {
  const Tokenizer tokenizer = Tokenizer::from_file(test::source_path("models/tiny"));
  const auto vocab = vocabulary(tokenizer);
  for (const auto& g : walk_grammars()) {
    int ended = 0;
    for (uint32_t seed = 100; seed < 160; ++seed) ended += walk(g, vocab, seed, 400, false).ends_with("<EOS>");
    if (!g->reasoning) {
      EXPECT_GE(ended, 20);  // (random reasoning seldom writes </think>)
    }
  }
}

}  // namespace
}  // namespace dsv4::grammar
