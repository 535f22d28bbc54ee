// DeepSeek-V4 prompt encoder. The steps follow encoding_dsv4.py's encode_messages: attach the tools, merge
// tool results into user turns, order them by call, drop earlier reasoning, then render turn by turn.
#include "chat/chat_encoding.h"

#include <algorithm>
#include <map>

#include "chat/chat_tokens.h"
#include "core/error.h"

namespace dsv4::chat {

namespace {

constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

// The tools section; @SCHEMAS@ becomes one json.dumps line per function. The markers are spelled out.
constexpr std::string_view kToolsTemplate =
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜tool_calls>\" block like the following:\n"
    "\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n"
    "@SCHEMAS@\n"
    "\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

// A user turn after merging: its text and tool results, in order, joined with "\n\n" when rendered.
struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_use_id;
};

// One turn of the merged conversation. `msg` points into the caller's messages (null for a merged user turn
// and for the synthetic system turn that carries tools).
struct Turn {
  Role role = Role::kUser;
  const Message* msg = nullptr;
  std::vector<Block> blocks;  // user turns
  bool has_tools = false;
};

// The "function" object of an OpenAI tool definition, checked.
const OrderedJson& tool_function(const Tool& tool) {
  const OrderedJson& d = tool.definition;
  DSV4_CHECK(d.is_object(), "tool definition: expected a JSON object, got ", d.dump());
  const auto it = d.find("function");
  DSV4_CHECK(it != d.end() && it->is_object(),
             "tool definition: expected {\"type\": \"function\", \"function\": {...}}, got ", d.dump());
  const auto name = it->find("name");
  DSV4_CHECK(name != it->end() && name->is_string() && !name->get_ref<const std::string&>().empty(),
             "tool definition: function.name must be a non-empty string in ", d.dump());
  return *it;
}

void validate(const std::vector<Message>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    const std::string where = cat("message ", i, " (", role_name(m.role), ")");
    if (m.role == Role::kTool) {
      DSV4_CHECK(!m.tool_call_id.empty(), where, ": a tool message needs tool_call_id (the id of the call it answers)");
    }
    if (m.role != Role::kAssistant) {
      DSV4_CHECK(m.tool_calls.empty(), where, ": only assistant messages carry tool_calls");
      DSV4_CHECK(!m.prefix, where, ": only an assistant message can be a prefix");
    }
    if (m.role == Role::kDeveloper) DSV4_CHECK(!m.content.empty(), where, ": a developer message needs content");
    if (m.prefix) DSV4_CHECK(i + 1 == messages.size(), where, ": a prefix message must be the last message");
    for (const ToolCall& call : m.tool_calls) {
      DSV4_CHECK(!call.name.empty(), where, ": a tool call needs a function name");
    }
  }
}

// Steps 1-2 of encode_messages: tools on the first message, tool messages merged into user turns. A tool
// result joins the preceding user turn if there is one; a user message joins a preceding user turn (so
// consecutive user messages become one turn, parts joined with "\n\n").
std::vector<Turn> merge_turns(const std::vector<Message>& messages, bool has_tools) {
  std::vector<Turn> turns;
  size_t first = 0;
  if (has_tools) {
    if (!messages.empty() && (messages[0].role == Role::kSystem || messages[0].role == Role::kDeveloper)) {
      turns.push_back({messages[0].role, &messages[0], {}, true});
      first = 1;
    } else {
      turns.push_back({Role::kSystem, nullptr, {}, true});  // empty system message for the tools
    }
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const Message& m = messages[i];
    const bool after_user = !turns.empty() && turns.back().role == Role::kUser && turns.back().msg == nullptr;
    if (m.role == Role::kTool || m.role == Role::kUser) {
      Block block = m.role == Role::kTool ? Block{true, m.content, m.tool_call_id} : Block{false, m.content, {}};
      if (after_user) {
        turns.back().blocks.push_back(std::move(block));
      } else {
        Turn t{Role::kUser, nullptr, {}, false};
        t.blocks.push_back(std::move(block));
        turns.push_back(std::move(t));
      }
    } else {
      turns.push_back({m.role, &m, {}, false});
    }
  }
  return turns;
}

// Step 3: when a user turn holds several tool results, order them as the latest assistant turn with tool
// calls issued them (stable; unknown ids count as position 0, as in encoding_dsv4.py).
void sort_tool_results(std::vector<Turn>& turns) {
  std::map<std::string, size_t> order;
  for (Turn& t : turns) {
    if (t.role == Role::kAssistant && !t.msg->tool_calls.empty()) {
      order.clear();
      for (size_t k = 0; k < t.msg->tool_calls.size(); ++k) {
        if (!t.msg->tool_calls[k].id.empty()) order[t.msg->tool_calls[k].id] = k;  // a repeated id: the last wins
      }
    } else if (t.role == Role::kUser && !order.empty()) {
      std::vector<Block> results;
      for (const Block& b : t.blocks)
        if (b.tool_result) results.push_back(b);
      if (results.size() < 2) continue;
      const auto rank = [&](const Block& b) {
        const auto it = order.find(b.tool_use_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : t.blocks)
        if (b.tool_result) b = results[next++];
    }
  }
}

// Index of the last user / developer turn, or -1.
long last_user_index(const std::vector<Turn>& turns) {
  for (size_t i = turns.size(); i-- > 0;) {
    if (turns[i].role == Role::kUser || turns[i].role == Role::kDeveloper) return static_cast<long>(i);
  }
  return -1;
}

// Step 4 (thinking mode with drop_thinking): before the last user turn, assistant turns lose their reasoning
// and developer turns are removed; everything from the last user turn on is kept.
std::vector<Turn> drop_earlier_reasoning(std::vector<Turn> turns) {
  const long last_user = last_user_index(turns);
  std::vector<Turn> kept;
  for (size_t i = 0; i < turns.size(); ++i) {
    Turn& t = turns[i];
    if (static_cast<long>(i) >= last_user || t.role == Role::kUser || t.role == Role::kSystem ||
        t.role == Role::kLatestReminder) {
      kept.push_back(std::move(t));
    } else if (t.role == Role::kAssistant) {
      kept.push_back(std::move(t));  // its reasoning is not rendered: it precedes the last user turn
    }
  }
  return kept;
}

// encode_arguments_to_dsml: one <｜DSML｜parameter> line per argument; strings raw with string="true",
// anything else as json.dumps with string="false". Arguments that are not JSON become one string
// parameter named "arguments", as in encoding_dsv4.py.
std::string render_parameters(const ToolCall& call) {
  const auto blank = call.arguments.find_first_not_of(" \t\r\n") == std::string::npos;
  if (blank) return "";
  OrderedJson args = OrderedJson::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded()) args = OrderedJson{{"arguments", call.arguments}};
  DSV4_CHECK(args.is_object(), "tool call '", call.name, "': arguments must be a JSON object, got ", call.arguments);
  std::string out;
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) out += '\n';
    first = false;
    out += kParameterOpen;
    out += " name=\"" + key + "\" string=\"";
    if (value.is_string()) {
      out += "true\">" + value.get<std::string>();
    } else {
      out += "false\">" + py_json_dumps(value);
    }
    out += kParameterClose;
  }
  return out;
}

std::string render_user(const Turn& t) {
  std::string out(kUser);
  for (size_t k = 0; k < t.blocks.size(); ++k) {
    if (k > 0) out += "\n\n";
    const Block& b = t.blocks[k];
    if (b.tool_result) {
      out += kToolResultOpen;
      out += b.text;
      out += kToolResultClose;
    } else {
      out += b.text;
    }
  }
  return out;
}

}  // namespace

Role parse_role(std::string_view name) {
  if (name == "system") return Role::kSystem;
  if (name == "user") return Role::kUser;
  if (name == "assistant") return Role::kAssistant;
  if (name == "tool") return Role::kTool;
  if (name == "developer") return Role::kDeveloper;
  if (name == "latest_reminder") return Role::kLatestReminder;
  fail(cat("unknown message role '", name,
           "' (expected system, user, assistant, tool, developer or latest_reminder)"));
}

std::string_view role_name(Role role) {
  switch (role) {
    case Role::kSystem: return "system";
    case Role::kUser: return "user";
    case Role::kAssistant: return "assistant";
    case Role::kTool: return "tool";
    case Role::kDeveloper: return "developer";
    case Role::kLatestReminder: return "latest_reminder";
  }
  return "?";
}

std::string render_tools(const std::vector<Tool>& tools) {
  std::string schemas;
  for (const Tool& tool : tools) {
    if (!schemas.empty()) schemas += '\n';
    schemas += py_json_dumps(tool_function(tool));
  }
  std::string out(kToolsTemplate);
  const size_t at = out.find("@SCHEMAS@");
  out.replace(at, 9, schemas);
  return out;
}

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  if (calls.empty()) return "";
  std::string out(kToolCallsLead);
  out += kToolCallsOpen;
  out += '\n';
  for (size_t k = 0; k < calls.size(); ++k) {
    if (k > 0) out += '\n';
    out += kInvokeOpen;
    out += " name=\"" + calls[k].name + "\">\n";
    out += render_parameters(calls[k]);
    out += '\n';
    out += kInvokeClose;
  }
  out += '\n';
  out += kToolCallsClose;
  return out;
}

std::string encode_chat(const std::vector<Message>& messages, const std::vector<Tool>& tools,
                        const ChatOptions& options) {
  validate(messages);
  const bool has_tools = !tools.empty();
  const std::string tools_text = has_tools ? render_tools(tools) : "";

  std::vector<Turn> turns = merge_turns(messages, has_tools);
  sort_tool_results(turns);
  // Conversations with tools keep every turn's reasoning (the model tracks multi-step tool use).
  const bool drop = options.drop_earlier_reasoning && !has_tools;
  if (options.thinking && drop) turns = drop_earlier_reasoning(std::move(turns));
  const long last_user = last_user_index(turns);

  std::string prompt = options.add_bos ? std::string(kBos) : std::string();
  if (options.thinking && options.reasoning_effort == ReasoningEffort::kMax && !turns.empty()) {
    prompt += kReasoningEffortMax;
  }

  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& t = turns[i];
    const long index = static_cast<long>(i);
    switch (t.role) {
      case Role::kSystem:
        if (t.msg) prompt += t.msg->content;
        if (t.has_tools) prompt += "\n\n" + tools_text;
        break;
      case Role::kDeveloper:
        prompt += kUser;
        prompt += t.msg->content;
        if (t.has_tools) prompt += "\n\n" + tools_text;
        break;
      case Role::kUser: prompt += render_user(t); break;
      case Role::kLatestReminder:
        prompt += kLatestReminder;
        prompt += t.msg->content;
        break;
      case Role::kAssistant: {
        // Reasoning is rendered (closed by </think>; the <think> ended the preceding user turn) in thinking mode
        // unless dropping applies and the turn precedes the last user turn.
        if (options.thinking && (!drop || index > last_user)) {
          prompt += t.msg->reasoning_content;
          prompt += kThinkEnd;
        }
        prompt += t.msg->content;
        prompt += render_tool_calls(t.msg->tool_calls);
        if (!t.msg->prefix) prompt += kEos;
        break;
      }
      case Role::kTool: DSV4_ASSERT(false); break;  // merged into user turns
    }

    // A user / developer turn followed by the assistant (or by nothing: the generation prompt) hands over:
    // <｜Assistant｜> then <think> (thinking mode, for the turn that will get reasoning) or </think>.
    const bool last = i + 1 == turns.size();
    if (!last && turns[i + 1].role != Role::kAssistant && turns[i + 1].role != Role::kLatestReminder) continue;
    if (t.role != Role::kUser && t.role != Role::kDeveloper) continue;
    if (last && !options.add_generation_prompt) continue;
    prompt += kAssistant;
    prompt += options.thinking && (!drop || index >= last_user) ? kThinkStart : kThinkEnd;
  }
  return prompt;
}

namespace {

std::string text_content(const OrderedJson& content, const std::string& where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  DSV4_CHECK(content.is_array(), where, ".content: expected a string, null or an array of text parts");
  std::string out;
  for (size_t k = 0; k < content.size(); ++k) {
    const OrderedJson& part = content[k];
    // (value("type", "") would throw a JSON type error for a "type" that is not a string.)
    DSV4_CHECK(part.is_object() && part.contains("type") && part["type"] == "text" && part.contains("text") &&
                   part["text"].is_string(),
               where, ".content[", k, "]: only {\"type\": \"text\", \"text\": ...} parts are supported");
    if (k > 0) out += "\n\n";
    out += part["text"].get<std::string>();
  }
  return out;
}

std::string optional_string(const OrderedJson& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  DSV4_CHECK(it->is_string(), where, ".", key, ": expected a string");
  return it->get<std::string>();
}

}  // namespace

Message message_from_json(const OrderedJson& j) {
  const std::string where = "message";
  DSV4_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.dump());
  DSV4_CHECK(j.contains("role") && j["role"].is_string(), where, ": missing string field 'role' in ", j.dump());
  Message m;
  m.role = parse_role(j["role"].get<std::string>());
  if (j.contains("content")) m.content = text_content(j["content"], where);
  m.reasoning_content = optional_string(j, "reasoning_content", where);
  if (m.reasoning_content.empty()) m.reasoning_content = optional_string(j, "reasoning", where);
  m.tool_call_id = optional_string(j, "tool_call_id", where);
  m.name = optional_string(j, "name", where);
  if (const auto p = j.find("prefix"); p != j.end() && !p->is_null()) {
    DSV4_CHECK(p->is_boolean(), where, ".prefix: expected a boolean");
    m.prefix = p->get<bool>();
  }
  if (const auto calls = j.find("tool_calls"); calls != j.end() && !calls->is_null()) {
    DSV4_CHECK(calls->is_array(), where, ".tool_calls: expected an array");
    for (size_t k = 0; k < calls->size(); ++k) {
      const OrderedJson& c = (*calls)[k];
      const std::string cw = cat(where, ".tool_calls[", k, "]");
      DSV4_CHECK(c.is_object() && c.contains("function") && c["function"].is_object(), cw,
                 ": expected {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
      const OrderedJson& f = c["function"];
      ToolCall call;
      call.id = optional_string(c, "id", cw);
      call.name = optional_string(f, "name", cw + ".function");
      if (const auto a = f.find("arguments"); a != f.end() && !a->is_null()) {
        DSV4_CHECK(a->is_string() || a->is_object(), cw, ".function.arguments: expected a JSON string or object");
        call.arguments = a->is_string() ? a->get<std::string>() : py_json_dumps(*a);
      }
      m.tool_calls.push_back(std::move(call));
    }
  }
  return m;
}

Tool tool_from_json(const OrderedJson& j) {
  Tool tool{j};
  tool_function(tool);  // validates
  return tool;
}

}  // namespace dsv4::chat
