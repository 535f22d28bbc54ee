#include "server/openai_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>

#include "core/error.h"

namespace dsv4::server {

ApiError invalid_request(const std::string& message, const std::string& param, const std::string& code) {
  return ApiError(400, message, "invalid_request_error", param, code);
}

std::string json_text(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json error_body(const ApiError& error) {
  Json e;
  e["message"] = error.what();
  e["type"] = error.type;
  e["param"] = error.param.empty() ? Json() : Json(error.param);
  e["code"] = error.code.empty() ? Json() : Json(error.code);
  return Json{{"error", e}};
}

const Json* field(const Json& body, const std::string& name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

ApiError wrong_type(const std::string& name, const std::string& expected) {
  return invalid_request("'" + name + "' must be " + expected, name, "invalid_type");
}

std::optional<bool> get_bool(const Json& body, const std::string& name) {
  const Json* f = field(body, name);
  if (!f) return std::nullopt;
  if (!f->is_boolean()) throw wrong_type(name, "a boolean");
  return f->get<bool>();
}

std::optional<std::string> get_string(const Json& body, const std::string& name) {
  const Json* f = field(body, name);
  if (!f) return std::nullopt;
  if (!f->is_string()) throw wrong_type(name, "a string");
  return f->get<std::string>();
}

std::optional<int64_t> get_int(const Json& body, const std::string& name, int64_t lo, int64_t hi) {
  const Json* f = field(body, name);
  if (!f) return std::nullopt;
  if (!f->is_number_integer()) throw wrong_type(name, "an integer");
  if (f->is_number_unsigned() && f->get<uint64_t>() > uint64_t(INT64_MAX))
    throw invalid_request("'" + name + "' is too large", name);
  const int64_t v = f->get<int64_t>();
  if (v < lo || v > hi)
    throw invalid_request("'" + name + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                              ", got " + std::to_string(v),
                          name);
  return v;
}

std::optional<float> get_number(const Json& body, const std::string& name, double lo, double hi, bool lo_open) {
  const Json* f = field(body, name);
  if (!f) return std::nullopt;
  if (!f->is_number()) throw wrong_type(name, "a number");
  const double v = f->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo)) {
    throw invalid_request("'" + name + "' must be " + (lo_open ? "> " : ">= ") + Json(lo).dump() +
                              " and <= " + Json(hi).dump() + ", got " + f->dump(),
                          name);
  }
  return float(v);
}

std::vector<std::string> get_stop(const Json& body, const std::string& name) {
  const Json* f = field(body, name);
  if (!f) return {};
  std::vector<std::string> stop;
  if (f->is_string()) {
    stop.push_back(f->get<std::string>());
  } else if (f->is_array()) {
    for (const Json& s : *f) {
      if (!s.is_string()) throw wrong_type(name, "a string or an array of strings");
      stop.push_back(s.get<std::string>());
    }
  } else {
    throw wrong_type(name, "a string or an array of strings");
  }
  if (stop.size() > 16) throw invalid_request("'" + name + "' may hold at most 16 strings", name);
  std::erase(stop, "");
  return stop;
}

Json parse_object(const std::string& text) {
  Json body;
  try {
    body = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw invalid_request(std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object", "", "invalid_json");
  return body;
}

std::string get_model(const Json& body) {
  const auto model = get_string(body, "model");
  if (!model) throw invalid_request("missing required field 'model'", "model", "missing_required_parameter");
  return *model;
}

namespace {

// Options that change what is generated but that this server does not implement: refuse rather than ignore.
void refuse_unsupported(const Json& body, Endpoint endpoint) {
  const auto refuse = [](const std::string& name) {
    throw invalid_request("'" + name + "' is not supported by this server", name, "unsupported_parameter");
  };
  if (endpoint == Endpoint::kCompletions) {
    if (const Json* f = field(body, "response_format");
        f && !(f->is_object() && f->contains("type") && (*f)["type"] == "text"))
      refuse("response_format");
    if (const Json* f = field(body, "suffix"); f && *f != "") refuse("suffix");
    if (const Json* f = field(body, "top_logprobs"); f && *f != 0) refuse("top_logprobs");  // chat's field
  }
}

// Chat: "logprobs": true with "top_logprobs": 0..20 alternatives. Completions: "logprobs": 0..20, the
// alternatives; with "echo" that would ask for the prompt's logprobs too, which this server does not compute.
void parse_logprobs(const Json& body, CompletionRequest& r) {
  if (r.endpoint == Endpoint::kCompletions) {
    r.logprobs = get_int(body, "logprobs", 0, kMaxTopLogprobs);
    if (r.logprobs && r.echo)
      throw invalid_request("prompt logprobs ('echo' with 'logprobs') are not supported by this server", "logprobs",
                            "unsupported_parameter");
    return;
  }
  const auto top = get_int(body, "top_logprobs", 0, kMaxTopLogprobs);
  if (get_bool(body, "logprobs").value_or(false)) r.logprobs = top.value_or(0);
  else if (top.value_or(0) > 0)
    throw invalid_request("'top_logprobs' requires 'logprobs': true", "top_logprobs");
}

void parse_sampling(const Json& body, CompletionRequest& r) {
  SamplingParams& s = r.sampling;
  if (auto v = get_number(body, "temperature", 0, 2)) s.temperature = *v;
  if (auto v = get_number(body, "top_p", 0, 1, /*lo_open=*/true)) s.top_p = *v;
  if (auto v = get_int(body, "top_k", -1, INT32_MAX)) s.top_k = std::max<int64_t>(*v, 0);  // −1 = off (vLLM)
  if (auto v = get_number(body, "min_p", 0, 1)) s.min_p = *v;
  if (auto v = get_number(body, "presence_penalty", -2, 2)) s.presence_penalty = *v;
  if (auto v = get_number(body, "frequency_penalty", -2, 2)) s.frequency_penalty = *v;
  if (auto v = get_number(body, "repetition_penalty", 0, 100, /*lo_open=*/true)) s.repetition_penalty = *v;
  if (auto v = get_int(body, "seed", INT64_MIN, INT64_MAX)) s.seed = uint64_t(*v), r.seed_given = true;
  // logit_bias: {"token id": bias in [-100, 100]}; the ids are checked against the vocabulary on submission.
  if (const Json* f = field(body, "logit_bias")) {
    if (!f->is_object()) throw invalid_request("'logit_bias' must be an object of token ids to biases", "logit_bias");
    for (const auto& [key, value] : f->items()) {
      int32_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0)
        throw invalid_request("'logit_bias' keys must be token ids, got '" + key + "'", "logit_bias");
      if (!value.is_number())
        throw invalid_request("'logit_bias' values must be numbers (token " + key + ")", "logit_bias");
      s.logit_bias.emplace_back(id, value.get<float>());
    }
  }
  try {
    validate(s);
  } catch (const Error& e) {
    throw invalid_request(e.what());
  }
}

// tool_choice: "auto", "none", "required" or {"type": "function", "function": {"name"}}; parallel_tool_calls.
// Returns it as a message spells it ("auto", "none", "required", "naming a function").
std::string parse_tool_choice(const Json& body, CompletionRequest& r) {
  r.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  const Json* f = field(body, "tool_choice");
  if (!f) return "auto";
  if (f->is_string() && (*f == "auto" || *f == "none" || *f == "required")) {
    if (*f == "required") r.tool_choice = CompletionRequest::ToolChoice::kRequired;
    return f->get<std::string>();
  }
  const Json* function = f->is_object() && f->value("type", "") == "function" ? field(*f, "function") : nullptr;
  const Json* name = function && function->is_object() ? field(*function, "name") : nullptr;
  if (!name || !name->is_string())
    throw invalid_request("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}",
                          "tool_choice");
  r.tool_choice = CompletionRequest::ToolChoice::kNamed;
  r.forced_tool = name->get<std::string>();
  return "naming a function";
}

// response_format: {"type": "text"} (free text), {"type": "json_object"} (any JSON object) or {"type":
// "json_schema", "json_schema": {"name", "schema", "description", "strict"}} (the schema is always enforced, strict
// or not).
void parse_response_format(const Json& body, CompletionRequest& r) {
  const Json* f = field(body, "response_format");
  if (!f) return;
  const std::string type = f->is_object() ? get_string(*f, "type").value_or("") : "";
  if (type == "text") return;
  r.json_schema_field = "response_format";
  if (type == "json_object") {
    r.json_schema = Json{{"type", "object"}};
    return;
  }
  if (type != "json_schema")
    throw invalid_request("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                          "response_format");
  const Json* spec = field(*f, "json_schema");
  if (!spec || !spec->is_object())
    throw invalid_request("'response_format.json_schema' must be an object {\"name\", \"schema\"}", "response_format");
  if (!get_string(*spec, "name"))
    throw invalid_request("'response_format.json_schema.name' is required", "response_format",
                          "missing_required_parameter");
  static_cast<void>(get_string(*spec, "description"));
  static_cast<void>(get_bool(*spec, "strict"));
  const Json* schema = field(*spec, "schema");
  r.json_schema = schema ? *schema : Json::object();  // without a schema: any JSON value
  r.json_schema_field = "response_format.json_schema.schema";
}

void parse_chat(const Json& body, CompletionRequest& r) {
  const Json* messages = field(body, "messages");
  if (!messages) throw invalid_request("missing required field 'messages'", "messages", "missing_required_parameter");
  if (!messages->is_array() || messages->empty()) throw wrong_type("messages", "a non-empty array");
  for (size_t i = 0; i < messages->size(); ++i) {
    try {
      r.messages.push_back(chat::message_from_json((*messages)[i]));
    } catch (const Error& e) {
      throw invalid_request(e.what(), "messages[" + std::to_string(i) + "]");
    }
  }
  const chat::Message& last = r.messages.back();
  if (last.role == chat::Role::kSystem || (last.role == chat::Role::kAssistant && !last.prefix))
    throw invalid_request("the last message must be a user or tool message (or an assistant message with "
                          "\"prefix\": true to continue it)",
                          "messages");

  const std::string tool_choice = parse_tool_choice(body, r);
  if (const Json* tools = field(body, "tools"); tools && tool_choice != "none") {
    if (!tools->is_array()) throw wrong_type("tools", "an array");
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", std::string()) != "function" || !t.contains("function") ||
          !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
        throw invalid_request(where + " must be {\"type\": \"function\", \"function\": {\"name\": ...}}", where);
      r.tools.push_back(chat::tool_from_json(t));
    }
  }
  if (r.tool_choice != CompletionRequest::ToolChoice::kAuto && r.tools.empty())
    throw invalid_request("'tool_choice' " + tool_choice + " needs 'tools'", "tool_choice");
  if (r.tool_choice == CompletionRequest::ToolChoice::kNamed &&
      std::none_of(r.tools.begin(), r.tools.end(), [&](const chat::Tool& t) {
        return t.definition["function"]["name"] == r.forced_tool;
      }))
    throw invalid_request("'tool_choice' names the function '" + r.forced_tool + "', which is not in 'tools'",
                          "tool_choice");
  parse_response_format(body, r);

  // Thinking mode: chat_template_kwargs {"thinking" | "enable_thinking": bool, "reasoning_effort"} or the
  // top-level reasoning_effort. "max" adds DeepSeek's maximum-effort instruction; any other effort but "none"
  // turns thinking on without it.
  std::optional<std::string> effort = get_string(body, "reasoning_effort");
  std::optional<bool> thinking;
  if (const Json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) throw wrong_type("chat_template_kwargs", "an object");
    for (const char* name : {"thinking", "enable_thinking"}) {
      if (const Json* f = field(*kwargs, name)) {
        if (!f->is_boolean()) throw wrong_type(std::string("chat_template_kwargs.") + name, "a boolean");
        thinking = f->get<bool>();
      }
    }
    if (const Json* f = field(*kwargs, "reasoning_effort")) {
      if (!f->is_string()) throw wrong_type("chat_template_kwargs.reasoning_effort", "a string");
      effort = f->get<std::string>();
    }
  }
  if (effort) {
    static const std::vector<std::string> kEfforts = {"none", "minimal", "low", "medium", "high", "max"};
    if (std::find(kEfforts.begin(), kEfforts.end(), *effort) == kEfforts.end())
      throw invalid_request("'reasoning_effort' must be one of none, minimal, low, medium, high, max",
                            "reasoning_effort");
    if (!thinking) thinking = *effort != "none";
    if (*effort == "max") r.chat_options.reasoning_effort = chat::ReasoningEffort::kMax;
    else if (*effort != "none") r.chat_options.reasoning_effort = chat::ReasoningEffort::kHigh;
  }
  r.chat_options.thinking = thinking.value_or(false);
  if (!r.chat_options.thinking) r.chat_options.reasoning_effort = chat::ReasoningEffort::kDefault;
}

// An array of token ids (each in [0, 2^31)) named `name`; `expected` says what the field may be.
std::vector<int32_t> token_ids(const Json& ids, const std::string& name, const std::string& expected) {
  if (!ids.is_array()) throw wrong_type(name, expected);
  std::vector<int32_t> tokens;
  for (const Json& t : ids) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) throw wrong_type(name, expected);
    tokens.push_back(t.get<int32_t>());
  }
  return tokens;
}

CompletionRequest::Prompt prompt_from_json(const Json& p) {
  CompletionRequest::Prompt prompt;
  if (p.is_string()) {
    prompt.text = p.get<std::string>();
    if (prompt.text.empty()) throw invalid_request("'prompt' must not be empty", "prompt");
    return prompt;
  }
  const std::string expected = "a string, an array of strings or of token ids";
  if (!p.is_array() || p.empty()) throw wrong_type("prompt", expected);
  prompt.tokens = token_ids(p, "prompt", expected);
  prompt.is_tokens = true;
  return prompt;
}

void parse_completion(const Json& body, CompletionRequest& r) {
  r.echo = get_bool(body, "echo").value_or(false);
  const Json* prompt = field(body, "prompt");
  if (!prompt) throw invalid_request("missing required field 'prompt'", "prompt", "missing_required_parameter");
  // A list of strings or of token lists is several prompts; a flat list of integers is one prompt.
  const bool batch = prompt->is_array() && !prompt->empty() && ((*prompt)[0].is_string() || (*prompt)[0].is_array());
  if (!batch) {
    r.prompts.push_back(prompt_from_json(*prompt));
    return;
  }
  for (const Json& p : *prompt) {
    if (!p.is_string() && !p.is_array()) throw wrong_type("prompt", "a string, an array of strings or of token ids");
    r.prompts.push_back(prompt_from_json(p));
  }
}

}  // namespace

void check_constraint_fields(const CompletionRequest& r) {
  if (r.ignore_eos && r.constrained())
    throw invalid_request("'ignore_eos' cannot be combined with a structured answer (response_format, tool_choice "
                          "forcing a tool): it ends where it is complete",
                          "ignore_eos");
  if (!r.parallel_tool_calls && !r.constrained() && !r.tools.empty())
    throw invalid_request("turning parallel tool calls off needs a grammar to hold the model to one call: "
                          "tool_choice required or a named function, or a response format",
                          r.endpoint == Endpoint::kMessages ? "tool_choice" : "parallel_tool_calls",
                          "unsupported_parameter");
}

CompletionRequest parse_request(Endpoint endpoint, const std::string& text, const SamplingParams& defaults) {
  const Json body = parse_object(text);
  CompletionRequest r;
  r.endpoint = endpoint;
  r.sampling = defaults;
  r.model = get_model(body);

  refuse_unsupported(body, endpoint);
  if (endpoint == Endpoint::kChatCompletions) parse_chat(body, r);
  else parse_completion(body, r);
  parse_sampling(body, r);
  parse_logprobs(body, r);

  // max_completion_tokens is the newer name in chat completions; both mean the same here.
  r.max_tokens = get_int(body, "max_tokens", 1, kMaxTokensField);
  if (auto v = get_int(body, "max_completion_tokens", 1, kMaxTokensField)) r.max_tokens = v;
  r.n = get_int(body, "n", 1, 128).value_or(1);
  if (auto best_of = get_int(body, "best_of", 1, 128); best_of && *best_of != r.n)
    throw invalid_request("'best_of' other than n is not supported", "best_of", "unsupported_parameter");
  r.stop = get_stop(body, "stop");
  r.stream = get_bool(body, "stream").value_or(false);
  if (const Json* opts = field(body, "stream_options")) {
    if (!r.stream) throw invalid_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (!opts->is_object()) throw wrong_type("stream_options", "an object");
    r.include_usage = get_bool(*opts, "include_usage").value_or(false);
  }
  r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  check_constraint_fields(r);
  return r;
}

TokenizeRequest parse_tokenize(const std::string& text) {
  const Json body = parse_object(text);
  TokenizeRequest r;
  r.model = get_model(body);
  if (field(body, "messages")) {
    if (field(body, "prompt")) throw invalid_request("give either 'prompt' or 'messages', not both", "prompt");
    CompletionRequest chat;
    chat.endpoint = Endpoint::kChatCompletions;
    parse_chat(body, chat);
    r.chat = std::move(chat);
    return r;
  }
  const auto prompt = get_string(body, "prompt");
  if (!prompt)
    throw invalid_request("missing required field 'prompt' (or 'messages')", "prompt", "missing_required_parameter");
  r.prompt = *prompt;
  r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
  return r;
}

DetokenizeRequest parse_detokenize(const std::string& text) {
  const Json body = parse_object(text);
  DetokenizeRequest r;
  r.model = get_model(body);
  const Json* tokens = field(body, "tokens");
  if (!tokens) throw invalid_request("missing required field 'tokens'", "tokens", "missing_required_parameter");
  r.tokens = token_ids(*tokens, "tokens", "an array of token ids");
  return r;
}

Json usage_json(const Usage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

Json response_envelope(const ResponseHeader& h) {
  return Json{{"id", h.id}, {"object", h.object}, {"created", h.created}, {"model", h.model}};
}

namespace {
Json finish_json(const std::string& finish_reason) { return finish_reason.empty() ? Json() : Json(finish_reason); }

Json token_json(const LogprobToken& t) {
  Json bytes = Json::array();
  for (const char b : t.bytes) bytes.push_back(int(uint8_t(b)));
  return Json{{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes}};
}
}  // namespace

Json chat_logprobs_json(const std::vector<LogprobEntry>& entries) {
  Json content = Json::array();
  for (const LogprobEntry& e : entries) {
    Json item = token_json(e.token);
    item["top_logprobs"] = Json::array();
    for (const LogprobToken& t : e.top) item["top_logprobs"].push_back(token_json(t));
    content.push_back(item);
  }
  return Json{{"content", content}};
}

Json text_logprobs_json(const std::vector<LogprobEntry>& entries) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(), offsets = Json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.token.text);
    token_logprobs.push_back(e.token.logprob);
    // The alternatives and, as OpenAI's legacy API always reports it, the token itself (up to N + 1 entries).
    Json top = Json::object();
    for (const LogprobToken& t : e.top) top[t.text] = t.logprob;
    top[e.token.text] = e.token.logprob;
    top_logprobs.push_back(top);
    offsets.push_back(e.text_offset);
  }
  return Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
              {"text_offset", offsets}};
}

Json chat_choice_json(int64_t index, const ChatChoice& c, const Json& logprobs) {
  Json message{{"role", "assistant"}, {"content", c.content}};
  if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
  if (!c.tool_calls.empty()) {
    Json calls = Json::array();
    for (const chat::ToolCall& t : c.tool_calls)
      calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
    message["tool_calls"] = calls;
    if (c.content.empty()) message["content"] = nullptr;  // as OpenAI answers a pure tool call
  }
  return Json{{"index", index},
              {"message", message},
              {"logprobs", logprobs},
              {"finish_reason", finish_json(c.finish_reason)}};
}

Json chat_chunk_choice_json(int64_t index, const ChatDelta& d, bool first, const std::string& finish_reason,
                            const Json& logprobs) {
  Json delta = Json::object();
  if (first) delta["role"] = "assistant";
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty() || (first && d.reasoning.empty() && d.tool_calls.empty())) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCallDelta& t : d.tool_calls) {
      Json call{{"index", t.index}};
      Json function;
      if (!t.id.empty()) {
        call["id"] = t.id;
        call["type"] = "function";
        function["name"] = t.name;
      }
      function["arguments"] = t.arguments;
      call["function"] = function;
      calls.push_back(call);
    }
    delta["tool_calls"] = calls;
  }
  return Json{{"index", index},
              {"delta", delta},
              {"logprobs", logprobs},
              {"finish_reason", finish_json(finish_reason)}};
}

Json text_choice_json(int64_t index, const std::string& text, const std::string& finish_reason, const Json& logprobs) {
  return Json{{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_json(finish_reason)}};
}

std::string random_id(const std::string& prefix) {
  static constexpr char kChars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

}  // namespace dsv4::server
