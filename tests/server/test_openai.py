"""`dsv4 serve` driven by the official `openai` Python client (and raw HTTP where the client would hide the
details), on the shipped tiny model on the CPU.

Run by ctest (tests/server/tests.cmake) with the venv that tools/setup makes:
    DSV4_CLI=build/bin/dsv4 build/venv/bin/python -m unittest -v tests/server/test_openai.py
Each test class starts its own server on a free port and stops it at the end.
"""

import json
import math
import os
import random
import re
import socket
import subprocess
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

DSV4 = os.environ.get("DSV4_CLI", os.path.join(os.path.dirname(__file__), "../../build/bin/dsv4"))
MODEL = "tiny"


class Server:
    """A `dsv4 serve` subprocess on a free port (--port 0; the port is read from its first stderr line)."""

    def __init__(self, *args, env=None, api_key="unused"):
        self.proc = subprocess.Popen([DSV4, "serve", "--backend", "cpu", "--port", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.log = []
        line = self.proc.stderr.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"dsv4 serve did not start: {line}{self.proc.stderr.read()}")
        self.url = match.group(1)
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=300)
        self.http = httpx.Client(base_url=self.url, timeout=300)

    def metric(self, name, labels=""):
        """A series' value: name{model_name="...",labels} (labels: further label pairs, in the server's order)."""
        text = self.http.get("/metrics").text
        pattern = r"^" + re.escape(name) + r'\{model_name="[^"]*"' + ("," + re.escape(labels) if labels else "") + r"\} (\S+)$"
        match = re.search(pattern, text, re.M)
        return float(match.group(1)) if match else None

    def stop(self):
        self.http.close()
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


def read_response(reader):
    """Reads one response with a Content-Length from a raw connection's reader (sock.makefile("rb")): (status,
    head as text, body)."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline()
        if not line:
            raise ConnectionError(f"closed after {head!r}")
        head += line
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    body = reader.read(length)
    return int(head.split(b" ", 2)[1]), head.decode("latin-1"), body


def chat(text):
    return [{"role": "user", "content": text}]


PROMPTS = [
    "It is a truth universally acknowledged",
    "Mr. Darcy",
    "Elizabeth walked",
    "The ball at Netherfield",
    "My dear Miss Bennet, said he,",
    "Emma Woodhouse, handsome, clever, and rich,",
    "She was",
    "Captain Wentworth",
]


class ServerCase(unittest.TestCase):
    server_args = ()

    @classmethod
    def setUpClass(cls):
        cls.server = Server(*cls.server_args)
        cls.client = cls.server.client

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        if code != 0:
            raise AssertionError(f"dsv4 serve exited with {code}:\n{''.join(cls.server.log)}")


class TestApi(ServerCase):
    """Endpoints, streaming, sampling parameters, thinking mode and tools, one request at a time."""

    def test_echo(self):
        text = "It is a truth universally acknowledged"
        plain = self.client.completions.create(model=MODEL, prompt=text, max_tokens=6, temperature=0).choices[0].text
        echoed = self.client.completions.create(model=MODEL, prompt=text, max_tokens=6, temperature=0, echo=True)
        self.assertEqual(echoed.choices[0].text, text + plain)
        pieces = [c.choices[0].text for c in self.client.completions.create(
            model=MODEL, prompt=text, max_tokens=6, temperature=0, echo=True, stream=True) if c.choices]
        self.assertEqual(pieces[0][:len(text)], text)
        self.assertEqual("".join(pieces), text + plain)
        # Token prompts echo their decoded text; each of n choices starts with its prompt.
        ids = self.server.http.post("/tokenize", json={"model": MODEL, "prompt": "Mr. Darcy",
                                                       "add_special_tokens": False}).json()["tokens"]
        r = self.client.completions.create(model=MODEL, prompt=[ids, ids], max_tokens=2, echo=True, n=2)
        self.assertEqual(len(r.choices), 4)
        self.assertTrue(all(c.text.startswith("Mr. Darcy") for c in r.choices))

    def assert_distribution(self, logprob, top, asked):
        """One token's logprobs: ≤ 0, `asked` alternatives, most likely first, their probabilities ≤ 1 in all."""
        self.assertLessEqual(logprob, 0)
        self.assertEqual(len(top), asked)
        values = [t.logprob if hasattr(t, "logprob") else t for t in top]
        self.assertEqual(values, sorted(values, reverse=True))
        self.assertLessEqual(sum(math.exp(v) for v in values), 1 + 1e-6)

    def test_chat_logprobs(self):
        kw = dict(model=MODEL, messages=chat("How do you do?"), max_tokens=8, temperature=0, logprobs=True,
                  top_logprobs=5)
        whole = self.client.chat.completions.create(**kw)
        content = whole.choices[0].logprobs.content
        self.assertEqual(len(content), whole.usage.completion_tokens)
        self.assertEqual("".join(t.token for t in content), whole.choices[0].message.content)
        for t in content:
            self.assert_distribution(t.logprob, t.top_logprobs, 5)
            # Greedy picks the most likely token of the raw distribution.
            self.assertEqual((t.token, t.logprob), (t.top_logprobs[0].token, t.top_logprobs[0].logprob))
            self.assertEqual(bytes(t.bytes).decode(), t.token)
        # Streamed: each chunk carries its tokens' logprobs, the same ones.
        chunks = [c for c in self.client.chat.completions.create(**kw, stream=True) if c.choices]
        streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
        self.assertEqual([t.model_dump() for t in streamed], [t.model_dump() for t in content])
        # Sampled: the logprobs are the model's own (before temperature and top-k): at temperature 2 with a seed,
        # the same as greedy's for the same first token.
        sampled = self.client.chat.completions.create(**{**kw, "temperature": 2.0, "seed": 5, "max_tokens": 6,
                                                         "extra_body": {"top_k": 3}})
        first = sampled.choices[0].logprobs.content[0]
        self.assertEqual(first.top_logprobs, content[0].top_logprobs)
        self.assertIn(first.token, [t.token for t in first.top_logprobs[:3]])  # top_k 3 kept only those
        for t in sampled.choices[0].logprobs.content:
            self.assert_distribution(t.logprob, t.top_logprobs, 5)
            self.assertGreaterEqual(t.logprob, t.top_logprobs[2].logprob)
        # Without logprobs: null; with logprobs and no top_logprobs: the tokens alone.
        self.assertIsNone(self.client.chat.completions.create(model=MODEL, messages=chat("Hi"), max_tokens=2)
                          .choices[0].logprobs)
        bare = self.client.chat.completions.create(model=MODEL, messages=chat("Hi"), max_tokens=2, logprobs=True)
        self.assertEqual([t.top_logprobs for t in bare.choices[0].logprobs.content], [[], []])

    def test_completion_logprobs(self):
        kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=10, temperature=0, logprobs=3)
        whole = self.client.completions.create(**kw)
        choice = whole.choices[0]
        lp = choice.logprobs
        self.assertEqual(len(lp.tokens), whole.usage.completion_tokens)
        self.assertEqual("".join(lp.tokens), choice.text)
        self.assertEqual(lp.text_offset, [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))])
        for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            # Greedy: the token is the most likely, so the 3 alternatives hold it (no extra entry).
            self.assertEqual(list(top)[0], token)
            self.assertEqual(top[token], logprob)
            self.assert_distribution(logprob, list(top.values()), 3)
        streamed = [c.choices[0].logprobs for c in self.client.completions.create(**kw, stream=True)
                    if c.choices[0].logprobs]
        self.assertEqual(sum((s.tokens for s in streamed), []), lp.tokens)
        self.assertEqual(sum((s.token_logprobs for s in streamed), []), lp.token_logprobs)
        self.assertEqual(sum((s.top_logprobs for s in streamed), []), lp.top_logprobs)
        self.assertEqual(sum((s.text_offset for s in streamed), []), lp.text_offset)
        # logprobs 0: the sampled token's own entry only.
        zero = self.client.completions.create(**{**kw, "logprobs": 0, "max_tokens": 3}).choices[0].logprobs
        self.assertEqual(zero.top_logprobs, [{t: l} for t, l in zip(zero.tokens, zero.token_logprobs)])

    def test_tokenize_detokenize(self):
        http = self.server.http
        # The ids a completion feeds the model: the count equals its usage's prompt tokens, BOS included.
        text = "It is a truth universally acknowledged"
        t = http.post("/tokenize", json={"model": MODEL, "prompt": text}).json()
        self.assertEqual(set(t), {"count", "max_model_len", "tokens", "token_strs"})
        self.assertEqual(t["count"], len(t["tokens"]))
        r = self.client.completions.create(model=MODEL, prompt=text, max_tokens=1)
        self.assertEqual(t["count"], r.usage.prompt_tokens)
        plain = http.post("/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": False}).json()
        self.assertEqual(plain["tokens"], t["tokens"][1:])
        self.assertEqual(http.post("/detokenize", json={"model": MODEL, "tokens": plain["tokens"]}).json(),
                         {"prompt": text})
        # The chat form: the prompt /v1/chat/completions builds.
        c = http.post("/tokenize", json={"model": MODEL, "messages": chat("Hello")}).json()
        r = self.client.chat.completions.create(model=MODEL, messages=chat("Hello"), max_tokens=1)
        self.assertEqual(c["count"], r.usage.prompt_tokens)
        # Bad input: the error shape and status.
        for path, body, status in (("/tokenize", {"prompt": "x"}, 400), ("/tokenize", {"model": MODEL}, 400),
                                   ("/tokenize", {"model": MODEL, "prompt": 5}, 400),
                                   ("/tokenize", {"model": "gpt-4", "prompt": "x"}, 404),
                                   # A conversation the chat encoding refuses (this was a 500).
                                   ("/tokenize", {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
                                    400),
                                   ("/tokenize", {"model": MODEL, "messages": [{"role": "user",
                                                                                "content": [{"type": {}}]}]}, 400),
                                   ("/detokenize", {"model": MODEL, "tokens": [1, -2]}, 400),
                                   ("/detokenize", {"model": MODEL, "tokens": [10 ** 9]}, 400),
                                   ("/detokenize", {"model": MODEL, "tokens": "1 2"}, 400)):
            with self.subTest(path=path, body=body):
                r = http.post(path, json=body)
                self.assertEqual(r.status_code, status, r.text)
                self.assertEqual(set(r.json()["error"]), {"message", "type", "param", "code"})
        self.assertEqual(http.get("/tokenize").status_code, 405)

    def test_models_health_metrics(self):
        self.assertEqual([m.id for m in self.client.models.list()], [MODEL])
        self.assertEqual(self.server.http.get("/health").status_code, 200)
        self.client.completions.create(model=MODEL, prompt="Mr. Darcy", max_tokens=3, temperature=0)
        text = self.server.http.get("/metrics").text
        for name in ["dsv4:num_requests_running", "dsv4:num_requests_waiting", "dsv4:kv_cache_usage_perc",
                     "dsv4:prompt_tokens_total", "dsv4:generation_tokens_total",
                     "dsv4:time_to_first_token_seconds_bucket", "dsv4:inter_token_latency_seconds_bucket",
                     "dsv4:e2e_request_latency_seconds_count", "dsv4:request_queue_time_seconds_bucket",
                     "dsv4:request_prefill_time_seconds_sum", "dsv4:request_decode_time_seconds_count",
                     "dsv4:request_prompt_tokens_bucket", "dsv4:request_generation_tokens_count"]:
            self.assertIn(name, text)
        # Every series carries the served model's name, as vLLM's do.
        for line in text.splitlines():
            if not line.startswith("#"):
                self.assertIn('{model_name="tiny"', line)
        self.assertGreaterEqual(self.server.metric("dsv4:generation_tokens_total"), 3)
        # The completion's phases: one more sequence in each histogram, its 3 tokens among the generation counts.
        self.assertGreaterEqual(self.server.metric("dsv4:request_queue_time_seconds_count"), 1)
        self.assertGreaterEqual(self.server.metric("dsv4:request_prefill_time_seconds_count"), 1)
        self.assertGreaterEqual(self.server.metric("dsv4:request_generation_tokens_sum"), 3)
        self.assertGreaterEqual(self.server.metric("dsv4:request_generation_tokens_bucket", 'le="5"'), 1)

    def test_chat_non_streaming_and_streaming_agree(self):
        whole = self.client.chat.completions.create(model=MODEL, messages=chat("How do you do?"), max_tokens=12,
                                                    temperature=0)
        choice = whole.choices[0]
        self.assertEqual(whole.object, "chat.completion")
        self.assertEqual(choice.message.role, "assistant")
        self.assertEqual(choice.finish_reason, "length")
        self.assertTrue(choice.message.content)
        self.assertEqual(whole.usage.completion_tokens, 12)
        self.assertEqual(whole.usage.total_tokens, whole.usage.prompt_tokens + 12)

        stream = self.client.chat.completions.create(model=MODEL, messages=chat("How do you do?"), max_tokens=12,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True})
        chunks = list(stream)
        self.assertTrue(all(c.object == "chat.completion.chunk" for c in chunks))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, choice.message.content)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "length")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)

    def test_completions_non_streaming_and_streaming_agree(self):
        whole = self.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0)
        self.assertEqual(whole.object, "text_completion")
        self.assertEqual(whole.choices[0].finish_reason, "length")
        self.assertEqual(whole.usage.completion_tokens, 16)
        chunks = list(self.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0,
                                                     stream=True))
        self.assertEqual("".join(c.choices[0].text for c in chunks), whole.choices[0].text)
        self.assertEqual(chunks[-1].choices[0].finish_reason, "length")
        # The same greedy continuation as the CLI.
        cli = subprocess.run([DSV4, "generate", "--backend", "cpu", "-p", PROMPTS[0], "--max-tokens", "16",
                              "--temperature", "0"], capture_output=True, text=True, check=True).stdout
        self.assertEqual(cli.rstrip("\n"), PROMPTS[0] + whole.choices[0].text)

    def test_raw_stream_ends_with_done(self):
        body = {"model": MODEL, "prompt": "She was", "max_tokens": 4, "temperature": 0, "stream": True}
        with self.server.http.stream("POST", "/v1/completions", json=body) as r:
            self.assertEqual(r.status_code, 200)
            self.assertTrue(r.headers["content-type"].startswith("text/event-stream"))
            events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(len([e for e in events[:-1] if json.loads(e)["choices"][0]["text"]]), 4)

    def test_prompt_as_token_ids_and_batches(self):
        ids = [0, 422, 318, 257]  # BOS and three tokens of the tiny vocabulary
        single = self.client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
        batch = self.client.completions.create(model=MODEL, prompt=[ids, PROMPTS[1]], max_tokens=5, temperature=0)
        self.assertEqual(single.usage.prompt_tokens, 4)
        self.assertEqual([c.index for c in batch.choices], [0, 1])
        self.assertEqual(batch.choices[0].text, single.choices[0].text)

    def test_stop_strings(self):
        full = self.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0)
        text = full.choices[0].text
        stop = text[len(text) // 2:len(text) // 2 + 3]
        cut = self.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0,
                                             stop=[stop])
        self.assertEqual(cut.choices[0].finish_reason, "stop")
        self.assertEqual(cut.choices[0].text, text[:text.index(stop)])
        streamed = self.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0,
                                                  stop=stop, stream=True)
        self.assertEqual("".join(c.choices[0].text for c in streamed), cut.choices[0].text)

    def test_sampling_parameters(self):
        kw = dict(model=MODEL, prompt=PROMPTS[2], max_tokens=10, temperature=1.0, top_p=0.9, seed=1234,
                  frequency_penalty=0.5, presence_penalty=0.3,
                  extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1})
        a = self.client.completions.create(**kw)
        b = self.client.completions.create(**kw)
        self.assertEqual(a.choices[0].text, b.choices[0].text)  # seeded: reproducible
        n = self.client.completions.create(**{**kw, "n": 3})
        self.assertEqual([c.index for c in n.choices], [0, 1, 2])
        self.assertEqual(n.choices[0].text, a.choices[0].text)  # choice i draws with seed + i
        self.assertEqual(n.usage.completion_tokens, 30)
        ignore = self.client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=40, temperature=0,
                                                extra_body={"ignore_eos": True})
        self.assertEqual(ignore.usage.completion_tokens, 40)

    def test_logit_bias(self):
        # +100 on a token makes it every greedy choice, −100 keeps one out; several entries apply together.
        http = self.server.http
        a, b = http.post("/tokenize", json={"model": MODEL, "prompt": " the cat",
                                            "add_special_tokens": False}).json()["tokens"][:2]
        text = lambda ids: http.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
        forced = self.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0,
                                                logit_bias={str(a): 100})
        self.assertEqual(forced.choices[0].text, text([a] * 4))
        swapped = self.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0.7,
                                                 seed=3, logit_bias={str(a): -100, str(b): 100})
        self.assertEqual(swapped.choices[0].text, text([b] * 4))
        chat_forced = self.client.chat.completions.create(model=MODEL, messages=chat("Hi"), max_tokens=3,
                                                          temperature=0, logit_bias={str(b): 100})
        self.assertEqual(chat_forced.choices[0].message.content, text([b] * 3))
        for bias in ({"x": 1}, {"-3": 1}, {str(a): 101}, {str(a): "1"}, {str(10 ** 8): 1}, [1]):
            with self.subTest(bias=bias):
                r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1,
                                                       "logit_bias": bias})
                self.assertEqual(r.status_code, 400, r.text)
                self.assertEqual(set(r.json()["error"]), {"message", "type", "param", "code"})

    def test_thinking_mode(self):
        plain = self.client.chat.completions.create(model=MODEL, messages=chat("Why?"), max_tokens=8, temperature=0)
        self.assertIsNone((plain.choices[0].message.model_extra or {}).get("reasoning_content"))
        for extra in ({"chat_template_kwargs": {"thinking": True}}, {"reasoning_effort": "max"}):
            with self.subTest(extra=extra):
                r = self.client.chat.completions.create(model=MODEL, messages=chat("Why?"), max_tokens=8,
                                                        temperature=0, extra_body=extra)
                message = r.choices[0].message
                # The tiny model never closes </think>: everything it writes is reasoning.
                self.assertTrue(message.model_extra["reasoning_content"])
                self.assertFalse(message.content)
                stream = self.client.chat.completions.create(model=MODEL, messages=chat("Why?"), max_tokens=8,
                                                             temperature=0, extra_body=extra, stream=True)
                reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                                    for c in stream if c.choices)
                self.assertEqual(reasoning, message.model_extra["reasoning_content"])
        # "max" adds DeepSeek's maximum-effort paragraph to the prompt.
        high = self.client.chat.completions.create(model=MODEL, messages=chat("Why?"), max_tokens=1,
                                                   reasoning_effort="high")
        most = self.client.chat.completions.create(model=MODEL, messages=chat("Why?"), max_tokens=1,
                                                   reasoning_effort="max")
        self.assertGreater(most.usage.prompt_tokens, high.usage.prompt_tokens + 20)

    def test_tool_call_round_trip(self):
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a town",
            "parameters": {"type": "object", "properties": {"town": {"type": "string"}}, "required": ["town"]}}}]
        ask = chat("What is the weather in Bath?")
        first = self.client.chat.completions.create(model=MODEL, messages=ask, tools=tools, max_tokens=6,
                                                    temperature=0)
        none = self.client.chat.completions.create(model=MODEL, messages=ask, tools=tools, tool_choice="none",
                                                   max_tokens=6, temperature=0)
        # The tool schemas are part of the prompt unless tool_choice is "none".
        self.assertGreater(first.usage.prompt_tokens, none.usage.prompt_tokens + 50)
        # The assistant's call and the tool's result go back in, as a client does after running the tool.
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"town": "Bath"})}}
        history = ask + [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "Rain, 12 degrees"}]
        second = self.client.chat.completions.create(model=MODEL, messages=history, tools=tools, max_tokens=6,
                                                     temperature=0)
        self.assertEqual(second.choices[0].finish_reason, "length")
        self.assertGreater(second.usage.prompt_tokens, first.usage.prompt_tokens)
        streamed = self.client.chat.completions.create(model=MODEL, messages=history, tools=tools, max_tokens=6,
                                                       temperature=0, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in streamed if c.choices),
                         second.choices[0].message.content)
        # The model's own DSML tool calls become tool_calls: tests/server/test_server.cpp below the HTTP layer (the
        # tiny model never writes DSML) and test_tool_model.py on models/small, which does.


class TestConcurrency(ServerCase):
    """32 clients at once give the same greedy outputs as the same requests one at a time."""
    server_args = ("--max-seqs", "16")  # 32 clients: half run, half queue

    def requests(self):
        long_prompt = " ".join(PROMPTS) * 2  # ~150 tokens: three prefill chunks of the 64-token step
        out = []
        for i in range(32):
            prompt = long_prompt if i % 8 == 3 else PROMPTS[i % len(PROMPTS)] + " " * (i // 8)
            kind = ("chat", "completion")[i % 2]
            out.append((kind, prompt, 6 + i % 4, i % 3 == 0))
        return out

    def run_one(self, kind, prompt, max_tokens, stream):
        if kind == "chat":
            kw = dict(model=MODEL, messages=chat(prompt), max_tokens=max_tokens, temperature=0)
            if not stream:
                return self.client.chat.completions.create(**kw).choices[0].message.content
            return "".join(c.choices[0].delta.content or ""
                           for c in self.client.chat.completions.create(**kw, stream=True) if c.choices)
        kw = dict(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0)
        if not stream:
            return self.client.completions.create(**kw).choices[0].text
        return "".join(c.choices[0].text for c in self.client.completions.create(**kw, stream=True))

    def test_concurrent_equals_sequential(self):
        reqs = self.requests()
        sequential = [self.run_one(*r) for r in reqs]
        steps_before = self.server.metric("dsv4:engine_steps_total")
        with ThreadPoolExecutor(max_workers=32) as pool:
            concurrent = list(pool.map(lambda r: self.run_one(*r), reqs))
        for i, (a, b) in enumerate(zip(sequential, concurrent)):
            self.assertEqual(a, b, f"request {i} {reqs[i]}")
        # They really were batched: far fewer steps than the tokens generated.
        steps = self.server.metric("dsv4:engine_steps_total") - steps_before
        tokens = sum(r[2] for r in reqs)
        self.assertLess(steps, tokens / 2)
        self.assertEqual(self.server.metric("dsv4:num_requests_running"), 0)


class TestRobustness(ServerCase):
    """Bad requests get OpenAI errors with the right status, a vanished client frees its slot, the server
    stays up."""
    server_args = ("--max-context", "512")

    def post(self, path, body):
        content = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return self.server.http.post(path, content=content, headers={"content-type": "application/json"})

    def assert_error(self, response, status, param=None):
        self.assertEqual(response.status_code, status, response.text)
        error = response.json()["error"]
        self.assertEqual(set(error), {"message", "type", "param", "code"})
        self.assertTrue(error["message"])
        if param is not None:
            self.assertEqual(error["param"], param)
        return error

    def test_bad_requests(self):
        ok = {"model": MODEL, "messages": chat("Hello"), "max_tokens": 4}
        cases = [
            ("/v1/chat/completions", "{not json", 400, None),
            ("/v1/chat/completions", "[1, 2]", 400, None),
            ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
            ("/v1/chat/completions", {"messages": chat("Hi")}, 400, "model"),
            ("/v1/chat/completions", {**ok, "model": 7}, 400, "model"),
            ("/v1/chat/completions", {**ok, "messages": "Hello"}, 400, "messages"),
            ("/v1/chat/completions", {**ok, "messages": []}, 400, "messages"),
            ("/v1/chat/completions", {**ok, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0]"),
            ("/v1/chat/completions", {**ok, "messages": [{"content": "x"}]}, 400, "messages[0]"),
            ("/v1/chat/completions", {**ok, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0]"),
            ("/v1/chat/completions", {**ok, "temperature": "hot"}, 400, "temperature"),
            ("/v1/chat/completions", {**ok, "temperature": -1}, 400, "temperature"),
            ("/v1/chat/completions", {**ok, "top_p": 0}, 400, "top_p"),
            ("/v1/chat/completions", {**ok, "top_k": 2.5}, 400, "top_k"),
            ("/v1/chat/completions", {**ok, "stream": "yes"}, 400, "stream"),
            ("/v1/chat/completions", {**ok, "stream_options": {"include_usage": True}}, 400, "stream_options"),
            ("/v1/chat/completions", {**ok, "stop": 5}, 400, "stop"),
            ("/v1/chat/completions", {**ok, "n": 0}, 400, "n"),
            ("/v1/chat/completions", {**ok, "seed": "x"}, 400, "seed"),
            ("/v1/chat/completions", {**ok, "max_tokens": -5}, 400, "max_tokens"),
            ("/v1/chat/completions", {**ok, "max_tokens": 0}, 400, "max_tokens"),
            ("/v1/chat/completions", {**ok, "max_tokens": 2.5}, 400, "max_tokens"),
            ("/v1/chat/completions", {**ok, "max_tokens": 10 ** 30}, 400, "max_tokens"),
            ("/v1/chat/completions", {**ok, "max_tokens": 100000}, 400, "messages"),  # beyond the context
            ("/v1/chat/completions", {**ok, "messages": chat("word " * 2000)}, 400, "messages"),
            ("/v1/chat/completions", {**ok, "tools": [{"type": "function"}]}, 400, "tools[0]"),
            ("/v1/chat/completions", {**ok, "tool_choice": "required"}, 400, "tool_choice"),
            ("/v1/chat/completions", {**ok, "reasoning_effort": "extreme"}, 400, "reasoning_effort"),
            ("/v1/chat/completions", {**ok, "top_logprobs": 2}, 400, "top_logprobs"),  # without logprobs: true
            ("/v1/chat/completions", {**ok, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
            ("/v1/chat/completions", {**ok, "logprobs": 3}, 400, "logprobs"),
            ("/v1/chat/completions", {**ok, "messages": [{"role": "system", "content": "x"}]}, 400, "messages"),
            ("/v1/completions", {"model": MODEL, "max_tokens": 4}, 400, "prompt"),
            ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
            ("/v1/completions", {"model": MODEL, "prompt": [1, -2]}, 400, "prompt"),
            ("/v1/completions", {"model": MODEL, "prompt": [99999999]}, 400, None),  # outside the vocabulary
            ("/v1/completions", {"model": MODEL, "prompt": "word " * 2000}, 400, "prompt"),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "echo": "yes"}, 400, "echo"),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 21}, 400, "logprobs"),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 1, "echo": True}, 400, "logprobs"),
            ("/v1/chat/completions", {**ok, "model": "gpt-4"}, 404, "model"),
            ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
        ]
        for path, body, status, param in cases:
            with self.subTest(path=path, body=str(body)[:80]):
                self.assert_error(self.post(path, body), status, param)
        ctx = self.assert_error(self.post("/v1/completions", {"model": MODEL, "prompt": "word " * 2000}), 400)
        self.assertEqual(ctx["code"], "context_length_exceeded")
        self.assert_error(self.server.http.get("/v1/nothing"), 404)
        self.assert_error(self.server.http.get("/v1/chat/completions"), 405)
        # The official client raises the matching exceptions.
        with self.assertRaises(openai.NotFoundError):
            self.client.chat.completions.create(model="gpt-4", messages=chat("Hi"), max_tokens=2)
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model=MODEL, prompt="Hi", max_tokens=-1)
        # Still serving.
        self.assertEqual(self.server.http.get("/health").status_code, 200)
        r = self.client.chat.completions.create(model=MODEL, messages=chat("Hi"), max_tokens=3)
        self.assertEqual(r.usage.completion_tokens, 3)

    def raw(self, request, timeout=10):
        """Sends request bytes on a fresh connection; returns the status code (None: no status line came back
        within the timeout: the server still waits for a body the headers announced)."""
        host, port = self.server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(request)
            reply = b""
            try:
                while b"\r\n\r\n" not in reply and len(reply) < 65536:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
            except (TimeoutError, ConnectionResetError):
                pass
        match = re.match(rb"HTTP/1\.[01] (\d{3}) ", reply)
        return int(match.group(1)) if match else None

    def test_hostile_bytes(self):
        # Bytes that are not UTF-8 in the path: the error names the path, so its JSON must still serialise (this
        # request line used to end the process: nlohmann's dump() threw inside the HTTP error handler).
        self.assertEqual(self.raw(b"GET /\xf3L\xb3?\xcd\x15 HTTP/1.1\r\nHost: x\r\n\r\n"), 404)
        r = self.server.http.get("/v1/nothing\udcff".encode("utf-8", "surrogateescape").decode("latin-1"))
        self.assertEqual(r.status_code, 404)
        self.assertIn("error", r.json())
        # Not UTF-8 inside a JSON body: a 400 whose message quotes the byte, not a 500.
        self.assert_error(self.post("/v1/completions", b'{"model": "tiny", "prompt": "\xff\xfe"}'), 400)
        # The random fuzz of request lines, headers and bodies is test_fuzz.py.
        self.assertEqual(self.server.http.get("/health").status_code, 200)

    def test_methods_content_types_and_status_counts(self):
        # A known path's other methods: 405 naming the allowed one, in the error shape.
        for method, path, allowed in (("GET", "/v1/chat/completions", "POST"), ("DELETE", "/v1/completions", "POST"),
                                      ("POST", "/health", "GET"), ("PUT", "/v1/models", "GET")):
            with self.subTest(method=method, path=path):
                r = self.server.http.request(method, path)
                self.assertEqual(self.assert_error(r, 405)["code"], "method_not_allowed")
                self.assertEqual(r.headers["allow"], allowed)
        # JSON whatever the content type says: curl -d sends a form type, and past 8 KB httplib refused it (413).
        body = json.dumps({"model": MODEL, "prompt": "word " * 100, "max_tokens": 2}) + " " * 10000
        self.assertGreater(len(body), 8192)
        for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
            with self.subTest(content_type=content_type):
                headers = {"content-type": content_type} if content_type else {}
                r = self.server.http.post("/v1/completions", content=body, headers=headers)
                self.assertEqual(r.status_code, 200, r.text)
                self.assertEqual(r.json()["usage"]["completion_tokens"], 2)
        r = self.server.http.post("/v1/completions", files={"prompt": ("p.txt", b"Hi")})
        self.assert_error(r, 415)
        # Every response counted by status.
        text = self.server.http.get("/metrics").text
        counts = {int(m.group(1)): float(m.group(2))
                  for m in re.finditer(r'^dsv4:http_requests_total\{model_name="tiny",status="(\d+)"\} (\S+)$', text,
                                       re.M)}
        self.assertGreaterEqual(counts.get(405, 0), 4, [l for l in text.splitlines() if "http_req" in l])
        self.assertGreaterEqual(counts.get(415, 0), 1)
        self.assertGreaterEqual(counts.get(200, 0), 3)

    def test_structured_fuzz(self):
        # Valid requests with fields replaced by random JSON of every type and odd values (seeded: reproducible).
        # Whatever comes back is a 2xx or a 4xx in the error shape: never a 5xx, never a dead server.
        rng = random.Random(26)
        odd = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63, -2 ** 63, 1e308, -1e-308, 0.5, float("nan"), "", "x",
               "\u0000", "\ud7ff\ue000", "💥" * 3, "<｜end▁of▁sentence｜>", [], [1], ["a"], [[1]], {}, {"a": 1},
               [None], {"role": "user"}, {"role": "user", "content": None}, [{"type": "text", "text": "hi"}]]
        fields = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop",
                  "stream", "seed", "tools", "tool_choice", "presence_penalty", "frequency_penalty", "logit_bias",
                  "stream_options", "reasoning_effort", "chat_template_kwargs", "ignore_eos", "user", "logprobs",
                  "response_format", "echo", "suffix", "best_of", "max_completion_tokens", "repetition_penalty"]
        bases = [("/v1/chat/completions", {"model": MODEL, "messages": chat("Hi"), "max_tokens": 2}),
                 ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})]

        def value(depth=0):
            if depth < 2 and rng.random() < 0.2:
                return [value(depth + 1) for _ in range(rng.randint(0, 3))]
            if depth < 2 and rng.random() < 0.1:
                return {rng.choice(fields + ["role", "content", "type"]): value(depth + 1) for _ in range(2)}
            return rng.choice(odd)

        statuses = {}
        for i in range(600):
            path, base = rng.choice(bases)
            body = dict(base)
            for _ in range(rng.randint(1, 3)):
                body[rng.choice(fields)] = value()
            if body.get("stream") is True:
                body["stream"] = False  # a stream's status is 200 before the engine runs; judged elsewhere
            if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
                body["max_tokens"] = 8  # keep the run short; larger values are the bad-request cases' job
            if isinstance(body.get("n"), int) and body["n"] > 2:
                body["n"] = 2
            text = json.dumps(body)
            r = self.post(path, text)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            self.assertLess(r.status_code, 500, f"case {i}: {text[:300]} -> {r.text[:300]}")
            if r.status_code >= 400:
                self.assertEqual(set(r.json()["error"]), {"message", "type", "param", "code"}, text[:300])
        self.assertGreater(statuses.get(400, 0), 100)  # the fuzz reaches the validation
        self.assertEqual(self.server.http.get("/health").status_code, 200)

    def rss_mb(self):
        with open(f"/proc/{self.server.proc.pid}/status") as f:
            return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024

    def test_large_bodies_release_their_memory(self):
        # 40 MB bodies (a prompt far beyond the context: refused before it is tokenized) from 4 connections at a
        # time. Before the fix 8 of them left the server at 3.3 GB resident (each HTTP thread kept its tokenizer
        # scratch and its arena). A first round may leave the arenas of the threads it used (measured ~120 MB
        # on the tiny model); further rounds must not add to it, and nothing comes near a body per thread.
        body = json.dumps({"model": MODEL, "prompt": "word " * (8 << 20), "max_tokens": 2})

        def round_of_8():
            with ThreadPoolExecutor(4) as pool:
                statuses = list(pool.map(lambda _: self.post("/v1/completions", body).status_code, range(8)))
            self.assertEqual(statuses, [400] * 8)

        round_of_8()
        before = self.rss_mb()
        for _ in range(3):
            round_of_8()
        after = self.rss_mb()
        self.assertLess(after - before, 100, f"resident memory {before:.0f} -> {after:.0f} MB over 24 bodies")
        self.assertLess(after, 1024, f"resident memory {after:.0f} MB")
        self.assertEqual(self.server.http.get("/health").status_code, 200)

    def wait_idle(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.server.metric("dsv4:num_requests_running") == 0 and \
                    self.server.metric("dsv4:num_requests_waiting") == 0:
                return True
            time.sleep(0.1)
        return False

    def test_client_disconnects_mid_stream(self):
        aborted = ("dsv4:request_success_total", 'finished_reason="abort"')
        before = self.server.metric(*aborted) or 0
        steps_before = self.server.metric("dsv4:engine_steps_total")
        for path, fields in (("/v1/chat/completions", {"messages": chat("Tell me a long story")}),
                             ("/v1/completions", {"prompt": PROMPTS[3]})):
            body = {"model": MODEL, "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True, **fields}
            with httpx.Client(base_url=self.server.url, timeout=60) as http:
                with http.stream("POST", path, json=body) as r:
                    events = 0
                    for line in r.iter_lines():
                        events += line.startswith("data: ")
                        if events == 3:
                            break
            # Closed after 3 of 400 tokens: the request must leave the batch well before it could finish.
            self.assertTrue(self.wait_idle(), "the cancelled request still holds its slot")
        self.assertGreaterEqual(self.server.metric(*aborted), before + 2)
        # Uncancelled, the two requests would have taken 800 steps.
        self.assertLess(self.server.metric("dsv4:engine_steps_total") - steps_before, 200)
        r = self.client.completions.create(model=MODEL, prompt="She was", max_tokens=3)
        self.assertEqual(r.usage.completion_tokens, 3)


    def test_client_disconnects_while_waiting_for_the_whole_answer(self):
        # Not streamed: nothing is written until the answer is complete, so the handler watches the socket while
        # the engine works. A client that closes it cancels the request at once.
        aborted = ("dsv4:request_success_total", 'finished_reason="abort"')
        gone = ("dsv4:http_requests_total", 'status="499"')
        before, gone_before = self.server.metric(*aborted) or 0, self.server.metric(*gone) or 0
        steps_before = self.server.metric("dsv4:engine_steps_total")
        host, port = self.server.url.removeprefix("http://").split(":")
        for path, fields in (("/v1/chat/completions", {"messages": chat("Tell me a long story")}),
                             ("/v1/completions", {"prompt": PROMPTS[3]}),
                             ("/v1/messages", {"messages": chat("Tell me a long story")})):
            with self.subTest(path=path):
                body = json.dumps({"model": MODEL, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                                   **fields}).encode()
                with socket.create_connection((host, int(port)), timeout=30) as sock:
                    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
                    deadline = time.time() + 30
                    while self.server.metric("dsv4:num_requests_running") != 1 and time.time() < deadline:
                        time.sleep(0.02)
                    self.assertEqual(self.server.metric("dsv4:num_requests_running"), 1)
                # Closed while it generates: it must leave the batch well before it could finish.
                self.assertTrue(self.wait_idle(), "the abandoned request still holds its slot")
        self.assertGreaterEqual(self.server.metric(*aborted) or 0, before + 3)
        self.assertGreaterEqual(self.server.metric(*gone) or 0, gone_before + 3)
        # Uncancelled, the three requests would have taken 1200 steps.
        self.assertLess(self.server.metric("dsv4:engine_steps_total") - steps_before, 300)
        # A client that stays gets its answer: the check does not take bytes it sends ahead (a pipelined request
        # on the same connection) for a close.
        with socket.create_connection((host, int(port)), timeout=60) as sock, sock.makefile("rb") as reader:
            body = json.dumps({"model": MODEL, "prompt": "She was", "max_tokens": 40, "ignore_eos": True}).encode()
            request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(body), body))
            sock.sendall(request + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, answer = read_response(reader)
            self.assertEqual(status, 200, answer)
            self.assertEqual(json.loads(answer)["usage"]["completion_tokens"], 40)
            self.assertEqual(read_response(reader)[::2], (200, b"{}"))
        self.assertEqual(self.server.metric(*aborted), before + 3)


class TestAccess(unittest.TestCase):
    """--api-key (or DSV4_API_KEY) guards the /v1/ routes with a bearer token; --allowed-origins answers browsers'
    CORS preflights and names the origin on every response."""

    def test_api_key(self):
        for args, env in ((("--api-key", "s3cret"), {}), ((), {"DSV4_API_KEY": "s3cret"})):
            with self.subTest(args=args, env=env):
                server = Server(*args, env=env, api_key="s3cret")
                try:
                    r = server.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
                    self.assertEqual(r.usage.completion_tokens, 2)
                    for headers in ({}, {"authorization": "Bearer wrong!"}, {"authorization": "s3cret"},
                                    {"authorization": "Bearer s3cret2"}):
                        r = server.http.get("/v1/models", headers=headers)
                        self.assertEqual(r.status_code, 401, headers)
                        self.assertEqual(r.json()["error"]["code"], "invalid_api_key")
                    with self.assertRaises(openai.AuthenticationError):
                        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
                    self.assertEqual(server.http.get("/health").status_code, 200)  # probes and scrapers stay open
                    self.assertEqual(server.http.get("/metrics").status_code, 200)
                finally:
                    self.assertEqual(server.stop(), 0)

    def test_cors(self):
        server = Server("--allowed-origins", "http://app.example,http://other.example")
        try:
            preflight = {"origin": "http://app.example", "access-control-request-method": "POST",
                         "access-control-request-headers": "authorization, content-type"}
            r = server.http.options("/v1/chat/completions", headers=preflight)
            self.assertEqual(r.status_code, 204)
            self.assertEqual(r.headers["access-control-allow-origin"], "http://app.example")
            self.assertIn("POST", r.headers["access-control-allow-methods"])
            self.assertEqual(r.headers["access-control-allow-headers"], "authorization, content-type")
            body = {"model": MODEL, "messages": chat("Hi"), "max_tokens": 2}
            r = server.http.post("/v1/chat/completions", json=body, headers={"origin": "http://other.example"})
            self.assertEqual(r.status_code, 200)
            self.assertEqual(r.headers["access-control-allow-origin"], "http://other.example")
            r = server.http.get("/v1/nothing", headers={"origin": "http://app.example"})  # errors too
            self.assertEqual(r.status_code, 404)
            self.assertEqual(r.headers["access-control-allow-origin"], "http://app.example")
            # Another origin gets no CORS headers, and no preflight.
            r = server.http.options("/v1/chat/completions", headers={**preflight, "origin": "http://evil.example"})
            self.assertEqual(r.status_code, 405)
            self.assertNotIn("access-control-allow-origin", r.headers)
            r = server.http.get("/v1/models", headers={"origin": "http://evil.example"})
            self.assertNotIn("access-control-allow-origin", r.headers)
        finally:
            self.assertEqual(server.stop(), 0)


class TestSlowClients(ServerCase):
    """Slow clients hold connection threads; the pool grows past --http-threads, so /health and /metrics still
    answer while they hold them, and --header-timeout cuts a request whose headers do not come. --body-timeout
    cuts a body that trickles (but not one that arrives at the minimum rate), and --idle-timeout closes a
    connection that waits between requests."""
    header_timeout, body_timeout, idle_timeout = 3, 3, 2
    server_args = ("--http-threads", "4", "--header-timeout", str(header_timeout),
                   "--body-timeout", str(body_timeout), "--idle-timeout", str(idle_timeout))

    def connect(self, timeout=30):
        host, port = self.server.url.removeprefix("http://").split(":")
        return socket.create_connection((host, int(port)), timeout=timeout)

    @staticmethod
    def closed_after(sock, limit):
        """Reads until the server closes the connection; returns (seconds it took, bytes read), or (None, bytes)
        when it was still open after `limit` seconds."""
        start, reply = time.monotonic(), b""
        sock.settimeout(0.1)
        while time.monotonic() - start < limit:
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return time.monotonic() - start, reply
            if not chunk:
                return time.monotonic() - start, reply
            reply += chunk
        return None, reply

    def test_health_answers_while_slow_clients_hold_the_threads(self):
        # 80 clients each send a request line, then a header a byte every half second for a minute: twenty times
        # the threads kept. Throughout, /health and /metrics answer within a second (with a fixed pool of 4 the
        # first /health took 66 s), and the header timeout cuts every slow client with a 408.
        stop = threading.Event()
        holding, cut = [], []

        def slow_client():
            with self.connect(timeout=90) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\n")
                start = time.monotonic()
                holding.append(1)
                sock.settimeout(0.5)
                reply = b""
                for b in b"X-Slow: " + b"z" * 120:
                    try:
                        sock.sendall(bytes([b]))
                        chunk = sock.recv(4096)  # waits the half second, unless the server answers or closes
                    except TimeoutError:
                        if stop.is_set():
                            return
                        continue
                    except (BrokenPipeError, ConnectionResetError):
                        chunk = b""
                    reply += chunk
                    if not chunk:
                        break
                cut.append((time.monotonic() - start, reply[:12]))

        clients = [threading.Thread(target=slow_client, daemon=True) for _ in range(80)]
        for c in clients:
            c.start()
        try:
            latencies = []
            with httpx.Client(base_url=self.server.url, timeout=30) as probe:
                deadline = time.monotonic() + 60
                while len(cut) < len(clients) and time.monotonic() < deadline:
                    for path in ("/health", "/metrics"):
                        start = time.monotonic()
                        self.assertEqual(probe.get(path).status_code, 200)
                        latencies.append((time.monotonic() - start, len(holding), len(cut)))
                    time.sleep(0.05)
            self.assertEqual(len(cut), len(clients), "slow clients still connected after a minute")
            worst = max(latencies)
            print(f"\nslow clients: {len(latencies)} probes, the slowest {worst[0] * 1000:.0f} ms; cut after "
                  f"{min(c[0] for c in cut):.1f}-{max(c[0] for c in cut):.1f} s", flush=True)
            self.assertLess(worst[0], 1.0, f"a probe took {worst[0]:.2f} s with {worst[1]} slow clients connected, "
                                           f"{worst[2]} cut")
            self.assertGreater(len(latencies), 20)
            # Cut at the header timeout (the margin: a loaded 2-core machine), with a 408; without the timeout they
            # would hold their threads for a minute.
            for seconds, reply in cut:
                self.assertGreaterEqual(seconds, self.header_timeout - 0.5)
                self.assertLess(seconds, self.header_timeout + 5)
                self.assertEqual(reply, b"HTTP/1.1 408", reply)
            self.assertGreaterEqual(self.server.metric("dsv4:http_requests_total", 'status="408"'), len(clients))
            r = self.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
            self.assertEqual(r.usage.completion_tokens, 2)
        finally:
            stop.set()
            for c in clients:
                c.join()

    def test_connection_sending_nothing_is_closed_at_the_header_timeout(self):
        with self.connect() as sock:
            seconds, reply = self.closed_after(sock, 30)
        self.assertIsNotNone(seconds, "a connection that sent nothing is still open after 30 s")
        self.assertGreaterEqual(seconds, self.header_timeout - 0.5)
        self.assertLess(seconds, self.header_timeout + 5)
        self.assertEqual(reply, b"")  # no request began: closed without a response

    def test_a_trickled_body_is_cut_and_a_slow_one_is_not(self):
        body = json.dumps({"model": MODEL, "prompt": "Mr. Darcy " * 400}).encode()  # 4 KB
        head = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body))
        # A byte a second (each read waits 5 s, so without the body timeout this holds the thread for over an
        # hour): cut at the body timeout, plus 1/500 s for each byte that came.
        with self.connect() as sock:
            sock.sendall(head)
            start = time.monotonic()
            sock.settimeout(0.1)
            closed = None
            for b in body:
                try:
                    sock.sendall(bytes([b]))
                    if sock.recv(4096) == b"":
                        closed = time.monotonic() - start
                        break
                except TimeoutError:
                    time.sleep(0.9)
                except (BrokenPipeError, ConnectionResetError):
                    closed = time.monotonic() - start
                    break
                if time.monotonic() - start > 30:
                    break
        self.assertIsNotNone(closed, "a body trickled at a byte a second was not cut within 30 s")
        self.assertGreaterEqual(closed, self.body_timeout - 0.5)
        self.assertLess(closed, self.body_timeout + 5)
        # 4 KB at 1 KB/s takes 4 s, past the body timeout, but above the 500 bytes/s minimum: answered.
        with self.connect() as sock, sock.makefile("rb") as reader:
            sock.sendall(head)
            for i in range(0, len(body), 250):
                sock.sendall(body[i:i + 250])
                time.sleep(0.25)
            status, _, answer = read_response(reader)
        self.assertEqual(status, 200, answer[:200])
        self.assertGreater(len(json.loads(answer)["tokens"]), 100)

    def test_idle_connection_is_closed_at_the_idle_timeout(self):
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        with self.connect() as sock, sock.makefile("rb") as reader:
            # Requests closer together than the idle timeout keep one connection.
            for i in range(4):
                if i:
                    time.sleep(self.idle_timeout / 2)
                sock.sendall(request)
                status, head, body = read_response(reader)
                self.assertEqual((status, body), (200, b"{}"))
                self.assertIn(f"keep-alive: timeout={self.idle_timeout}, max=5", head.lower())
            seconds, rest = self.closed_after(sock, 30)
        self.assertIsNotNone(seconds, "an idle connection is still open after 30 s")
        self.assertGreaterEqual(seconds, self.idle_timeout - 0.5)
        self.assertLess(seconds, self.idle_timeout + 5)
        self.assertEqual(rest, b"")

    def test_headers_are_bounded(self):
        # Lines are read to their end before httplib checks their length, and header lines are not counted: the
        # connection bounds a request's line and headers to 64 KiB.
        with self.connect() as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000)
                                                                 for i in range(100)) + b"\r\n")
            seconds, reply = self.closed_after(sock, 30)
        self.assertIsNotNone(seconds)
        self.assertTrue(reply.startswith(b"HTTP/1.1 431 "), reply[:100])
        # A request line that never ends: closed after 64 KiB, not read for ever.
        with self.connect() as sock:
            sock.sendall(b"GET /")
            sent = 0
            with self.assertRaises((BrokenPipeError, ConnectionResetError)):
                while sent < 64 << 20:
                    sent += sock.send(b"a" * 65536)
        self.assertLess(sent, 16 << 20)  # what the socket buffers hold before the close is seen
        self.assertEqual(self.server.http.get("/health").status_code, 200)


class TestOverload(ServerCase):
    """One slot and no queue: a second request while the first streams is refused with 429 (Retry-After), and
    the server serves again once the first is gone. A body over --max-body-mb is refused with 413."""
    server_args = ("--max-seqs", "1", "--max-waiting", "0", "--max-context", "2048", "--max-body-mb", "1")

    def test_body_over_the_limit_is_413(self):
        body = json.dumps({"model": MODEL, "prompt": "word " * 300000, "max_tokens": 2})
        r = self.server.http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        self.assertEqual(r.status_code, 413, r.text)
        self.assertIn("--max-body-mb", r.json()["error"]["message"])
        r = self.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        self.assertEqual(r.usage.completion_tokens, 2)

    def test_overload_is_429(self):
        # The first request must still hold the slot when the second arrives: it asks for nearly the whole
        # 2048-token context, and leaving the stream early cancels the rest. `lines` stays referenced: a dropped
        # httpx line iterator is finalized, which closes the connection, and the server then (rightly) cancels.
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.Client(base_url=self.server.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                next(line for line in lines if line.startswith("data: "))
                self.assertEqual(self.server.metric("dsv4:num_requests_running"), 1)
                with self.assertRaises(openai.RateLimitError) as refused:
                    self.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
                self.assertEqual(refused.exception.status_code, 429)
                self.assertEqual(refused.exception.response.headers["retry-after"], "1")
        deadline = time.time() + 30
        while self.server.metric("dsv4:num_requests_running") != 0 and time.time() < deadline:
            time.sleep(0.1)
        r = self.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        self.assertEqual(r.usage.completion_tokens, 2)


if __name__ == "__main__":
    unittest.main()
