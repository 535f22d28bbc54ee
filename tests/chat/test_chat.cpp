// Chat format tests. Encoder: expected prompts are literal strings derived by hand from the rules of DeepSeek's
// encoding_dsv4.py (each test names the rule), plus two of the official golden prompts shipped with the model
// (encoding/tests/test_output_{1,2}.txt). Parser: hand-written model outputs, streamed in every chunking, with
// the append-only and hold-back guarantees checked at each step. See docs/design/chat-encoding.md.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "chat/chat_encoding.h"
#include "chat/chat_parser.h"
#include "chat/py_json.h"
#include "core/error.h"

namespace dsv4::chat {
namespace {

// The marker strings, typed independently of chat_tokens.h.
const std::string BOS = "<｜begin▁of▁sentence｜>";
const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string USER = "<｜User｜>";
const std::string ASSISTANT = "<｜Assistant｜>";

Message msg(Role role, std::string content) {
  Message m;
  m.role = role;
  m.content = std::move(content);
  return m;
}
Message user(std::string text) { return msg(Role::kUser, std::move(text)); }
Message system_msg(std::string text) { return msg(Role::kSystem, std::move(text)); }
Message assistant(std::string content, std::string reasoning = "", std::vector<ToolCall> calls = {}) {
  Message m = msg(Role::kAssistant, std::move(content));
  m.reasoning_content = std::move(reasoning);
  m.tool_calls = std::move(calls);
  return m;
}
Message tool_result(std::string id, std::string text) {
  Message m = msg(Role::kTool, std::move(text));
  m.tool_call_id = std::move(id);
  return m;
}

ChatOptions chat_mode() { return ChatOptions{}; }
ChatOptions thinking_mode() {
  ChatOptions o;
  o.thinking = true;
  return o;
}

// The "## Tools" section of encoding_dsv4.py's TOOLS_TEMPLATE with its markers filled in, for given schema lines.
std::string tools_section(const std::string& schemas) {
  return "## Tools\n\n"
         "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
         "\"<｜DSML｜tool_calls>\" block like the following:\n\n"
         "<｜DSML｜tool_calls>\n"
         "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
         "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
         "...\n"
         "</｜DSML｜invoke>\n"
         "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
         "...\n"
         "</｜DSML｜invoke>\n"
         "</｜DSML｜tool_calls>\n\n"
         "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after </think> with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n" +
         schemas +
         "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
}

Tool tool(const char* json_text) { return tool_from_json(OrderedJson::parse(json_text)); }

// ---------------------------------------------------------------------------------------------------------
// Encoder

// Rule: BOS, <｜User｜>{content}, then the generation prompt <｜Assistant｜> + </think> in chat mode.
TEST(ChatEncode, ChatModeSingleTurn) {
  EXPECT_EQ(encode_chat({user("Hello")}, {}, chat_mode()),
            "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>");
}

// Rule: thinking mode opens <think> after <｜Assistant｜> for the turn the model is about to write.
TEST(ChatEncode, ThinkingModeSingleTurn) {
  EXPECT_EQ(encode_chat({user("Hello")}, {}, thinking_mode()),
            "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜><think>");
}

// Rule: the system content follows BOS directly, with no separator before <｜User｜>.
TEST(ChatEncode, SystemPrompt) {
  EXPECT_EQ(encode_chat({system_msg("You are terse."), user("Hi")}, {}, chat_mode()),
            "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜></think>");
}

// Official golden prompt encoding/tests/test_output_2.txt (input test_input_2.json, thinking mode, default
// drop_thinking): the first assistant turn loses its reasoning and its user turn hands over with </think>;
// the last assistant turn (after the last user turn) keeps reasoning</think>.
TEST(ChatEncode, OfficialGoldenMultiTurnDropsEarlierReasoning) {
  const std::vector<Message> messages = {
      system_msg("You are a helpful assistant."),
      user("Hello"),
      assistant("Hi there! How can I help you?", "The user said hello, I should greet back."),
      user("What is the capital of France?"),
      assistant("The capital of France is Paris.", "The user asks about the capital of France. It is Paris."),
  };
  const std::string expected =
      "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello<｜Assistant｜></think>Hi there! How can I "
      "help you?<｜end▁of▁sentence｜><｜User｜>What is the capital of France?<｜Assistant｜><think>The user asks "
      "about the capital of France. It is Paris.</think>The capital of France is Paris.<｜end▁of▁sentence｜>";
  const std::string prompt = encode_chat(messages, {}, thinking_mode());
  EXPECT_EQ(prompt, expected);
  EXPECT_EQ(prompt.size(), 342u);  // the size of test_output_2.txt in the model repository
}

// Rules: an earlier turn's reasoning is dropped, the next user turn gets the generation prompt <think>; with
// drop_earlier_reasoning off every user turn opens <think> and every assistant turn keeps reasoning</think>;
// chat mode never renders reasoning.
TEST(ChatEncode, MultiTurnReasoningHandling) {
  const std::vector<Message> messages = {user("Q1"), assistant("A1", "R1"), user("Q2")};
  EXPECT_EQ(encode_chat(messages, {}, thinking_mode()),
            BOS + USER + "Q1" + ASSISTANT + "</think>A1" + EOS + USER + "Q2" + ASSISTANT + "<think>");
  ChatOptions keep = thinking_mode();
  keep.drop_earlier_reasoning = false;
  EXPECT_EQ(encode_chat(messages, {}, keep),
            BOS + USER + "Q1" + ASSISTANT + "<think>R1</think>A1" + EOS + USER + "Q2" + ASSISTANT + "<think>");
  EXPECT_EQ(encode_chat(messages, {}, chat_mode()),
            BOS + USER + "Q1" + ASSISTANT + "</think>A1" + EOS + USER + "Q2" + ASSISTANT + "</think>");
}

// Official golden prompt encoding/tests/test_output_1.txt (input test_input_1.json, tools attached to the
// system message, thinking mode): the tools section after "\n\n", the DSML tool call after "\n\n", the tool
// result merged into a user turn, and (tools present) the reasoning of every assistant turn kept.
TEST(ChatEncode, OfficialGoldenToolCallRoundTrip) {
  const std::vector<Tool> tools = {
      tool(R"({"type": "function", "function": {"name": "get_weather", "description":
           "Get the weather for a specific location", "parameters": {"type": "object", "properties": {"location":
           {"type": "string", "description": "The city name"}, "unit": {"type": "string", "enum": ["celsius",
           "fahrenheit"], "description": "Temperature unit"}}, "required": ["location"]}}})"),
      tool(R"({"type": "function", "function": {"name": "search", "description": "Search the web for information",
           "parameters": {"type": "object", "properties": {"query": {"type": "string", "description":
           "Search query"}, "num_results": {"type": "integer", "description": "Number of results to return"}},
           "required": ["query"]}}})"),
  };
  const std::vector<Message> messages = {
      system_msg("You are a helpful assistant."),
      user("What's the weather in Beijing?"),
      assistant("", "The user wants to know the weather in Beijing. I should use the get_weather tool.",
                {{"call_001", "get_weather", R"({"location": "Beijing", "unit": "celsius"})"}}),
      tool_result("call_001", R"({"temperature": 22, "condition": "sunny", "humidity": 45})"),
      assistant("The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.",
                "Got the weather data. Let me format a nice response."),
  };
  const std::string schemas =
      R"({"name": "get_weather", "description": "Get the weather for a specific location", "parameters": )"
      R"({"type": "object", "properties": {"location": {"type": "string", "description": "The city name"}, )"
      R"("unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}}, )"
      R"("required": ["location"]}})"
      "\n"
      R"({"name": "search", "description": "Search the web for information", "parameters": {"type": "object", )"
      R"("properties": {"query": {"type": "string", "description": "Search query"}, "num_results": )"
      R"({"type": "integer", "description": "Number of results to return"}}, "required": ["query"]}})";
  const std::string expected =
      "<｜begin▁of▁sentence｜>You are a helpful assistant.\n\n" + tools_section(schemas) +
      "<｜User｜>What's the weather in Beijing?<｜Assistant｜><think>The user wants to know the weather in Beijing. "
      "I should use the get_weather tool.</think>\n\n"
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
      "<｜User｜><tool_result>{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}</tool_result>"
      "<｜Assistant｜><think>Got the weather data. Let me format a nice response.</think>The weather in Beijing is "
      "currently sunny with a temperature of 22°C and 45% humidity.<｜end▁of▁sentence｜>";
  const std::string prompt = encode_chat(messages, tools, thinking_mode());
  EXPECT_EQ(prompt, expected);
  EXPECT_EQ(prompt.size(), 2390u);  // the size of test_output_1.txt in the model repository
  // drop_earlier_reasoning is ignored when tools are present (effective_drop_thinking = False).
  ChatOptions no_drop = thinking_mode();
  no_drop.drop_earlier_reasoning = false;
  EXPECT_EQ(encode_chat(messages, tools, no_drop), expected);
}

// Rule (encode_arguments_to_dsml): a string argument is written raw with string="true"; numbers, objects,
// arrays, booleans and null as Python json.dumps (", " / ": ") with string="false". The call follows the
// content after "\n\n"; the tool result becomes a user turn, which gets the generation prompt.
TEST(ChatEncode, ToolCallArgumentTypes) {
  const std::vector<Message> messages = {
      user("Weather?"),
      assistant("Checking.", "",
                {{"c1", "get_weather",
                  R"({"city":"Paris","days":3,"opts":{"units":["C",2.5,true,null]},"note":"say \"hi\"\nbye"})"}}),
      tool_result("c1", "sunny"),
  };
  EXPECT_EQ(encode_chat(messages, {}, chat_mode()),
            "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜></think>Checking.\n\n"
            "<｜DSML｜tool_calls>\n"
            "<｜DSML｜invoke name=\"get_weather\">\n"
            "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"units\": [\"C\", 2.5, true, null]}"
            "</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"note\" string=\"true\">say \"hi\"\nbye</｜DSML｜parameter>\n"
            "</｜DSML｜invoke>\n"
            "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
            "<｜User｜><tool_result>sunny</tool_result><｜Assistant｜></think>");
}

// Rules: several calls are joined by "\n" inside one block; a call without arguments has an empty parameter
// list ("\n\n" between the tags); tool results answering one assistant turn are merged into one user turn in
// the order of the calls (sort_tool_results_by_call_order), and a following user message joins the same turn,
// all parts separated by "\n\n".
TEST(ChatEncode, ToolResultsMergedInCallOrder) {
  const std::vector<Message> messages = {
      user("Compare"),
      assistant("", "", {{"a", "f", R"({"x": 1})"}, {"b", "g", "{}"}}),
      tool_result("b", "B"),
      tool_result("a", "A"),
      user("Thanks"),
  };
  EXPECT_EQ(encode_chat(messages, {}, chat_mode()),
            "<｜begin▁of▁sentence｜><｜User｜>Compare<｜Assistant｜></think>\n\n"
            "<｜DSML｜tool_calls>\n"
            "<｜DSML｜invoke name=\"f\">\n"
            "<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n"
            "</｜DSML｜invoke>\n"
            "<｜DSML｜invoke name=\"g\">\n"
            "\n"
            "</｜DSML｜invoke>\n"
            "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
            "<｜User｜><tool_result>A</tool_result>\n\n<tool_result>B</tool_result>\n\nThanks<｜Assistant｜></think>");
}

// Rule (request-level tools without a system message, the vLLM convention): an empty system message carries
// the tools, so the prompt starts BOS + "\n\n## Tools".
TEST(ChatEncode, ToolsWithoutSystemMessage) {
  const std::vector<Tool> tools = {tool(R"({"type": "function", "function": {"name": "now", "parameters": {}}})")};
  EXPECT_EQ(encode_chat({user("Time?")}, tools, chat_mode()),
            BOS + "\n\n" + tools_section(R"({"name": "now", "parameters": {}})") + USER + "Time?" + ASSISTANT +
                "</think>");
}

// Rule: consecutive user messages are merged into one user turn joined by "\n\n".
TEST(ChatEncode, ConsecutiveUserMessagesMerge) {
  EXPECT_EQ(encode_chat({user("a"), user("b")}, {}, chat_mode()),
            "<｜begin▁of▁sentence｜><｜User｜>a\n\nb<｜Assistant｜></think>");
}

// Rule: reasoning_effort "max" puts REASONING_EFFORT_MAX right after BOS, in thinking mode only.
TEST(ChatEncode, ReasoningEffortMax) {
  ChatOptions o = thinking_mode();
  o.reasoning_effort = ReasoningEffort::kMax;
  EXPECT_EQ(encode_chat({user("Hello")}, {}, o),
            "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
            "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
            "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
            "adversarial scenarios.\n"
            "Explicitly write out your entire deliberation process, documenting every intermediate step, "
            "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
            "unchecked.\n\n"
            "<｜User｜>Hello<｜Assistant｜><think>");
  o.reasoning_effort = ReasoningEffort::kHigh;  // accepted, renders nothing
  EXPECT_EQ(encode_chat({user("Hello")}, {}, o), BOS + USER + "Hello" + ASSISTANT + "<think>");
  ChatOptions chat = chat_mode();
  chat.reasoning_effort = ReasoningEffort::kMax;
  EXPECT_EQ(encode_chat({user("Hello")}, {}, chat), BOS + USER + "Hello" + ASSISTANT + "</think>");
}

// Options: no generation prompt after the final user turn; no BOS.
TEST(ChatEncode, GenerationPromptAndBosOptions) {
  ChatOptions o = chat_mode();
  o.add_generation_prompt = false;
  EXPECT_EQ(encode_chat({user("Hello")}, {}, o), "<｜begin▁of▁sentence｜><｜User｜>Hello");
  o = thinking_mode();
  o.add_bos = false;
  EXPECT_EQ(encode_chat({user("Hello")}, {}, o), "<｜User｜>Hello<｜Assistant｜><think>");
}

// Rule (wo_eos): a prefix assistant message is left open for the model to continue.
TEST(ChatEncode, PrefixAssistantMessage) {
  Message prefix = assistant("```python\n");
  prefix.prefix = true;
  EXPECT_EQ(encode_chat({user("Write quicksort"), prefix}, {}, chat_mode()),
            "<｜begin▁of▁sentence｜><｜User｜>Write quicksort<｜Assistant｜></think>```python\n");
}

// Rules: latest_reminder is <｜latest_reminder｜>{content}; developer is a user turn (<｜User｜>{content});
// in thinking mode with dropping, a developer turn before the last user turn is removed entirely.
TEST(ChatEncode, DeveloperAndLatestReminder) {
  const std::vector<Message> messages = {system_msg("S"), msg(Role::kLatestReminder, "2026-02-21,App"),
                                         msg(Role::kDeveloper, "Dev question"), assistant("A", "R"), user("Q2")};
  EXPECT_EQ(encode_chat(messages, {}, chat_mode()),
            BOS + "S<｜latest_reminder｜>2026-02-21,App" + USER + "Dev question" + ASSISTANT + "</think>A" + EOS +
                USER + "Q2" + ASSISTANT + "</think>");
  EXPECT_EQ(encode_chat(messages, {}, thinking_mode()),
            BOS + "S<｜latest_reminder｜>2026-02-21,AppA" + EOS + USER + "Q2" + ASSISTANT + "<think>");
}

TEST(ChatEncode, MalformedMessagesThrow) {
  EXPECT_THROW(encode_chat({user("q"), tool_result("", "r")}, {}, chat_mode()), Error);  // tool without id
  EXPECT_THROW(parse_role("robot"), Error);
  EXPECT_THROW(message_from_json(OrderedJson::parse(R"({"role": "robot", "content": "x"})")), Error);
  EXPECT_THROW(message_from_json(OrderedJson::parse(R"({"content": "x"})")), Error);
  // A part's "type" of another JSON type is the same Error (it was a JSON type_error: a 500 on /tokenize).
  EXPECT_THROW(message_from_json(OrderedJson::parse(R"({"role": "user", "content": [{"type": {}}]})")), Error);
  EXPECT_THROW(encode_chat({user("q"), assistant("", "", {{"c", "f", "[1, 2]"}})}, {}, chat_mode()), Error);
  EXPECT_THROW(encode_chat({user("q"), assistant("", "", {{"c", "", "{}"}})}, {}, chat_mode()), Error);
  Message user_with_calls = user("q");
  user_with_calls.tool_calls = {{"c", "f", "{}"}};
  EXPECT_THROW(encode_chat({user_with_calls}, {}, chat_mode()), Error);
  EXPECT_THROW(encode_chat({msg(Role::kDeveloper, "")}, {}, chat_mode()), Error);
  Message prefix = assistant("x");
  prefix.prefix = true;
  EXPECT_THROW(encode_chat({user("q"), prefix, user("r")}, {}, chat_mode()), Error);
  EXPECT_THROW(tool(R"({"type": "function", "function": {"description": "no name"}})"), Error);
  EXPECT_THROW(encode_chat({user("q")}, {Tool{OrderedJson::parse(R"({"name": "bare"})")}}, chat_mode()), Error);
}

// Arguments that are not JSON become one string parameter "arguments" (encoding_dsv4.py's fallback); empty
// arguments mean no parameters.
TEST(ChatEncode, NonJsonAndEmptyArguments) {
  EXPECT_EQ(render_tool_calls({{"", "f", "not json"}}),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
            "<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n"
            "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  EXPECT_EQ(render_tool_calls({{"", "f", ""}}),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
}

// The OpenAI JSON form gives the same prompt as the structs; content parts, "reasoning" alias, object arguments.
TEST(ChatEncode, MessagesFromOpenAiJson) {
  const OrderedJson j = OrderedJson::parse(R"([
    {"role": "system", "content": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]},
    {"role": "user", "content": "Q"},
    {"role": "assistant", "content": null, "reasoning": "R",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"b": 2, "a": "x"}}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "ok"}
  ])");
  std::vector<Message> messages;
  for (const auto& m : j) messages.push_back(message_from_json(m));
  ASSERT_EQ(messages.size(), 4u);
  EXPECT_EQ(messages[0].content, "S1\n\nS2");
  EXPECT_EQ(messages[2].reasoning_content, "R");
  EXPECT_EQ(messages[2].tool_calls[0].arguments, R"({"b": 2, "a": "x"})");
  EXPECT_EQ(messages[3].tool_call_id, "c1");
  const std::vector<Message> expected = {
      system_msg("S1\n\nS2"), user("Q"), assistant("", "R", {{"c1", "f", R"({"b": 2, "a": "x"})"}}),
      tool_result("c1", "ok")};
  ChatOptions keep = thinking_mode();
  keep.drop_earlier_reasoning = false;
  EXPECT_EQ(encode_chat(messages, {}, keep), encode_chat(expected, {}, keep));
  EXPECT_NE(encode_chat(messages, {}, keep).find("<｜DSML｜parameter name=\"b\" string=\"false\">2"), std::string::npos);
}

// Python json.dumps(..., ensure_ascii=False) spelling; the expected text was produced by Python 3.11.
TEST(ChatPyJson, MatchesPythonJsonDumps) {
  const OrderedJson v = OrderedJson::parse(
      R"({"b": 1, "a": [1.0, 1e-5, 0.0001, 1e16, 1e15, -2.5e-7, 123456789.125, 0.1, 100.0, 1e22, -0.0],)"
      R"( "s": "é\u001f\"\\\n\t/", "t": true, "n": null, "big": 18446744073709551615, "neg": -7, "e": {}, "l": []})");
  EXPECT_EQ(py_json_dumps(v),
            R"({"b": 1, "a": [1.0, 1e-05, 0.0001, 1e+16, 1000000000000000.0, -2.5e-07, 123456789.125, 0.1, 100.0,)"
            R"( 1e+22, -0.0], "s": "é\u001f\"\\\n\t/", "t": true, "n": null, "big": 18446744073709551615,)"
            R"( "neg": -7, "e": {}, "l": []})");
}

// ---------------------------------------------------------------------------------------------------------
// Parser

std::string json_args(const ParsedToolCall& call) { return nlohmann::json::parse(call.arguments).dump(); }

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

void expect_same(const ChatParseResult& a, const ChatParseResult& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.stopped, b.stopped) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t k = 0; k < a.tool_calls.size(); ++k) {
    EXPECT_EQ(a.tool_calls[k].name, b.tool_calls[k].name) << what;
    EXPECT_EQ(a.tool_calls[k].arguments, b.tool_calls[k].arguments) << what;
    EXPECT_EQ(a.tool_calls[k].complete, b.tool_calls[k].complete) << what;
  }
}

// Feeds `text` in pieces of the given sizes (cycled), checking after every piece that the result only grew
// (so deltas are well defined) and, for valid UTF-8 input, that reasoning / content never end inside a
// character.
ChatParseResult parse_in_chunks(const std::string& text, bool thinking, const std::vector<size_t>& sizes) {
  const bool check_utf8 = valid_utf8(text);
  ChatParser parser(thinking);
  ChatParseResult prev;
  size_t at = 0;
  for (size_t k = 0; at < text.size(); ++k) {
    const size_t n = std::min(sizes[k % sizes.size()], text.size() - at);
    parser.feed(std::string_view(text).substr(at, n));
    at += n;
    const ChatParseResult& now = parser.result();
    EXPECT_TRUE(now.reasoning.starts_with(prev.reasoning));
    EXPECT_TRUE(now.content.starts_with(prev.content));
    if (check_utf8) {
      EXPECT_TRUE(valid_utf8(now.reasoning) && valid_utf8(now.content)) << "after " << at << " bytes";
    }
    EXPECT_GE(now.tool_calls.size(), prev.tool_calls.size());
    for (size_t c = 0; c < prev.tool_calls.size() && c < now.tool_calls.size(); ++c) {
      EXPECT_EQ(now.tool_calls[c].name, prev.tool_calls[c].name);
      EXPECT_TRUE(now.tool_calls[c].arguments.starts_with(prev.tool_calls[c].arguments));
      EXPECT_TRUE(now.tool_calls[c].complete || !prev.tool_calls[c].complete);
    }
    prev = now;
  }
  parser.finish();
  return parser.result();
}

// Model outputs as the encoder writes the assistant turn (everything after the generation prompt).
const std::string kContentOnly = "Paris is the capital of France — 巴黎.<｜end▁of▁sentence｜>";
const std::string kReasoningAndContent =
    "The user asks 2+2. That is 4.\n\nSimple.</think>The answer is 4.\n\nAnything else?<｜end▁of▁sentence｜>";
// The first assistant turn of the official test_output_1.txt.
const std::string kOneToolCall =
    "The user wants to know the weather in Beijing. I should use the get_weather tool.</think>\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
const std::string kTwoToolCalls =
    "Let me look both up.\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"search\">\n"
    "<｜DSML｜parameter name=\"query\" string=\"true\">say \"hi\"\n<b>ü</b></｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"num_results\" string=\"false\">3</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"filters\" string=\"false\">{\"lang\": [\"en\", \"zh\"], \"safe\": true}"
    "</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"now\">\n"
    "\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls><｜end▁of▁sentence｜>";

TEST(ChatParse, ContentOnly) {
  const ChatParseResult r = parse_chat_output(kContentOnly, /*thinking=*/false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Paris is the capital of France — 巴黎.");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_TRUE(r.stopped);
}

TEST(ChatParse, ReasoningAndContent) {
  const ChatParseResult r = parse_chat_output(kReasoningAndContent, /*thinking=*/true);
  EXPECT_EQ(r.reasoning, "The user asks 2+2. That is 4.\n\nSimple.");
  EXPECT_EQ(r.content, "The answer is 4.\n\nAnything else?");  // "\n\n" not followed by a block stays
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_TRUE(r.stopped);
}

// Arguments are rebuilt as encoding_dsv4.py's decode_dsml_to_arguments writes them: {"k": v, ...}.
TEST(ChatParse, OneToolCall) {
  const ChatParseResult r = parse_chat_output(kOneToolCall, /*thinking=*/true);
  EXPECT_EQ(r.reasoning, "The user wants to know the weather in Beijing. I should use the get_weather tool.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"location": "Beijing", "unit": "celsius"})");
  EXPECT_TRUE(r.tool_calls[0].complete);
  EXPECT_TRUE(r.stopped);
}

TEST(ChatParse, SeveralToolCalls) {
  const ChatParseResult r = parse_chat_output(kTwoToolCalls, /*thinking=*/false);
  EXPECT_EQ(r.content, "Let me look both up.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "search");
  EXPECT_EQ(r.tool_calls[0].arguments,
            R"({"query": "say \"hi\"\n<b>ü</b>", "num_results": 3, "filters": {"lang": ["en", "zh"], "safe": true}})");
  EXPECT_EQ(json_args(r.tool_calls[0]),
            R"({"filters":{"lang":["en","zh"],"safe":true},"num_results":3,"query":"say \"hi\"\n<b>ü</b>"})");
  EXPECT_EQ(r.tool_calls[1].name, "now");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  EXPECT_TRUE(r.tool_calls[0].complete && r.tool_calls[1].complete);
  EXPECT_TRUE(r.stopped);
}

// Streaming: 1-byte chunks, assorted chunk sizes and every two-piece split give the one-shot result.
TEST(ChatParse, StreamingMatchesOneShot) {
  const std::vector<std::pair<std::string, bool>> cases = {
      {kContentOnly, false}, {kReasoningAndContent, true}, {kOneToolCall, true}, {kTwoToolCalls, false}};
  std::mt19937 rng(1234);
  for (const auto& [text, thinking] : cases) {
    const ChatParseResult whole = parse_chat_output(text, thinking);
    expect_same(parse_in_chunks(text, thinking, {1}), whole, "1-byte chunks");
    std::vector<size_t> sizes(64);
    for (size_t& s : sizes) s = 1 + rng() % 9;
    expect_same(parse_in_chunks(text, thinking, sizes), whole, "random chunks");
    for (size_t split = 0; split <= text.size(); ++split) {
      expect_same(parse_in_chunks(text, thinking, {split == 0 ? text.size() : split, text.size()}), whole,
                  "split at " + std::to_string(split));
    }
  }
}

// A possible marker at the end of a chunk is held back until the next chunk decides.
TEST(ChatParse, PartialMarkerIsHeldBack) {
  ChatParser p(/*thinking=*/false);
  p.feed("Hello<｜DS");
  EXPECT_EQ(p.result().content, "Hello");
  p.feed("ML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"false\">1");
  EXPECT_EQ(p.result().content, "Hello");
  ASSERT_EQ(p.result().tool_calls.size(), 1u);
  EXPECT_EQ(p.result().tool_calls[0].name, "f");
  EXPECT_EQ(p.result().tool_calls[0].arguments, "{");  // the parameter is not closed yet
  EXPECT_FALSE(p.result().tool_calls[0].complete);
  p.feed("</｜DSML｜parameter>\n</｜DSML｜inv");
  EXPECT_EQ(p.result().tool_calls[0].arguments, "{\"a\": 1");
  p.feed("oke>\n</｜DSML｜tool_calls><｜end▁of");
  EXPECT_EQ(p.result().tool_calls[0].arguments, "{\"a\": 1}");
  EXPECT_TRUE(p.result().tool_calls[0].complete);
  EXPECT_FALSE(p.result().stopped);
  p.feed("▁sentence｜>");
  EXPECT_TRUE(p.result().stopped);

  // "\n\n" may introduce a tool-call block: held until the next text shows it does not.
  ChatParser q(false);
  q.feed("Hi\n");
  EXPECT_EQ(q.result().content, "Hi");
  q.feed("\n");
  EXPECT_EQ(q.result().content, "Hi");
  q.feed("there");
  EXPECT_EQ(q.result().content, "Hi\n\nthere");

  // </think> split across chunks.
  ChatParser t(/*thinking=*/true);
  t.feed("abc</th");
  EXPECT_EQ(t.result().reasoning, "abc");
  t.feed("ink>x");
  EXPECT_EQ(t.result().reasoning, "abc");
  EXPECT_EQ(t.result().content, "x");

  // Something that looked like a marker but is not is released; so is a completed UTF-8 character.
  ChatParser u(false);
  u.feed("a<｜DSMX");
  EXPECT_EQ(u.result().content, "a<｜DSMX");
  u.feed(" caf\xC3");
  EXPECT_EQ(u.result().content, "a<｜DSMX caf");
  u.feed("\xA9");
  EXPECT_EQ(u.result().content, "a<｜DSMX café");

  // A possible EOS is held back; at the end of generation held-back text is plain text.
  ChatParser v(false);
  v.feed("done\n\n<｜end");
  EXPECT_EQ(v.result().content, "done\n\n");
  v.finish();
  EXPECT_EQ(v.result().content, "done\n\n<｜end");
  EXPECT_FALSE(v.result().stopped);
  EXPECT_THROW(v.feed("more"), Error);
}

// Generation cut off inside a tool call: the call is reported with the parameters finished so far.
TEST(ChatParse, TruncatedToolCall) {
  const ChatParseResult r = parse_chat_output(
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"b\" string=\"true\">par",
      false);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"a\": 1");
  EXPECT_FALSE(r.tool_calls[0].complete);
  EXPECT_FALSE(r.stopped);
}

TEST(ChatParse, MalformedToolCallsThrow) {
  const std::string open = "x\n\n<｜DSML｜tool_calls>\n";
  EXPECT_THROW(parse_chat_output(open + "<｜DSML｜bogus>", false), Error);
  EXPECT_THROW(parse_chat_output(open + "<｜DSML｜invoke name=\"f\">\nhello", false), Error);
  EXPECT_THROW(parse_chat_output(open + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\">1"
                                        "</｜DSML｜parameter>",
                                 false),
               Error);  // no string attribute
  EXPECT_THROW(parse_chat_output(open + "<｜DSML｜invoke name=\"f\">\n"
                                        "<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
                                        "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>",
                                 false),
               Error);  // duplicate parameter
  EXPECT_THROW(parse_chat_output(open + "</｜DSML｜tool_calls>trailing", false), Error);
  EXPECT_THROW(parse_chat_output(open + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">"
                                        "v<｜end▁of▁sentence｜>",
                                 false),
               Error);  // EOS inside a parameter value
}

// A string="false" value that is not JSON is kept as a JSON string so the arguments stay valid JSON; text
// after EOS is ignored.
TEST(ChatParse, InvalidJsonValueAndTextAfterEos) {
  const ChatParseResult r = parse_chat_output(
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">not json</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>ignored",
      false);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"n": "not json"})");
  EXPECT_TRUE(r.stopped);
  const ChatParseResult s = parse_chat_output("a<｜end▁of▁sentence｜>b</think>", false);
  EXPECT_EQ(s.content, "a");
  EXPECT_TRUE(s.stopped);
}

// Fuzz: random texts built from marker fragments, whole markers and plain text. However a text is chunked the
// parser reaches the same result, or throws Error in both cases; nothing else may escape.
TEST(ChatParse, FuzzChunkingInvariance) {
  const std::vector<std::string> pieces = {
      "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>", "<｜DSML｜parameter",
      "</｜DSML｜parameter>", " name=\"f\"", " string=\"true\"", " string=\"false\"", "\">", ">", "\n", "\n\n",
      "</think>", "<think>", "<｜end▁of▁sentence｜>", "<｜", "DSML", "｜", "<", "/", "x", "42", "é", "\xE4\xB8",
      "\xAD", "{\"k\": [1]}", " "};
  std::mt19937 rng(20260421);
  size_t threw = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    if (iter % 3 == 0) text = "r</think>c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n";  // reach tool states
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) text += pieces[rng() % pieces.size()];
    const bool thinking = rng() % 2 == 0;
    const auto attempt = [&](const std::vector<size_t>& sizes) -> std::optional<ChatParseResult> {
      try {
        return parse_in_chunks(text, thinking, sizes);
      } catch (const Error&) {
        return std::nullopt;
      }
    };
    const std::optional<ChatParseResult> whole = attempt({text.size()});
    std::vector<size_t> sizes(16);
    for (size_t& s : sizes) s = 1 + rng() % 5;
    for (const auto& chunks : {std::vector<size_t>{1}, sizes}) {
      const std::optional<ChatParseResult> streamed = attempt(chunks);
      ASSERT_EQ(whole.has_value(), streamed.has_value()) << "text: " << text;
      if (whole) expect_same(*streamed, *whole, "text: " + text);
    }
    threw += !whole.has_value();
  }
  EXPECT_GT(threw, 100u);   // the fuzzer reaches malformed markup ...
  EXPECT_LT(threw, 2900u);  // ... and well-formed paths
}

// The parser inverts the encoder: an assistant turn encoded with tool calls parses back to the same content,
// names and arguments (compared as JSON values).
TEST(ChatParse, InvertsTheEncoder) {
  const std::vector<ToolCall> calls = {
      {"c1", "write_file", R"({"path": "/tmp/a b.txt", "text": "line 1\nline \"2\" </x>", "mode": 420})"},
      {"c2", "list", R"({"dirs": ["/", "/tmp"], "deep": false, "limit": null, "ratio": 0.25})"}};
  const std::string prompt = encode_chat({user("go"), assistant("On it.", "", calls)}, {}, chat_mode());
  const std::string marker = ASSISTANT + "</think>";
  const std::string generated = prompt.substr(prompt.rfind(marker) + marker.size());
  const ChatParseResult r = parse_in_chunks(generated, false, {1});
  EXPECT_EQ(r.content, "On it.");
  ASSERT_EQ(r.tool_calls.size(), calls.size());
  for (size_t k = 0; k < calls.size(); ++k) {
    EXPECT_EQ(r.tool_calls[k].name, calls[k].name);
    EXPECT_EQ(nlohmann::json::parse(r.tool_calls[k].arguments), nlohmann::json::parse(calls[k].arguments));
  }
  EXPECT_TRUE(r.stopped);
}

}  // namespace
}  // namespace dsv4::chat
