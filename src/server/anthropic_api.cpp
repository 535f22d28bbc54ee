#include "server/anthropic_api.h"

#include <algorithm>

#include "chat/py_json.h"

namespace dsv4::server {

namespace {

// Fields that would change what is generated and that this server does not implement.
void refuse_unsupported(const Json& body) {
  for (const char* name : {"mcp_servers", "container", "context_management"}) {
    if (field(body, name))
      throw invalid_request(std::string("'") + name + "' is not supported by this server", name,
                            "unsupported_parameter");
  }
}

// The "type" of a content block, checked against the ones allowed where it stands.
std::string block_type(const Json& block, const std::string& where, const std::vector<std::string>& allowed) {
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
    throw invalid_request(where + " must be a content block {\"type\": ...} (" + list + ")", where);
  const std::string type = block["type"].get<std::string>();
  if (std::find(allowed.begin(), allowed.end(), type) == allowed.end())
    throw invalid_request(where + ": '" + type + "' blocks are not supported here (this server takes " + list + ")",
                          where, "unsupported_parameter");
  return type;
}

// A required string field of a block.
std::string block_string(const Json& block, const std::string& name, const std::string& where) {
  const auto value = get_string(block, name);
  if (!value) throw invalid_request(where + " needs a string '" + name + "'", where);
  return *value;
}

// A string, or an array of text blocks joined with "\n\n" (system prompts, tool results).
std::string text_of(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw wrong_type(where, "a string or an array of text blocks");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    block_type(content[i], at, {"text"});
    if (i > 0) text += "\n\n";
    text += block_string(content[i], "text", at);
  }
  return text;
}

chat::Message chat_message(chat::Role role, std::string content) {
  chat::Message m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

// One Anthropic message as chat messages: a user message's tool_result blocks become tool messages and its text
// blocks user messages, in order (the encoder merges them into one user turn); an assistant message becomes one
// assistant message (thinking -> reasoning, text -> content, tool_use -> tool calls).
void append_message(const Json& m, const std::string& where, std::vector<chat::Message>& out) {
  if (!m.is_object()) throw wrong_type(where, "an object {\"role\", \"content\"}");
  const auto role = get_string(m, "role");
  if (!role || (*role != "user" && *role != "assistant"))
    throw invalid_request(where + ".role must be \"user\" or \"assistant\"", where);
  const Json* content = field(m, "content");
  if (!content) throw invalid_request(where + " needs 'content'", where, "missing_required_parameter");
  const bool user = *role == "user";
  if (content->is_string()) {
    out.push_back(chat_message(user ? chat::Role::kUser : chat::Role::kAssistant, content->get<std::string>()));
    return;
  }
  if (!content->is_array()) throw wrong_type(where + ".content", "a string or an array of content blocks");
  chat::Message assistant = chat_message(chat::Role::kAssistant, "");
  const auto join = [](std::string& to, const std::string& text) { to += (to.empty() ? "" : "\n\n") + text; };
  for (size_t i = 0; i < content->size(); ++i) {
    const Json& block = (*content)[i];
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    const std::string type =
        user ? block_type(block, at, {"text", "tool_result"}) : block_type(block, at, {"text", "thinking", "tool_use"});
    if (type == "text" && user) {
      out.push_back(chat_message(chat::Role::kUser, block_string(block, "text", at)));
    } else if (type == "tool_result") {
      // is_error (checked to be a boolean) has no spelling in DeepSeek's format: the text says what happened.
      static_cast<void>(get_bool(block, "is_error"));
      const Json* result = field(block, "content");
      out.push_back(chat_message(chat::Role::kTool, result ? text_of(*result, at + ".content") : ""));
      out.back().tool_call_id = block_string(block, "tool_use_id", at);
    } else if (type == "text") {
      join(assistant.content, block_string(block, "text", at));
    } else if (type == "thinking") {
      join(assistant.reasoning_content, block_string(block, "thinking", at));
    } else {  // tool_use
      const Json* input = field(block, "input");
      if (input && !input->is_object()) throw wrong_type(at + ".input", "an object");
      assistant.tool_calls.push_back(
          {block_string(block, "id", at), block_string(block, "name", at), input ? chat::py_json_dumps(*input) : ""});
    }
  }
  if (!user) out.push_back(std::move(assistant));
}

// tools [{name, description, input_schema}] as the chat encoder's function tools, unless tool_choice is none.
// tool_choice any / tool force a call (constrained decoding, as OpenAI's required / named function). Returns
// whether a tool asks for strict inputs.
bool parse_tools(const Json& body, CompletionRequest& r) {
  std::string choice = "auto";
  if (const Json* f = field(body, "tool_choice")) {
    if (!f->is_object())
      throw wrong_type("tool_choice", "an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    choice = get_string(*f, "type").value_or("");
    if (choice != "auto" && choice != "none" && choice != "any" && choice != "tool")
      throw invalid_request("'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"", "tool_choice");
    if (choice == "any") r.tool_choice = CompletionRequest::ToolChoice::kRequired;
    if (choice == "tool") {
      const auto name = get_string(*f, "name");
      if (!name) throw invalid_request("'tool_choice' of type tool needs a 'name'", "tool_choice");
      r.tool_choice = CompletionRequest::ToolChoice::kNamed;
      r.forced_tool = *name;
    }
    r.parallel_tool_calls = !get_bool(*f, "disable_parallel_tool_use").value_or(false);
  }
  bool strict = false;
  const Json* tools = field(body, "tools");
  if (!tools) {
    if (r.tool_choice != CompletionRequest::ToolChoice::kAuto)
      throw invalid_request("'tool_choice' " + choice + " needs 'tools'", "tool_choice");
    return strict;
  }
  if (!tools->is_array()) throw wrong_type("tools", "an array");
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw wrong_type(where, "an object {\"name\", \"description\", \"input_schema\"}");
    if (const auto type = get_string(t, "type"); type && *type != "custom")
      throw invalid_request(where + ": server tools ('" + *type + "') are not supported", where,
                            "unsupported_parameter");
    strict = get_bool(t, "strict").value_or(false) || strict;
    const std::string name = block_string(t, "name", where);
    if (name.empty()) throw invalid_request(where + ".name must not be empty", where);
    Json function{{"name", name}};
    if (const auto description = get_string(t, "description")) function["description"] = *description;
    const Json* schema = field(t, "input_schema");
    if (!schema || !schema->is_object())
      throw invalid_request(where + " needs an object 'input_schema' (a JSON schema)", where);
    function["parameters"] = *schema;
    if (choice != "none") r.tools.push_back({Json{{"type", "function"}, {"function", function}}});
  }
  if (r.tool_choice == CompletionRequest::ToolChoice::kNamed &&
      std::none_of(r.tools.begin(), r.tools.end(),
                   [&](const chat::Tool& t) { return t.definition["function"]["name"] == r.forced_tool; }))
    throw invalid_request("'tool_choice' names the tool '" + r.forced_tool + "', which is not in 'tools'",
                          "tool_choice");
  return strict;
}

// output_config.format (and the beta's top-level output_format): {"type": "json_schema", "schema"}: the answer is
// a JSON value of the schema (constrained decoding).
void parse_output_format(const Json& format, const std::string& where, CompletionRequest& r) {
  if (!format.is_object() || get_string(format, "type").value_or("") != "json_schema")
    throw invalid_request("'" + where + "' must be {\"type\": \"json_schema\", \"schema\": {...}}", where);
  const Json* schema = field(format, "schema");
  if (!schema) throw invalid_request("'" + where + "' needs a 'schema'", where, "missing_required_parameter");
  r.json_schema = *schema;
  r.json_schema_field = where + ".schema";
}

// thinking {"type": "enabled", "budget_tokens"} or {"type": "adaptive"}: V4's thinking mode (which thinks on
// every turn); "disabled": chat mode. output_config.effort "max" adds DeepSeek's maximum-effort prompt in
// thinking mode; the other efforts render nothing, as reasoning_effort "high" does on the OpenAI route.
void parse_thinking(const Json& body, CompletionRequest& r) {
  if (const Json* thinking = field(body, "thinking")) {
    if (!thinking->is_object())
      throw wrong_type("thinking", "an object {\"type\": \"enabled\" | \"adaptive\" | \"disabled\"}");
    const std::string type = get_string(*thinking, "type").value_or("");
    if (type != "enabled" && type != "adaptive" && type != "disabled")
      throw invalid_request("'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\"", "thinking");
    r.chat_options.thinking = type != "disabled";
    if (type == "enabled" && !get_int(*thinking, "budget_tokens", 1, kMaxTokensField))
      throw invalid_request("'thinking' needs an integer 'budget_tokens'", "thinking", "missing_required_parameter");
    if (get_string(*thinking, "display").value_or("summarized") != "summarized")
      throw invalid_request("'thinking.display' other than \"summarized\" is not supported", "thinking",
                            "unsupported_parameter");
  }
  const Json* output = field(body, "output_config");
  if (!output) return;
  if (!output->is_object()) throw wrong_type("output_config", "an object");
  if (const Json* format = field(*output, "format")) parse_output_format(*format, "output_config.format", r);
  if (const auto effort = get_string(*output, "effort")) {
    static const std::vector<std::string> kEfforts = {"low", "medium", "high", "xhigh", "max"};
    if (std::find(kEfforts.begin(), kEfforts.end(), *effort) == kEfforts.end())
      throw invalid_request("'output_config.effort' must be one of low, medium, high, xhigh, max", "output_config");
    if (*effort == "max" && r.chat_options.thinking) r.chat_options.reasoning_effort = chat::ReasoningEffort::kMax;
  }
}

}  // namespace

CompletionRequest parse_messages(const std::string& text, const SamplingParams& defaults) {
  const Json body = parse_object(text);
  CompletionRequest r;
  r.endpoint = Endpoint::kMessages;
  r.sampling = defaults;
  r.model = get_model(body);
  refuse_unsupported(body);

  r.max_tokens = get_int(body, "max_tokens", 1, kMaxTokensField);
  if (!r.max_tokens)
    throw invalid_request("missing required field 'max_tokens'", "max_tokens", "missing_required_parameter");

  if (const Json* system = field(body, "system"))
    r.messages.push_back(chat_message(chat::Role::kSystem, text_of(*system, "system")));
  const Json* messages = field(body, "messages");
  if (!messages) throw invalid_request("missing required field 'messages'", "messages", "missing_required_parameter");
  if (!messages->is_array() || messages->empty()) throw wrong_type("messages", "a non-empty array");
  const size_t system_messages = r.messages.size();
  for (size_t i = 0; i < messages->size(); ++i)
    append_message((*messages)[i], "messages[" + std::to_string(i) + "]", r.messages);
  // User messages whose content is an empty array add nothing: with only those there is no conversation (and
  // nothing to take the prefill's place below).
  if (r.messages.size() == system_messages)
    throw invalid_request("'messages' hold no content: every message is an empty array of blocks", "messages");
  // A final assistant message is a prefill: the answer continues it.
  if (r.messages.back().role == chat::Role::kAssistant) r.messages.back().prefix = true;
  const bool strict_tools = parse_tools(body, r);
  if (const Json* format = field(body, "output_format")) parse_output_format(*format, "output_format", r);
  parse_thinking(body, r);
  // Strict tool inputs are what a grammar over the tools gives: a forced call, or an answer that is a call or the
  // output format. Under auto alone nothing would hold a call to its schema.
  if (strict_tools && !r.constrained())
    throw invalid_request("strict tool inputs need a forced tool_choice (any, tool) or an output format",
                          "tools", "unsupported_parameter");

  SamplingParams& s = r.sampling;
  if (auto v = get_number(body, "temperature", 0, 1)) s.temperature = *v;
  if (auto v = get_number(body, "top_p", 0, 1, /*lo_open=*/true)) s.top_p = *v;
  if (auto v = get_int(body, "top_k", 0, INT32_MAX)) s.top_k = *v;
  r.stop = get_stop(body, "stop_sequences");
  r.stream = get_bool(body, "stream").value_or(false);
  check_constraint_fields(r);
  return r;
}

Json anthropic_error_body(const ApiError& error) {
  const int s = error.status;
  const char* type = s == 401   ? "authentication_error"
                     : s == 403 ? "permission_error"
                     : s == 404 ? "not_found_error"
                     : s == 413 ? "request_too_large"
                     : s == 429 ? "rate_limit_error"
                     : s == 529 ? "overloaded_error"
                     : s >= 500 ? "api_error"
                                : "invalid_request_error";
  return Json{{"type", "error"}, {"error", {{"type", type}, {"message", error.what()}}}};
}

std::string stop_reason(const std::string& finish_reason, const std::string& stop_sequence) {
  if (!stop_sequence.empty()) return "stop_sequence";
  if (finish_reason == "length") return "max_tokens";
  if (finish_reason == "tool_calls") return "tool_use";
  return "end_turn";
}

namespace {

Json tool_input(const std::string& arguments) {
  if (arguments.find_first_not_of(" \t\r\n") == std::string::npos) return Json::object();
  Json input = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : Json{{"arguments", arguments}};
}

Json usage_of(int64_t input_tokens, int64_t output_tokens) {
  return Json{{"input_tokens", input_tokens}, {"output_tokens", output_tokens}};
}

Json message_envelope(const ResponseHeader& h, Json content, const Json& stop_reason, const Json& stop_sequence,
                      const Json& usage) {
  return Json{{"id", h.id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", h.model},
              {"content", std::move(content)},
              {"stop_reason", stop_reason},
              {"stop_sequence", stop_sequence},
              {"usage", usage}};
}

Json or_null(const std::string& s) { return s.empty() ? Json() : Json(s); }

}  // namespace

Json message_json(const ResponseHeader& header, const ChatChoice& choice, const std::string& stop_reason,
                  const std::string& stop_sequence, const Usage& usage) {
  Json content = Json::array();
  if (!choice.reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", choice.reasoning}, {"signature", ""}});
  if (!choice.content.empty()) content.push_back({{"type", "text"}, {"text", choice.content}});
  for (const chat::ToolCall& call : choice.tool_calls)
    content.push_back(
        {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", tool_input(call.arguments)}});
  return message_envelope(header, std::move(content), stop_reason, or_null(stop_sequence),
                          usage_of(usage.prompt_tokens, usage.completion_tokens));
}

std::vector<Json> message_start(const ResponseHeader& header, int64_t input_tokens) {
  return {Json{{"type", "message_start"},
               {"message", message_envelope(header, Json::array(), nullptr, nullptr, usage_of(input_tokens, 0))}},
          Json{{"type", "ping"}}};
}

void MessageStream::open(Block kind, Json content_block, std::vector<Json>& out) {
  close(out);
  open_ = kind;
  ++index_;
  out.push_back({{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(content_block)}});
}

void MessageStream::close(std::vector<Json>& out) {
  if (open_ == Block::kNone) return;
  out.push_back({{"type", "content_block_stop"}, {"index", index_}});
  open_ = Block::kNone;
}

std::vector<Json> MessageStream::delta(const ChatDelta& d) {
  std::vector<Json> out;
  const auto add = [&](Json delta) {
    out.push_back({{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}});
  };
  // A delta's parts are in the order the model wrote them: reasoning, then content, then tool calls.
  if (!d.reasoning.empty()) {
    if (open_ != Block::kThinking)
      open(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, out);
    add({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (open_ != Block::kText) open(Block::kText, {{"type", "text"}, {"text", ""}}, out);
    add({{"type", "text_delta"}, {"text", d.content}});
  }
  for (const ToolCallDelta& t : d.tool_calls) {
    if (!t.id.empty())  // a new call: its block opens with an empty input, filled by the deltas
      open(Block::kToolUse, {{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", Json::object()}}, out);
    if (!t.arguments.empty()) add({{"type", "input_json_delta"}, {"partial_json", t.arguments}});
  }
  return out;
}

std::vector<Json> MessageStream::finish(const std::string& stop_reason, const std::string& stop_sequence,
                                        int64_t output_tokens) {
  std::vector<Json> out;
  close(out);
  out.push_back({{"type", "message_delta"},
                 {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", or_null(stop_sequence)}}},
                 {"usage", {{"output_tokens", output_tokens}}}});
  out.push_back({{"type", "message_stop"}});
  return out;
}

}  // namespace dsv4::server
