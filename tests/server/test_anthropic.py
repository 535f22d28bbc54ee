"""`dsv4 serve`'s Anthropic Messages API (POST /v1/messages) driven by the official `anthropic` Python client (and
raw HTTP for the exact event stream and error bodies), on the shipped tiny model on the CPU.

Run by ctest (tests/server/tests.cmake) with the venv that tools/setup makes:
    DSV4_CLI=build/bin/dsv4 build/venv/bin/python -m unittest -v tests/server/test_anthropic.py
The tiny model never writes DSML tool calls of its own; their mapping to tool_use blocks is tested in
test_server.cpp, calls forced by tool_choice any / tool in test_structured.py, and calls that a model writes itself
(models/small) in test_tool_model.py.
"""

import json
import random
import unittest

import anthropic

from test_openai import MODEL, Server, ServerCase, chat

GREEDY = {"temperature": 0}  # the SDK has no sampling arguments; the API still takes them
WEATHER = {"name": "get_weather", "description": "Weather of a town",
           "input_schema": {"type": "object", "properties": {"town": {"type": "string"}}, "required": ["town"]}}


def user(text):
    return [{"role": "user", "content": text}]


def client_for(server, api_key="unused"):
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=300)


class TestMessages(ServerCase):
    """Messages, whole and streamed, thinking blocks, tool results, stop sequences and errors."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.anthropic = client_for(cls.server)

    @classmethod
    def tearDownClass(cls):
        cls.anthropic.close()
        super().tearDownClass()

    def events(self, body):
        """The raw SSE stream of a request: (event name, data) pairs."""
        out = []
        with self.server.http.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
            self.assertEqual(r.status_code, 200)
            self.assertTrue(r.headers["content-type"].startswith("text/event-stream"))
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[len("event: "):]
                elif line.startswith("data: "):
                    out.append((name, json.loads(line[len("data: "):])))
                    name = None
        return out

    def test_message_whole_and_streamed_agree(self):
        kw = dict(model=MODEL, max_tokens=12, messages=user("How do you do?"), extra_body=GREEDY)
        whole = self.anthropic.messages.create(**kw)
        self.assertTrue(whole.id.startswith("msg_"))
        self.assertEqual((whole.type, whole.role, whole.model), ("message", "assistant", MODEL))
        self.assertEqual(whole.stop_reason, "max_tokens")
        self.assertIsNone(whole.stop_sequence)
        self.assertEqual(whole.usage.output_tokens, 12)
        self.assertEqual([b.type for b in whole.content], ["text"])
        # The same prompt and greedy answer as the OpenAI route.
        openai_side = self.client.chat.completions.create(model=MODEL, messages=chat("How do you do?"), max_tokens=12,
                                                          temperature=0)
        self.assertEqual(whole.content[0].text, openai_side.choices[0].message.content)
        self.assertEqual(whole.usage.input_tokens, openai_side.usage.prompt_tokens)

        with self.anthropic.messages.stream(**kw) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        self.assertEqual(text, whole.content[0].text)
        self.assertEqual(final.content[0].text, whole.content[0].text)
        self.assertEqual((final.stop_reason, final.usage.input_tokens, final.usage.output_tokens),
                         ("max_tokens", whole.usage.input_tokens, 12))

    def test_stream_event_order(self):
        events = self.events({"model": MODEL, "max_tokens": 6, "messages": user("Hello"), **GREEDY})
        names = [name for name, _ in events]
        self.assertEqual(names, [data["type"] for _, data in events])  # the event name is the data's type
        self.assertEqual(names[:2], ["message_start", "ping"])
        self.assertEqual(names[-2:], ["message_delta", "message_stop"])
        blocks = names[2:-2]
        self.assertEqual(blocks[0], "content_block_start")
        self.assertEqual(blocks[-1], "content_block_stop")
        self.assertEqual(set(blocks[1:-1]), {"content_block_delta"})
        start = events[0][1]["message"]
        self.assertEqual((start["content"], start["stop_reason"], start["usage"]["output_tokens"]), ([], None, 0))
        self.assertGreater(start["usage"]["input_tokens"], 0)
        self.assertEqual(events[2][1]["content_block"], {"type": "text", "text": ""})
        self.assertTrue(all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for _, d in events[3:-3]))
        self.assertEqual(events[-2][1]["delta"], {"stop_reason": "max_tokens", "stop_sequence": None})
        self.assertEqual(events[-2][1]["usage"], {"output_tokens": 6})

    def test_thinking_blocks(self):
        for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}):
            with self.subTest(thinking=thinking):
                kw = dict(model=MODEL, max_tokens=8, messages=user("Why?"), thinking=thinking, extra_body=GREEDY)
                whole = self.anthropic.messages.create(**kw)
                # The tiny model never closes </think>: everything it writes is thinking.
                self.assertEqual([b.type for b in whole.content], ["thinking"])
                self.assertTrue(whole.content[0].thinking)
                with self.anthropic.messages.stream(**kw) as stream:
                    kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
                    final = stream.get_final_message()
                self.assertEqual(set(kinds), {"thinking_delta"})
                self.assertEqual(final.content[0].thinking, whole.content[0].thinking)
        # Thinking mode is V4's chat encoding: the same prompt as the OpenAI route's thinking, disabled as chat mode.
        r = self.anthropic.messages.create(model=MODEL, max_tokens=1, messages=user("Why?"),
                                           thinking={"type": "disabled"})
        plain = self.client.chat.completions.create(model=MODEL, messages=chat("Why?"), max_tokens=1)
        self.assertEqual(r.usage.input_tokens, plain.usage.prompt_tokens)
        most = self.anthropic.messages.create(model=MODEL, max_tokens=1, messages=user("Why?"),
                                              thinking={"type": "adaptive"}, output_config={"effort": "max"})
        self.assertGreater(most.usage.input_tokens, r.usage.input_tokens + 20)  # DeepSeek's max-effort prompt

    def test_system_prefill_and_stop_sequences(self):
        as_text = self.anthropic.messages.create(model=MODEL, max_tokens=1, system="Be brief.", messages=user("Hi"))
        as_blocks = self.anthropic.messages.create(model=MODEL, max_tokens=1, messages=user("Hi"),
                                                   system=[{"type": "text", "text": "Be brief."}])
        bare = self.anthropic.messages.create(model=MODEL, max_tokens=1, messages=user("Hi"))
        self.assertEqual(as_text.usage.input_tokens, as_blocks.usage.input_tokens)
        self.assertGreater(as_text.usage.input_tokens, bare.usage.input_tokens)
        # A final assistant message is continued, as the OpenAI route's prefix message.
        prefill = self.anthropic.messages.create(model=MODEL, max_tokens=5, extra_body=GREEDY, messages=[
            *user("Tell me of Bath."), {"role": "assistant", "content": "Bath is"}])
        prefix = self.client.chat.completions.create(model=MODEL, max_tokens=5, temperature=0, messages=[
            *chat("Tell me of Bath."), {"role": "assistant", "content": "Bath is", "prefix": True}])
        self.assertEqual(prefill.content[0].text, prefix.choices[0].message.content)

        kw = dict(model=MODEL, max_tokens=16, messages=user("How do you do?"), extra_body=GREEDY)
        text = self.anthropic.messages.create(**kw).content[0].text
        stop = text[len(text) // 2:len(text) // 2 + 3]
        cut = self.anthropic.messages.create(**kw, stop_sequences=["never written", stop])
        self.assertEqual((cut.stop_reason, cut.stop_sequence), ("stop_sequence", stop))
        self.assertEqual(cut.content[0].text, text[:text.index(stop)])
        with self.anthropic.messages.stream(**kw, stop_sequences=[stop]) as stream:
            self.assertEqual("".join(stream.text_stream), cut.content[0].text)
            final = stream.get_final_message()
        self.assertEqual((final.stop_reason, final.stop_sequence), ("stop_sequence", stop))

    def test_tool_use_round_trip(self):
        ask = user("What is the weather in Bath?")
        first = self.anthropic.messages.create(model=MODEL, max_tokens=4, messages=ask, tools=[WEATHER])
        none = self.anthropic.messages.create(model=MODEL, max_tokens=4, messages=ask, tools=[WEATHER],
                                              tool_choice={"type": "none"})
        self.assertGreater(first.usage.input_tokens, none.usage.input_tokens + 50)  # the tool schemas
        # The model's tool_use and the client's tool_result go back in: the same prompt as OpenAI's tool_calls and
        # tool message, and an answer to them.
        history = ask + [
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"town": "Bath"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "Rain"}]}]}]
        answer = self.anthropic.messages.create(model=MODEL, max_tokens=6, messages=history, tools=[WEATHER],
                                                tool_choice={"type": "auto"}, extra_body=GREEDY)
        openai_history = chat("What is the weather in Bath?") + [
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "toolu_01", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"town": "Bath"})}}]},
            {"role": "tool", "tool_call_id": "toolu_01", "content": "Rain"}]
        tools = [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                   "parameters": WEATHER["input_schema"]}}]
        same = self.client.chat.completions.create(model=MODEL, messages=openai_history, tools=tools, max_tokens=6,
                                                   temperature=0)
        self.assertEqual(answer.usage.input_tokens, same.usage.prompt_tokens)
        self.assertEqual(answer.content[0].text, same.choices[0].message.content)
        self.assertEqual(answer.stop_reason, "max_tokens")

    def assert_error(self, response, status, kind):
        self.assertEqual(response.status_code, status, response.text)
        body = response.json()
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], kind)
        self.assertTrue(body["error"]["message"])

    def test_errors(self):
        ok = {"model": MODEL, "max_tokens": 4, "messages": user("Hi")}
        cases = [
            ("{not json", 400, "invalid_request_error"),
            ({"model": MODEL, "messages": user("Hi")}, 400, "invalid_request_error"),  # no max_tokens
            ({**ok, "messages": []}, 400, "invalid_request_error"),
            ({**ok, "messages": [{"role": "user", "content": []}]}, 400, "invalid_request_error"),  # was a crash
            ({**ok, "messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error"),
            ({**ok, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
             "invalid_request_error"),
            ({**ok, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_time"}}, 400,
             "invalid_request_error"),
            ({**ok, "tools": [{**WEATHER, "strict": True}]}, 400, "invalid_request_error"),
            ({**ok, "tools": [{"name": "f"}]}, 400, "invalid_request_error"),
            ({**ok, "thinking": {"type": "enabled"}}, 400, "invalid_request_error"),
            ({**ok, "temperature": 3}, 400, "invalid_request_error"),
            ({**ok, "max_tokens": 10 ** 6}, 400, "invalid_request_error"),  # beyond the context
            ({**ok, "model": "claude-x"}, 404, "not_found_error"),
        ]
        for body, status, kind in cases:
            with self.subTest(body=str(body)[:80]):
                content = body if isinstance(body, str) else json.dumps(body)
                self.assert_error(self.server.http.post("/v1/messages", content=content), status, kind)
        self.assert_error(self.server.http.get("/v1/messages"), 405, "invalid_request_error")
        with self.assertRaises(anthropic.NotFoundError):
            self.anthropic.messages.create(model="claude-x", max_tokens=2, messages=user("Hi"))
        with self.assertRaises(anthropic.BadRequestError) as refused:
            self.anthropic.messages.create(model=MODEL, max_tokens=2, messages=user("Hi"), tools=[WEATHER],
                                           tool_choice={"type": "tool", "name": "get_time"})
        self.assertIn("tool_choice", refused.exception.body["error"]["message"])
        r = self.anthropic.messages.create(model=MODEL, max_tokens=2, messages=user("Still there?"))
        self.assertEqual(r.usage.output_tokens, 2)


    def test_structured_fuzz(self):
        # Valid bodies with fields (top-level, in messages and in content blocks) replaced by random JSON of every
        # type (seeded: reproducible). Whatever comes back is a 2xx or a 4xx in Anthropic's shape, never a 5xx.
        rng = random.Random(27)
        odd = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63, 1e308, 0.5, "", "x", "💥",
               "<｜end▁of▁sentence｜>", [], [1], ["a"], {}, {"type": "text"}, {"type": "text", "text": "hi"},
               {"type": "tool_use"},
               {"type": "tool_result", "tool_use_id": "t"}, {"type": "thinking", "thinking": "hm"},
               {"type": "enabled", "budget_tokens": 2048}, {"type": "adaptive"}, {"type": "auto"}, {"type": "any"},
               {"role": "user", "content": "hi"}, {"role": "assistant", "content": []}, WEATHER]
        fields = ["model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "top_k",
                  "tools", "tool_choice", "thinking", "output_config", "metadata", "stream"]
        inner = ["role", "content", "type", "text", "id", "name", "input", "tool_use_id", "is_error", "thinking",
                 "input_schema", "budget_tokens", "effort"]

        def value(depth=0):
            if depth < 3 and rng.random() < 0.25:
                return [value(depth + 1) for _ in range(rng.randint(0, 3))]
            if depth < 3 and rng.random() < 0.2:
                return {rng.choice(inner): value(depth + 1) for _ in range(rng.randint(1, 3))}
            return rng.choice(odd)

        statuses = {}
        for i in range(500):
            body = {"model": MODEL, "max_tokens": 2, "messages": user("Hi")}
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.5:
                    body[rng.choice(fields)] = value()
                else:  # inside the message: its role, content or a content block's fields
                    block = {"type": rng.choice(["text", "tool_use", "tool_result", "thinking", "image"]),
                             rng.choice(inner): value()}
                    body["messages"] = [{"role": rng.choice(["user", "assistant"]), "content": [block]}]
            if body.get("stream") is True:
                body["stream"] = False  # a stream's status is 200 before the engine runs; judged elsewhere
            if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 4:
                body["max_tokens"] = 4
            text = json.dumps(body)
            r = self.server.http.post("/v1/messages", content=text)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            self.assertLess(r.status_code, 500, f"case {i}: {text[:300]} -> {r.text[:300]}")
            if r.status_code >= 400:
                error = r.json()
                self.assertEqual(error["type"], "error", text[:300])
                self.assertEqual(set(error["error"]), {"type", "message"}, text[:300])
            else:
                self.assertEqual(r.json()["type"], "message")
        self.assertGreater(statuses.get(400, 0), 100)  # the fuzz reaches the validation
        self.assertGreater(statuses.get(200, 0), 20)
        self.assertEqual(self.server.http.get("/health").status_code, 200)


class TestMessagesAccess(unittest.TestCase):
    """--api-key: Anthropic's clients send it as x-api-key; errors keep Anthropic's shape."""

    def test_x_api_key(self):
        server = Server("--api-key", "s3cret")
        try:
            with client_for(server, "s3cret") as good:
                r = good.messages.create(model=MODEL, max_tokens=2, messages=user("Hi"))
                self.assertEqual(r.usage.output_tokens, 2)
            with client_for(server, "wrong") as bad, self.assertRaises(anthropic.AuthenticationError) as refused:
                bad.messages.create(model=MODEL, max_tokens=2, messages=user("Hi"))
            self.assertEqual(refused.exception.body["error"]["type"], "authentication_error")
            body = {"model": MODEL, "max_tokens": 2, "messages": user("Hi")}
            for headers, status in (({}, 401), ({"x-api-key": "s3cret2"}, 401),
                                    ({"authorization": "Bearer s3cret"}, 200)):
                with self.subTest(headers=headers):
                    r = server.http.post("/v1/messages", json=body, headers=headers)
                    self.assertEqual(r.status_code, status, r.text)
            # The key works on the OpenAI routes too, and those keep OpenAI's error shape.
            self.assertEqual(server.http.get("/v1/models", headers={"x-api-key": "s3cret"}).status_code, 200)
            self.assertEqual(server.http.get("/v1/models").json()["error"]["code"], "invalid_api_key")
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
