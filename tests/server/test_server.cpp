// The server below HTTP: the continuous-batching scheduler on the shipped tiny model (batched = alone,
// cancellation, queue limit, logprobs, grammars in greedy and sampled decoding), the output decoder (DSML tool
// calls and reasoning streamed as deltas, stop strings), OpenAI and Anthropic request parsing, the Anthropic
// message and stream events (tool_use blocks from DSML), and the metrics text. The HTTP layer is tested with the
// real openai and anthropic clients in test_openai.py, test_anthropic.py and test_structured.py.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "core/error.h"
#include "engine/backend.h"
#include "harness/files.h"
#include "loader/weight_map.h"
#include "server/anthropic_api.h"
#include "server/completion_service.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/output_decoder.h"

namespace dsv4::test {
namespace {

using server::ChatDelta;
using server::OutputDecoder;

// Collects one request's events; wait() blocks until its final event.
struct Collector {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;  // of the tokens, when asked
  std::optional<FinishReason> finished;

  Scheduler::EventSink sink() {
    return [this](const GenerationEvent& e) {
      std::lock_guard lock(mutex);
      if (e.token) tokens.push_back(*e.token);
      if (e.logprobs) logprobs.push_back(*e.logprobs);
      if (e.finished) finished = e.finished;
      cv.notify_all();
    };
  }
  void wait_for_tokens(size_t n) {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return tokens.size() >= n || finished; });
  }
  FinishReason wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return finished.has_value(); });
    return *finished;
  }
};

class TinyModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = load_model(source_path("models/tiny")).release();
    ops_ = make_backend("cpu", *weights_).release();
  }
  static void TearDownTestSuite() {
    delete ops_;
    delete weights_;
  }
  // A fresh model (activation arena) with a step capacity of 16 tokens, so prompts take several chunks.
  std::unique_ptr<DeepseekV4> model() { return std::make_unique<DeepseekV4>(*weights_, *ops_, Numerics::kReference, 256, 16); }

  static GenerationRequest request(size_t prompt_length, int64_t max_tokens, uint32_t salt) {
    GenerationRequest r;
    r.prompt.push_back(0);
    for (size_t i = 1; i < prompt_length; ++i) r.prompt.push_back(int32_t(16 + (i * 7919 + salt * 104729) % 4000));
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.stop_at_eos = false;
    return r;
  }

  static inline const ModelWeights* weights_ = nullptr;
  static inline Ops* ops_ = nullptr;
};

TEST_F(TinyModel, BatchedRequestsGenerateWhatTheyGenerateAlone) {
  const std::vector<std::pair<size_t, int64_t>> shapes = {{40, 6}, {3, 9}, {17, 4}, {1, 7}, {33, 5}, {9, 8}};
  auto m = model();
  SchedulerOptions options;
  options.max_seqs = 4;  // six requests: two wait for a slot
  options.max_context = 256;
  std::vector<std::vector<int32_t>> alone;
  {
    Scheduler scheduler(*m, options);
    for (size_t i = 0; i < shapes.size(); ++i) {
      Collector c;
      ASSERT_TRUE(scheduler.submit(request(shapes[i].first, shapes[i].second, uint32_t(i)), c.sink()));
      EXPECT_EQ(c.wait(), FinishReason::kLength);
      alone.push_back(c.tokens);
    }
  }
  Scheduler scheduler(*m, options);
  std::vector<Collector> together(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i)
    ASSERT_TRUE(scheduler.submit(request(shapes[i].first, shapes[i].second, uint32_t(i)), together[i].sink()));
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(together[i].wait(), FinishReason::kLength);
    EXPECT_EQ(together[i].tokens, alone[i]) << "request " << i;
    EXPECT_EQ(int64_t(together[i].tokens.size()), shapes[i].second);
  }
  // Six requests of 39 tokens in all, batched: far fewer steps than when they ran one by one.
  EXPECT_LT(scheduler.stats().steps, 30);
  EXPECT_EQ(scheduler.stats().running, 0);
}

TEST_F(TinyModel, CancelFreesTheSlot) {
  auto m = model();
  SchedulerOptions options;
  options.max_seqs = 1;
  options.max_context = 256;
  Scheduler scheduler(*m, options);
  Collector first, second;
  const auto id = scheduler.submit(request(5, 200, 1), first.sink());
  ASSERT_TRUE(id);
  ASSERT_TRUE(scheduler.submit(request(5, 3, 2), second.sink()));  // waits for the only slot
  first.wait_for_tokens(2);
  scheduler.cancel(*id);
  EXPECT_EQ(first.wait(), FinishReason::kCancelled);
  EXPECT_LT(first.tokens.size(), 200u);
  EXPECT_EQ(second.wait(), FinishReason::kLength);
  EXPECT_EQ(second.tokens.size(), 3u);
  scheduler.cancel(*id);  // already gone: ignored
  scheduler.cancel(12345);
  EXPECT_EQ(scheduler.stats().running, 0);
}

TEST_F(TinyModel, FullQueueRefusesAndBadRequestsThrow) {
  auto m = model();
  SchedulerOptions options;
  options.max_seqs = 1;
  options.max_waiting = 1;
  options.max_context = 64;
  Scheduler scheduler(*m, options);
  Collector a, b, c;
  const auto first = scheduler.submit(request(4, 50, 1), a.sink());
  ASSERT_TRUE(first);
  ASSERT_TRUE(scheduler.submit(request(4, 2, 2), b.sink()));
  EXPECT_FALSE(scheduler.submit(request(4, 2, 3), c.sink()));  // one running, one waiting: full
  scheduler.cancel(*first);
  EXPECT_EQ(b.wait(), FinishReason::kLength);

  Collector d;
  EXPECT_THROW(scheduler.submit(request(60, 10, 4), d.sink()), Error);  // 70 tokens > 64 of context
  GenerationRequest empty = request(1, 2, 5);
  empty.prompt.clear();
  EXPECT_THROW(scheduler.submit(empty, d.sink()), Error);
  GenerationRequest outside = request(3, 2, 6);
  outside.prompt[1] = 99999;
  EXPECT_THROW(scheduler.submit(outside, d.sink()), Error);
  EXPECT_THROW(Scheduler(*m, {.max_seqs = 17, .max_context = 64, .max_waiting = 0}), Error);  // > step of 16
}

TEST_F(TinyModel, LogprobsComeWithEachTokenAndLeaveGreedyUnchanged) {
  auto m = model();
  Scheduler scheduler(*m, {.max_seqs = 2, .max_context = 256});
  // Side by side in one batch: greedy on the backend (no logits on the host) and greedy from the host row.
  Collector plain, with;
  GenerationRequest asked = request(21, 8, 7);
  asked.logprobs = 4;
  ASSERT_TRUE(scheduler.submit(request(21, 8, 7), plain.sink()));
  ASSERT_TRUE(scheduler.submit(asked, with.sink()));
  EXPECT_EQ(plain.wait(), FinishReason::kLength);
  EXPECT_EQ(with.wait(), FinishReason::kLength);
  EXPECT_EQ(with.tokens, plain.tokens);
  EXPECT_TRUE(plain.logprobs.empty());
  ASSERT_EQ(with.logprobs.size(), with.tokens.size());
  for (size_t i = 0; i < with.tokens.size(); ++i) {
    const TokenLogprobs& lp = with.logprobs[i];
    ASSERT_EQ(lp.top.size(), 4u);
    EXPECT_EQ(lp.top[0].first, with.tokens[i]) << "greedy takes the most likely token";
    EXPECT_EQ(lp.top[0].second, lp.logprob);
    EXPECT_LE(lp.logprob, 0.0f);
    for (size_t k = 1; k < lp.top.size(); ++k) EXPECT_LE(lp.top[k].second, lp.top[k - 1].second);
  }
  Collector refused;
  GenerationRequest too_many = request(3, 2, 1);
  too_many.logprobs = m->config().vocab_size + 1;
  EXPECT_THROW(scheduler.submit(too_many, refused.sink()), Error);
}

TEST_F(TinyModel, GrammarHoldsGreedyAndSampledDecoding) {
  auto m = model();
  const Tokenizer tokenizer = Tokenizer::from_file(source_path("models/tiny"));
  const auto vocabulary = server::grammar_vocabulary(tokenizer, m->config().vocab_size,
                                                     int32_t(m->config().eos_token_id));
  grammar::Spec spec;
  spec.json = grammar::Json::parse(R"({"type": "object", "additionalProperties": false, "required": ["a", "b"],
      "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}}})");
  const auto grammar = grammar::compile(spec);
  Scheduler scheduler(*m, {.max_seqs = 3, .max_context = 256});
  // Greedy (which would otherwise take the backend's argmax), sampled, and a free greedy request beside them.
  std::vector<Collector> collectors(3);
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r = request(12, 120, uint32_t(i));
    r.stop_at_eos = true;
    r.sampling.temperature = i == 1 ? 1.0f : 0.0f;
    r.sampling.seed = 9;
    if (i < 2) r.constraint = std::make_shared<grammar::TokenConstraint>(grammar, vocabulary);
    ASSERT_TRUE(scheduler.submit(r, collectors[size_t(i)].sink()));
  }
  for (int i = 0; i < 2; ++i) {
    Collector& c = collectors[size_t(i)];
    EXPECT_EQ(c.wait(), FinishReason::kEos) << "request " << i;
    ASSERT_EQ(c.tokens.back(), m->config().eos_token_id);
    std::string text;
    for (size_t k = 0; k + 1 < c.tokens.size(); ++k) text += tokenizer.token_bytes(c.tokens[k]);
    grammar::Matcher matcher(grammar);
    EXPECT_TRUE(matcher.feed(text) && matcher.can_end()) << text;
    const auto json = nlohmann::json::parse(text);
    EXPECT_TRUE(json["a"].is_number_integer()) << text;
  }
  collectors[2].wait();
  EXPECT_EQ(collectors[2].tokens, [&] {  // the free request is unchanged by its constrained neighbours
    Scheduler alone(*m, {.max_seqs = 1, .max_context = 256});
    Collector c;
    GenerationRequest r = request(12, 120, 2);
    r.stop_at_eos = true;
    EXPECT_TRUE(alone.submit(r, c.sink()));
    c.wait();
    return c.tokens;
  }());
  // A constraint over another vocabulary is refused.
  Collector refused;
  GenerationRequest wrong = request(3, 2, 1);
  wrong.constraint = std::make_shared<grammar::TokenConstraint>(
      grammar, server::grammar_vocabulary(tokenizer, 100, 1));
  EXPECT_THROW(scheduler.submit(wrong, refused.sink()), Error);
}

// Streams `text` through the decoder one token at a time; returns the deltas joined per field.
struct Streamed {
  std::string reasoning, content;
  std::map<int64_t, std::string> arguments;  // per tool call index
  std::map<int64_t, std::string> names;
  std::map<int64_t, std::string> ids;
};
Streamed stream_text(OutputDecoder& decoder, const Tokenizer& tokenizer, const std::string& text) {
  Streamed s;
  const auto take = [&](const ChatDelta& d) {
    s.reasoning += d.reasoning;
    s.content += d.content;
    for (const auto& t : d.tool_calls) {
      if (!t.id.empty()) {
        EXPECT_FALSE(s.ids.count(t.index)) << "id sent twice";
        s.ids[t.index] = t.id;
        s.names[t.index] = t.name;
      }
      EXPECT_TRUE(s.ids.count(t.index)) << "arguments before the call's first delta";
      s.arguments[t.index] += t.arguments;
    }
  };
  for (int32_t id : tokenizer.encode(text)) take(decoder.push(id));
  take(decoder.finish());
  return s;
}

// An answer with two DSML tool calls, as V4 writes them after its content.
constexpr const char* kToolCallAnswer =
    "I shall ask.\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"town\" string=\"true\">Bath</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"get_time\">\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>";

TEST(OutputDecoder, StreamsDsmlToolCallsAsOpenAiDeltas) {
  const Tokenizer tokenizer = Tokenizer::from_file(source_path("models/tiny"));
  OutputDecoder decoder(tokenizer, /*chat=*/true, /*thinking=*/false, {});
  const Streamed s = stream_text(decoder, tokenizer, kToolCallAnswer);
  EXPECT_EQ(s.content, "I shall ask.");
  ASSERT_EQ(s.ids.size(), 2u);
  EXPECT_EQ(s.names.at(0), "get_weather");
  EXPECT_EQ(s.arguments.at(0), "{\"town\": \"Bath\", \"days\": 3}");
  EXPECT_EQ(s.names.at(1), "get_time");
  EXPECT_EQ(s.arguments.at(1), "{}");
  EXPECT_EQ(s.ids.at(0).rfind("call_", 0), 0u);
  // The whole response says the same.
  const server::ChatChoice& out = decoder.output();
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].id, s.ids.at(0));
  EXPECT_EQ(out.tool_calls[0].arguments, s.arguments.at(0));
  const server::Json message = server::chat_choice_json(0, out)["message"];
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["content"], "I shall ask.");
  // A first tool-call delta as a stream chunk: index, id, type, name and the arguments so far.
  server::ChatDelta d;
  d.tool_calls.push_back({0, "call_x", "get_weather", "{\"to"});
  const server::Json chunk = server::chat_chunk_choice_json(0, d, false, "");
  EXPECT_EQ(chunk["delta"]["tool_calls"][0].dump(),
            R"({"index":0,"id":"call_x","type":"function","function":{"name":"get_weather","arguments":"{\"to"}})");
}

TEST(OutputDecoder, ReasoningContentAndStopStrings) {
  const Tokenizer tokenizer = Tokenizer::from_file(source_path("models/tiny"));
  OutputDecoder thinking(tokenizer, true, /*thinking=*/true, {});
  const Streamed s = stream_text(thinking, tokenizer, "She considered it.</think>Yes, indeed.");
  EXPECT_EQ(s.reasoning, "She considered it.");
  EXPECT_EQ(s.content, "Yes, indeed.");

  OutputDecoder stop(tokenizer, false, false, {"Darcy"});
  std::string shown;
  for (int32_t id : tokenizer.encode("Mr. Bingley and Mr. Darcy were friends.")) {
    shown += stop.push(id).content;
    if (stop.stopped()) break;
  }
  shown += stop.finish().content;
  EXPECT_TRUE(stop.stopped());
  EXPECT_EQ(shown, "Mr. Bingley and Mr. ");
}

// The field a request that `parse` refuses (400) names; "<accepted>" when it is not refused.
template <class Parse>
std::string refused_param(Parse parse) {
  try {
    parse();
  } catch (const server::ApiError& err) {
    EXPECT_EQ(err.status, 400);
    return err.param;
  }
  return "<accepted>";
}

TEST(OpenAiApi, RequestsParseAndErrorsNameTheField) {
  const SamplingParams defaults;
  const auto r = server::parse_request(server::Endpoint::kChatCompletions, R"({"model": "m",
      "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0, "top_k": -1,
      "stop": "x", "stream": true, "stream_options": {"include_usage": true},
      "chat_template_kwargs": {"thinking": true}})",
                                       defaults);
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream && r.include_usage && r.chat_options.thinking);

  const auto param_of = [&](server::Endpoint e, const std::string& body) {
    return refused_param([&] { server::parse_request(e, body, defaults); });
  };
  const auto chat = server::Endpoint::kChatCompletions;
  EXPECT_EQ(param_of(chat, "{"), "");
  EXPECT_EQ(param_of(chat, R"({"model": "m"})"), "messages");
  EXPECT_EQ(param_of(chat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 1.5})"), "top_p");
  EXPECT_EQ(param_of(chat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1})"),
            "max_tokens");
  EXPECT_EQ(param_of(server::Endpoint::kCompletions, R"({"model": "m", "prompt": [[1], 2]})"), "prompt");
  const server::Json e = server::error_body(server::invalid_request("bad", "n"))["error"];
  EXPECT_EQ(e.dump(), R"({"message":"bad","type":"invalid_request_error","param":"n","code":"invalid_value"})");
}

TEST(OpenAiApi, LogprobsFieldsAndShapes) {
  const SamplingParams defaults;
  const auto chat = server::Endpoint::kChatCompletions, text = server::Endpoint::kCompletions;
  const std::string messages = R"("model": "m", "messages": [{"role": "user", "content": "hi"}])";
  const auto logprobs_of = [&](server::Endpoint e, const std::string& body) {
    return server::parse_request(e, body, defaults).logprobs;
  };
  EXPECT_EQ(logprobs_of(chat, "{" + messages + R"(, "logprobs": true, "top_logprobs": 3})"), 3);
  EXPECT_EQ(logprobs_of(chat, "{" + messages + R"(, "logprobs": true})"), 0);
  EXPECT_FALSE(logprobs_of(chat, "{" + messages + R"(, "logprobs": false})"));
  EXPECT_EQ(logprobs_of(text, R"({"model": "m", "prompt": "x", "logprobs": 2})"), 2);
  const auto param_of = [&](server::Endpoint e, const std::string& body) {
    return refused_param([&] { server::parse_request(e, body, defaults); });
  };
  EXPECT_EQ(param_of(chat, "{" + messages + R"(, "top_logprobs": 2})"), "top_logprobs");  // needs logprobs
  EXPECT_EQ(param_of(chat, "{" + messages + R"(, "logprobs": true, "top_logprobs": 21})"), "top_logprobs");
  EXPECT_EQ(param_of(chat, "{" + messages + R"(, "logprobs": 1})"), "logprobs");
  EXPECT_EQ(param_of(text, R"({"model": "m", "prompt": "x", "logprobs": true})"), "logprobs");
  EXPECT_EQ(param_of(text, R"({"model": "m", "prompt": "x", "logprobs": 1, "echo": true})"), "logprobs");

  const std::vector<server::LogprobEntry> entries = {
      {{"Hi", "Hi", -0.5f}, {{"Hi", "Hi", -0.5f}, {"Ho", "Ho", -1.5f}}, 0},
      {{"bytes:\\xe2", "\xe2", -3.0f}, {{"!", "!", -0.25f}}, 2}};
  EXPECT_EQ(server::chat_logprobs_json(entries)["content"][1].dump(),
            R"({"token":"bytes:\\xe2","logprob":-3.0,"bytes":[226],)"
            R"("top_logprobs":[{"token":"!","logprob":-0.25,"bytes":[33]}]})");
  // The legacy shape: the alternatives and the token itself, whether or not it is among them.
  EXPECT_EQ(server::text_logprobs_json(entries).dump(),
            R"({"tokens":["Hi","bytes:\\xe2"],"token_logprobs":[-0.5,-3.0],"top_logprobs":[{"Hi":-0.5,"Ho":-1.5},)"
            R"({"!":-0.25,"bytes:\\xe2":-3.0}],"text_offset":[0,2]})");
}

TEST(AnthropicApi, MessagesRenderTheSamePromptAsTheirOpenAiSpelling) {
  const SamplingParams defaults;
  const auto r = server::parse_messages(R"({"model": "m", "max_tokens": 9,
      "system": [{"type": "text", "text": "Be brief."}],
      "messages": [{"role": "user", "content": "Weather in Bath?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Ask the tool.", "signature": "s"},
          {"type": "text", "text": "Checking."},
          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"town": "Bath", "days": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "Rain"}]},
                                     {"type": "text", "text": "And tomorrow?"}]}],
      "tools": [{"name": "get_weather", "description": "Weather of a town",
                 "input_schema": {"type": "object", "properties": {"town": {"type": "string"}}}}],
      "thinking": {"type": "enabled", "budget_tokens": 2048}, "stop_sequences": ["END"], "temperature": 0.5,
      "top_k": 5, "stream": true})",
                                        defaults);
  const auto o = server::parse_request(server::Endpoint::kChatCompletions, R"({"model": "m",
      "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Bath?"},
        {"role": "assistant", "reasoning_content": "Ask the tool.", "content": "Checking.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"town\": \"Bath\", \"days\": 2}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Rain"}, {"role": "user", "content": "And tomorrow?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a town",
                 "parameters": {"type": "object", "properties": {"town": {"type": "string"}}}}}],
      "chat_template_kwargs": {"thinking": true}})",
                                       defaults);
  EXPECT_EQ(chat::encode_chat(r.messages, r.tools, r.chat_options),
            chat::encode_chat(o.messages, o.tools, o.chat_options));
  EXPECT_EQ(r.endpoint, server::Endpoint::kMessages);
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_TRUE(r.stream && r.chat_options.thinking);
  // tool_choice none leaves the tools out; a final assistant message is a prefill to continue.
  const auto prefill = server::parse_messages(R"({"model": "m", "max_tokens": 4, "tool_choice": {"type": "none"},
      "tools": [{"name": "f", "input_schema": {"type": "object"}}],
      "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}]})",
                                              defaults);
  EXPECT_TRUE(prefill.tools.empty());
  EXPECT_TRUE(prefill.messages.back().prefix);

  const auto param_of = [&](const std::string& body) {
    return refused_param([&] { server::parse_messages(body, defaults); });
  };
  const std::string hi = R"("model": "m", "messages": [{"role": "user", "content": "Hi"}])";
  EXPECT_EQ(param_of("{" + hi + "}"), "max_tokens");
  const std::string to = R"("model": "m", "max_tokens": 3)";
  EXPECT_EQ(param_of("{" + to + "}"), "messages");
  EXPECT_EQ(param_of("{" + to + R"(, "messages": [{"role": "system", "content": "x"}]})"), "messages[0]");
  EXPECT_EQ(param_of("{" + to + R"(, "messages": [{"role": "user", "content": [{"type": "image"}]}]})"),
            "messages[0].content[0]");
  // Empty block arrays add no message: with nothing else there is no conversation (this ended the process).
  EXPECT_EQ(param_of("{" + to + R"(, "messages": [{"role": "user", "content": []}]})"), "messages");
  EXPECT_EQ(param_of("{" + to + R"(, "system": "s", "messages": [{"role": "user", "content": []}]})"), "messages");
  EXPECT_EQ(param_of("{" + hi + R"(, "max_tokens": 3, "tool_choice": {"type": "any"}})"), "tool_choice");
  EXPECT_EQ(param_of("{" + hi + R"(, "max_tokens": 3, "tools": [{"name": "f"}]})"), "tools[0]");
  EXPECT_EQ(param_of("{" + hi + R"(, "max_tokens": 3, "tools": [{"type": "bash_20250124", "name": "bash"}]})"),
            "tools[0]");
  EXPECT_EQ(param_of("{" + hi + R"(, "max_tokens": 3, "thinking": {"type": "enabled"}})"), "thinking");
  EXPECT_EQ(param_of("{" + hi + R"(, "max_tokens": 3, "temperature": 1.5})"), "temperature");
  EXPECT_EQ(param_of("{" + hi + R"(, "max_tokens": 3, "stop_sequences": "x"})"), "<accepted>");
  EXPECT_EQ(server::anthropic_error_body(server::ApiError(401, "no key", "x")).dump(),
            R"({"type":"error","error":{"type":"authentication_error","message":"no key"}})");
  EXPECT_EQ(server::anthropic_error_body(server::invalid_request("bad"))["error"]["type"], "invalid_request_error");
  EXPECT_EQ(server::anthropic_error_body(server::ApiError(404, "?", "x"))["error"]["type"], "not_found_error");
  EXPECT_EQ(server::anthropic_error_body(server::ApiError(500, "!", "x"))["error"]["type"], "api_error");
}

TEST(AnthropicApi, DsmlToolCallsBecomeToolUseBlocks) {
  const Tokenizer tokenizer = Tokenizer::from_file(source_path("models/tiny"));
  const std::string text = std::string("Bath is wet.</think>") + kToolCallAnswer;
  OutputDecoder decoder(tokenizer, /*chat=*/true, /*thinking=*/true, {}, "toolu_");
  server::MessageStream stream;
  std::vector<server::Json> events;
  const auto take = [&](const std::vector<server::Json>& e) { events.insert(events.end(), e.begin(), e.end()); };
  for (int32_t id : tokenizer.encode(text)) take(stream.delta(decoder.push(id)));
  take(stream.delta(decoder.finish()));
  take(stream.finish(server::stop_reason("tool_calls", ""), "", 42));

  // Four blocks, each opened, filled and closed in turn; then the message's end.
  std::vector<std::string> starts;
  std::vector<server::Json> blocks;      // as each block started
  std::map<int64_t, std::string> filled;  // per block: its text, thinking or partial JSON joined
  int64_t open = -1;
  for (const server::Json& e : events) {
    const std::string type = e["type"];
    if (type == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block opened before the last one closed";
      open = e["index"];
      EXPECT_EQ(open, int64_t(starts.size()));
      starts.push_back(e["content_block"]["type"]);
      blocks.push_back(e["content_block"]);
    } else if (type == "content_block_delta") {
      EXPECT_EQ(e["index"], open);
      const server::Json& d = e["delta"];
      filled[open] += d.contains("text") ? d["text"] : d.contains("thinking") ? d["thinking"] : d["partial_json"];
    } else if (type == "content_block_stop") {
      EXPECT_EQ(e["index"], open);
      open = -1;
    }
  }
  EXPECT_EQ(starts, (std::vector<std::string>{"thinking", "text", "tool_use", "tool_use"}));
  EXPECT_EQ(filled[0], "Bath is wet.");
  EXPECT_EQ(filled[1], "I shall ask.");
  EXPECT_EQ(server::Json::parse(filled[2]), (server::Json{{"town", "Bath"}, {"days", 3}}));
  EXPECT_EQ(filled[3], "{}");
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2].dump(),
            R"({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},)"
            R"("usage":{"output_tokens":42}})");
  EXPECT_EQ(events.back()["type"], "message_stop");

  // The whole message says the same, with the ids the stream gave.
  const server::Json message = server::message_json({"msg_1", "message", 0, "m"}, decoder.output(), "tool_use", "",
                                                    {.prompt_tokens = 7, .completion_tokens = 42});
  const server::Json& content = message["content"];
  ASSERT_EQ(content.size(), 4u);
  EXPECT_EQ(content[0].dump(), R"({"type":"thinking","thinking":"Bath is wet.","signature":""})");
  EXPECT_EQ(content[2]["id"], blocks[2]["id"]);
  EXPECT_EQ(blocks[2]["name"], "get_weather");
  EXPECT_EQ(content[2]["input"], (server::Json{{"town", "Bath"}, {"days", 3}}));
  EXPECT_EQ(content[3]["input"], server::Json::object());
  EXPECT_EQ(content[2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(message["stop_reason"], "tool_use");
  EXPECT_EQ(message["usage"].dump(), R"({"input_tokens":7,"output_tokens":42})");

  // A call cut off by max_tokens: its arguments so far, as DeepSeek's encoder would read them back.
  server::ChatChoice cut;
  cut.tool_calls.push_back({"toolu_2", "get_weather", "{\"town\": \"Ba"});
  EXPECT_EQ(server::message_json({"msg_2", "message", 0, "m"}, cut, "max_tokens", "", {})["content"][0]["input"],
            (server::Json{{"arguments", "{\"town\": \"Ba"}}));
  EXPECT_EQ(server::stop_reason("length", ""), "max_tokens");
  EXPECT_EQ(server::stop_reason("stop", "END"), "stop_sequence");
  EXPECT_EQ(server::stop_reason("stop", ""), "end_turn");
}

TEST(Metrics, PrometheusText) {
  server::Metrics m("tiny", 64);
  m.observe_ttft(0.003);
  m.observe_ttft(0.5);
  m.add_generation_tokens(7);
  m.finished("stop");
  m.request_phases(0.002, 0.03, 1.5, 17, 7);
  m.http_response(405);
  const std::string text = m.render({.running = 2, .waiting = 1, .slots = 4, .tokens_in_slots = 64});
  const auto has = [&](const std::string& line) { return text.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has("dsv4:num_requests_running{model_name=\"tiny\"} 2"));
  EXPECT_TRUE(has("dsv4:kv_cache_usage_perc{model_name=\"tiny\"} 0.5"));
  EXPECT_TRUE(has("dsv4:kv_cache_tokens_usage_perc{model_name=\"tiny\"} 0.25"));
  EXPECT_TRUE(has("dsv4:generation_tokens_total{model_name=\"tiny\"} 7"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.001\"} 0"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.005\"} 1"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} 2"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_count{model_name=\"tiny\"} 2"));
  EXPECT_TRUE(has("dsv4:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 1"));
  EXPECT_TRUE(has("dsv4:http_requests_total{model_name=\"tiny\",status=\"405\"} 1"));
  EXPECT_TRUE(has("dsv4:request_queue_time_seconds_bucket{model_name=\"tiny\",le=\"0.001\"} 0"));
  EXPECT_TRUE(has("dsv4:request_queue_time_seconds_bucket{model_name=\"tiny\",le=\"0.005\"} 1"));
  EXPECT_TRUE(has("dsv4:request_prefill_time_seconds_bucket{model_name=\"tiny\",le=\"0.025\"} 0"));
  EXPECT_TRUE(has("dsv4:request_prefill_time_seconds_bucket{model_name=\"tiny\",le=\"0.05\"} 1"));
  EXPECT_TRUE(has("dsv4:request_decode_time_seconds_sum{model_name=\"tiny\"} 1.5"));
  // Token buckets 1, 2, 5, 10, 20, 50 (≤ the context of 64): 17 prompt tokens fall in 20, 7 generated in 10.
  EXPECT_TRUE(has("dsv4:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"10\"} 0"));
  EXPECT_TRUE(has("dsv4:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"20\"} 1"));
  EXPECT_TRUE(has("dsv4:request_generation_tokens_bucket{model_name=\"tiny\",le=\"5\"} 0"));
  EXPECT_TRUE(has("dsv4:request_generation_tokens_bucket{model_name=\"tiny\",le=\"10\"} 1"));
  EXPECT_FALSE(has("dsv4:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"100\"} 1"));  // beyond the context
}

}  // namespace
}  // namespace dsv4::test
