"""Tool calls and reasoning on real model output: `dsv4 serve` with models/small, which was fine-tuned to write
V4's reasoning and DSML tool calls (tools/train_small/finetune.py, models/small/README.md), driven by the official
openai and anthropic Python clients on the CPU, greedy.

The tiny model of test_openai.py / test_anthropic.py never writes DSML, so there the mapping of tool calls is
tested below the HTTP layer or forced by constrained decoding. Here the model itself decides to call a tool: what is
tested is the engine's side of that — the streamed tool-call arguments against the whole answer, reasoning kept
apart from content, nothing of the DSML or the think markers leaking into either, and an agent round trip (call,
result, answer) on both APIs. The model is 10M parameters: it picks the right tool, but it often copies an argument
wrongly (asked about Paris, it may ask the tool about Prague), so argument values are asserted only where noted.

Run by ctest (tests/server/tests.cmake):
    DSV4_CLI=build/bin/dsv4 build/venv/bin/python -m unittest -v tests/server/test_tool_model.py
"""

import json
import os
import sys
import unittest

import anthropic

from test_openai import DSV4, Server

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SMALL = os.path.join(ROOT, "models", "small")
sys.path.insert(0, os.path.join(ROOT, "tools", "train_small"))
import chat_data  # noqa: E402  (the fine-tune's conversations and the tool schemas the model was trained on)

MODEL = "small"
TOOLS = {t["function"]["name"]: t for t in chat_data.TOOLS}
TOKYO_TIME = json.dumps({"city": "Tokyo", "time": "14:05"})
MARKERS = ("DSML", "</think>", "<think>", "<｜")  # what must never reach a client's reasoning or content


def thinking(on):
    return {"chat_template_kwargs": {"thinking": on}}


class ToolModelCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--model", SMALL, "--served-model-name", MODEL)
        cls.client = cls.server.client

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def assertClean(self, text):
        for marker in MARKERS:
            self.assertNotIn(marker, text or "")


class TestOpenAI(ToolModelCase):
    """Chat completions with tools: whole and streamed, thinking and chat mode, a tool not needed, a round trip."""

    def ask(self, text, tools, think, **kw):
        return dict(model=MODEL, messages=[{"role": "user", "content": text}], tools=[TOOLS[t] for t in tools],
                    temperature=0, max_tokens=200, extra_body=thinking(think), **kw)

    def test_render_is_the_engines(self):
        # The fine-tune's training text (chat_data.render) is the prompt the server builds for the same messages.
        tokenizer = os.path.join(SMALL, "tokenizer.json")
        self.assertEqual(chat_data.check(self.server.url, chat_data.conversations(40, 3), DSV4, tokenizer), 0)

    def test_tool_call_with_reasoning(self):
        r = self.client.chat.completions.create(**self.ask("What time is it in Tokyo?", ["get_time", "calculate"], True))
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        m = choice.message
        reasoning = m.model_extra.get("reasoning_content")
        self.assertTrue(reasoning)
        self.assertClean(reasoning)
        self.assertFalse(m.content)
        self.assertEqual(len(m.tool_calls), 1)
        call = m.tool_calls[0]
        self.assertEqual((call.type, call.function.name), ("function", "get_time"))
        self.assertTrue(call.id.startswith("call_"))
        self.assertEqual(json.loads(call.function.arguments), {"city": "Tokyo"})

    def test_streamed_tool_call_is_the_whole_one(self):
        kw = self.ask("Find books by Jane Austen.", ["search_books", "get_weather"], True)
        whole = self.client.chat.completions.create(**kw).choices[0]
        self.assertTrue(whole.message.tool_calls)
        reasoning, content, calls, finish = [], [], {}, None
        for chunk in self.client.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            finish = c.finish_reason or finish
            reasoning.append(c.delta.model_extra.get("reasoning_content") or "")
            content.append(c.delta.content or "")
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    self.assertIsNone(call["id"])  # the id and the name come once, in the call's first delta
                    call["id"], call["name"] = d.id, d.function.name
                call["arguments"] += d.function.arguments or ""
        self.assertEqual(finish, whole.finish_reason)
        self.assertEqual("".join(reasoning), whole.message.model_extra["reasoning_content"])
        self.assertEqual("".join(content), whole.message.content or "")
        self.assertEqual([(c["name"], c["arguments"]) for _, c in sorted(calls.items())],
                         [(t.function.name, t.function.arguments) for t in whole.message.tool_calls])
        for _, c in sorted(calls.items()):
            self.assertEqual(c["name"], "search_books")
            args = json.loads(c["arguments"])
            self.assertEqual(args["query"], "Jane Austen")
            self.assertIsInstance(args.get("max_results", 0), int)

    def test_chat_mode_has_no_reasoning(self):
        m = self.client.chat.completions.create(**self.ask("What is the weather in Paris?", ["get_weather", "get_time"],
                                                           False)).choices[0].message
        self.assertIsNone(m.model_extra.get("reasoning_content"))
        self.assertFalse(m.content)
        self.assertEqual([t.function.name for t in m.tool_calls], ["get_weather"])
        self.assertIn("city", json.loads(m.tool_calls[0].function.arguments))

    def test_no_call_where_no_tool_is_needed(self):
        choice = self.client.chat.completions.create(**self.ask("Hello!", ["get_weather"], True)).choices[0]
        self.assertEqual(choice.finish_reason, "stop")
        self.assertFalse(choice.message.tool_calls)
        self.assertTrue(choice.message.content)
        self.assertClean(choice.message.content)
        self.assertClean(choice.message.model_extra.get("reasoning_content"))

    def test_round_trip_answers_from_the_tool_result(self):
        kw = self.ask("What time is it in Tokyo?", ["get_time", "calculate"], True)
        first = self.client.chat.completions.create(**kw).choices[0].message
        call = first.tool_calls[0]
        kw["messages"] += [
            {"role": "assistant", "content": None, "reasoning_content": first.model_extra["reasoning_content"],
             "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": TOKYO_TIME}]
        answer = self.client.chat.completions.create(**kw).choices[0]
        self.assertEqual(answer.finish_reason, "stop")
        self.assertFalse(answer.message.tool_calls)
        self.assertClean(answer.message.content)
        self.assertIn("14:05", answer.message.content)  # the model copies the tool's result into its answer


class TestAnthropic(ToolModelCase):
    """Messages with tools: tool_use blocks whole and streamed, thinking blocks, a tool_result round trip."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.anthropic = anthropic.Anthropic(base_url=cls.server.url, api_key="unused", max_retries=0, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.anthropic.close()
        super().tearDownClass()

    def ask(self, messages):
        tools = [{"name": t, "description": TOOLS[t]["function"]["description"],
                  "input_schema": TOOLS[t]["function"]["parameters"]} for t in ("get_weather", "get_time")]
        return dict(model=MODEL, max_tokens=200, tools=tools, messages=messages,
                    thinking={"type": "enabled", "budget_tokens": 200}, extra_body={"temperature": 0})

    def test_tool_use_whole_and_streamed(self):
        kw = self.ask([{"role": "user", "content": "What time is it in Tokyo?"}])
        whole = self.anthropic.messages.create(**kw)
        self.assertEqual(whole.stop_reason, "tool_use")
        self.assertEqual([b.type for b in whole.content], ["thinking", "tool_use"])
        self.assertClean(whole.content[0].thinking)
        use = whole.content[1]
        self.assertTrue(use.id.startswith("toolu_"))
        self.assertEqual(use.name, "get_time")
        self.assertEqual(list(use.input), ["city"])
        self.assertIsInstance(use.input["city"], str)

        blocks, partial = {}, {}
        with self.anthropic.messages.stream(**kw) as stream:
            for event in stream:
                if event.type == "content_block_start":
                    blocks[event.index] = event.content_block.type
                elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    partial[event.index] = partial.get(event.index, "") + event.delta.partial_json
            final = stream.get_final_message()
        self.assertEqual(list(blocks.values()), ["thinking", "tool_use"])
        self.assertEqual(json.loads(partial[1]), use.input)  # the streamed input, piece by piece, is the whole one
        self.assertEqual(final.stop_reason, "tool_use")
        self.assertEqual(final.content[0].thinking, whole.content[0].thinking)
        self.assertEqual((final.content[1].name, final.content[1].input), (use.name, use.input))

    def test_agent_round_trip(self):
        messages = [{"role": "user", "content": "What time is it in Tokyo?"}]
        first = self.anthropic.messages.create(**self.ask(messages))
        use = [b for b in first.content if b.type == "tool_use"][0]
        result = json.dumps({"city": use.input["city"], "time": "14:05"})
        messages += [{"role": "assistant", "content": first.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}]
        answer = self.anthropic.messages.create(**self.ask(messages))
        self.assertEqual(answer.stop_reason, "end_turn")
        self.assertEqual([b.type for b in answer.content], ["thinking", "text"])
        self.assertClean(answer.content[1].text)
        self.assertIn("14:05", answer.content[1].text)


if __name__ == "__main__":
    unittest.main()
