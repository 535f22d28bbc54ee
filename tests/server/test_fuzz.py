"""A bounded random and structured fuzz of `dsv4 serve`'s HTTP listener over loopback, on the shipped tiny model on
the CPU: request lines, headers, bodies (plain, chunked, multipart), byte mutations of valid requests, and valid
JSON requests of every POST route with fields replaced by odd values. Whatever the bytes, the server answers with a
status below 500 (or closes the connection), never hangs, never exits, and its resident memory after the fuzz is
within 100 MB of before (issue #26's target: 100,000 requests).

DSV4_FUZZ_REQUESTS sets the number of requests (default 100,000: 42 s on an idle 2-core machine). Seeded: worker
w's case i is the same in every run, and a failure names both.
    DSV4_CLI=build/bin/dsv4 DSV4_FUZZ_REQUESTS=100000 build/venv/bin/python -m unittest -v test_fuzz
"""

import json
import os
import random
import re
import socket
import threading
import time
import unittest

from test_openai import MODEL, Server

REQUESTS = int(os.environ.get("DSV4_FUZZ_REQUESTS", "100000"))
WORKERS = 8  # connections at a time: the HTTP threads and the engine's batch see concurrent requests
SEED = 26

PATHS = [b"/v1/chat/completions", b"/v1/completions", b"/v1/messages", b"/tokenize", b"/detokenize", b"/v1/models",
         b"/health", b"/metrics", b"/dashboard", b"/dashboard/data", b"/dashboard/data?since=", b"/", b"/v1/",
         b"/v1/chat/completions/", b"//v1/models", b"/v1/models?x=%ff&y", b"/%2e%2e/etc/passwd"]
METHODS = [b"GET", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS", b"HEAD", b"CONNECT", b"TRACE", b"G\x00T", b"",
           b"post", b"POST POST", b"\xff\xfe"]
VERSIONS = [b" HTTP/1.1", b" HTTP/1.0", b"", b" HTTP/9", b" HTTP/1.1 x", b" http/1.1", b" HTTP/1.", b" HTTP/01.1"]
SPECIAL = [b"%", b"%0", b"%ff", b"%u", b"%00", b"?", b"&", b"=", b"#", b" ", b"\t", b"\r", b"\n", b"/", b"..", b"+",
           b";", b"\x00", b"\xc3", b"\xf0\x9f"]
HEADERS = [b"Host: a", b"Content-Length: 0", b"Content-Length: -5", b"Content-Length: 99999999999999999999",
           b"Content-Length: 18446744073709551615", b"Content-Length: 1e3", b"Content-Length: 10, 10",
           b"Content-Length: 4096", b"Content-Length: 5", b"Range: bytes=0-", b"Range: bytes=5-1,0-0",
           b"Range: bytes=-0", b"Range: lines=1", b"Accept-Encoding: gzip", b"Accept-Encoding: br",
           b"Accept-Encoding: gzip, br, *", b"Content-Encoding: gzip", b"Content-Encoding: br",
           b"Content-Type: multipart/form-data; boundary=", b"Content-Type: multipart/form-data; boundary=xx",
           b"Content-Type: application/x-www-form-urlencoded", b"Content-Type: application/json; charset=utf-16",
           b"Expect: 100-continue", b"Expect: 200-ok", b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip",
           b"Transfer-Encoding: chunked, chunked", b"Connection: close", b"Connection: keep-alive",
           b"Authorization: Bearer", b"Authorization: Bearer \xff", b"x-api-key: ", b"Origin: null",
           b"Origin: http://a.example", b"Access-Control-Request-Method: POST",
           b"Access-Control-Request-Headers: \xff\x00", b"Anthropic-Version: 2023-06-01", b": empty-name",
           b"No-Colon", b" Leading-Space: x", b"X: \x00\x01\x7f", b"X-Long: " + b"y" * 9000]
ODD = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63, -2 ** 63, 1e308, -1e-308, 0.5, "", "x", "\u0000",
       "\ud7ff\ue000", "💥" * 3, "<｜end▁of▁sentence｜>", "</think>", [], [1], ["a"], [[1]], {}, {"a": 1}, [None],
       {"role": "user"}, {"role": "user", "content": None}, [{"type": "text", "text": "hi"}], {"type": "text"},
       {"type": "tool_use"}, {"type": "tool_result", "tool_use_id": "t"}, {"type": "json_object"},
       {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string"}}}, {"type": "any"},
       {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
FIELDS = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop",
          "stream", "seed", "tools", "tool_choice", "presence_penalty", "frequency_penalty", "logit_bias",
          "stream_options", "reasoning_effort", "chat_template_kwargs", "ignore_eos", "logprobs", "top_logprobs",
          "response_format", "echo", "max_completion_tokens", "repetition_penalty", "system", "stop_sequences",
          "thinking", "output_config", "tokens", "add_special_tokens"]
INNER = ["role", "content", "type", "text", "name", "input", "tool_use_id", "tool_calls", "function", "arguments"]


def chat(text):
    return [{"role": "user", "content": text}]


BASES = [(b"/v1/chat/completions", {"model": MODEL, "messages": chat("Hi"), "max_tokens": 2}),
         (b"/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
         (b"/v1/messages", {"model": MODEL, "messages": chat("Hi"), "max_tokens": 2}),
         (b"/tokenize", {"model": MODEL, "prompt": "Hi"}),
         (b"/tokenize", {"model": MODEL, "messages": chat("Hi")}),
         (b"/detokenize", {"model": MODEL, "tokens": [1, 2, 3]})]


def request(method, path, headers, body=b""):
    return method + b" " + path + b" HTTP/1.1\r\nHost: fuzz\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


class Cases:
    """The cases of one worker. Each returns (kind, bytes, whole): `whole` marks one well-formed request whose
    response is read with the connection left open (the others half-close it after sending, so the server sees the
    end at once)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def next(self):
        r = self.rng.random()
        if r < 0.25:
            return "request_line", self.request_line(), False
        if r < 0.45:
            return "headers", self.headers(), False
        if r < 0.60:
            return "body", self.body(), False
        if r < 0.80:
            return "mutation", self.mutation(), False
        structured = self.structured()
        return "structured", structured, self.rng.random() < 0.5

    def junk(self, n):
        return bytes(self.rng.randrange(256) for _ in range(n))

    def request_line(self):
        rng = self.rng
        path = b"".join(rng.choice(SPECIAL) if rng.random() < 0.6 else bytes([rng.randrange(256)])
                        for _ in range(rng.randint(1, 30)))
        if rng.random() < 0.3:
            path = rng.choice(PATHS) + path
        line = rng.choice(METHODS) + b" /" + path + rng.choice(VERSIONS)
        end = rng.choice([b"\r\n", b"\n", b"\r", b"\r\r\n", b""])
        head = b"".join(rng.choice(HEADERS) + rng.choice([b"\r\n", b"\n"]) for _ in range(rng.randint(0, 3)))
        return line + end + head + rng.choice([b"\r\n", b"\n", b""])

    def headers(self):
        rng = self.rng
        headers = [rng.choice(HEADERS) for _ in range(rng.randint(1, 6))]
        for _ in range(rng.randint(0, 2)):  # random names and values
            name = self.junk(rng.randint(0, 12)) if rng.random() < 0.5 else rng.choice(HEADERS).split(b":")[0]
            headers.append(name + b":" + self.junk(rng.randint(0, 40)))
        if rng.random() < 0.05:  # many header lines, often more than the 64 KiB a request's head may take
            headers += [b"X-%d: %s" % (i, b"v" * rng.randint(0, 1000)) for i in range(rng.randint(50, 200))]
        body = self.junk(rng.randint(0, 64)) if rng.random() < 0.5 else b""
        return request(rng.choice(METHODS[:7]), rng.choice(PATHS), headers, body)

    def chunked(self, payload):
        rng, out = self.rng, b""
        while payload:
            n = rng.randint(1, len(payload))
            size = b"%x" % n if rng.random() < 0.9 else rng.choice([b"zz", b"-1", b"ffffffffffffffffff", b"", b"1;x=y"])
            out += size + b"\r\n" + payload[:n] + rng.choice([b"\r\n", b"\r\n", b"\n", b""])
            payload = payload[n:]
        return out + rng.choice([b"0\r\n\r\n", b"0\r\n", b"", b"0\r\nTrailer: x\r\n\r\n"])

    def body(self):
        rng = self.rng
        path, base = rng.choice(BASES)
        payload = json.dumps(base).encode()
        kind = rng.randrange(6)
        if kind == 0:  # random bytes
            payload = self.junk(rng.randint(0, 2000))
        elif kind == 1:  # cut short
            payload = payload[:rng.randrange(len(payload) + 1)]
        elif kind == 2:  # JSON that is not an object, or deep
            payload = rng.choice([b"[]", b"null", b"1", b'"x"', b"[" * 10000, b'{"a":' * 5000, b"{" + b" " * 100000])
        elif kind == 3:  # not UTF-8 inside strings
            payload = payload.replace(b"Hi", b"H\xff\xfe\xc3(" + self.junk(4))
        headers = [b"Content-Type: " + rng.choice([b"application/json", b"text/plain", b"multipart/form-data; boundary=b",
                                                   b"application/x-www-form-urlencoded", self.junk(8)])]
        if kind == 4:  # chunked
            headers.append(b"Transfer-Encoding: chunked")
            payload = self.chunked(payload)
        elif kind == 5:  # multipart
            headers = [b"Content-Type: multipart/form-data; boundary=XyZ"]
            part = b"--XyZ\r\nContent-Disposition: form-data; name=\"" + self.junk(3) + b"\"\r\n\r\n" + payload
            payload = part + rng.choice([b"\r\n--XyZ--\r\n", b"\r\n--XyZ", b"", b"\r\n--Xy"])
        if kind != 4:
            length = len(payload)
            if rng.random() < 0.2:
                length = rng.choice([0, length // 2, length + 1, length + 100000, 2 ** 62])
            headers.append(b"Content-Length: %d" % length)
        return request(rng.choice([b"POST", b"POST", b"PUT", b"GET"]), path, headers, payload)

    def mutation(self):
        rng = self.rng
        path, base = rng.choice(BASES)
        payload = json.dumps(base).encode()
        data = bytearray(request(b"POST", path, [b"Content-Type: application/json",
                                                   b"Content-Length: %d" % len(payload)], payload))
        for _ in range(rng.randint(1, 8)):
            op, i = rng.randrange(4), rng.randrange(len(data))
            if op == 0:
                data[i] = rng.randrange(256)
            elif op == 1:
                data[i:i] = bytes([rng.randrange(256)])
            elif op == 2:
                del data[i:i + rng.randint(1, 8)]
            else:
                data[i:i] = data[i:i + rng.randint(1, 64)]
        return bytes(data)

    def value(self, depth=0):
        rng = self.rng
        if depth < 2 and rng.random() < 0.2:
            return [self.value(depth + 1) for _ in range(rng.randint(0, 3))]
        if depth < 2 and rng.random() < 0.1:
            return {rng.choice(FIELDS + INNER): self.value(depth + 1) for _ in range(2)}
        return rng.choice(ODD)

    def structured(self):
        rng = self.rng
        path, base = rng.choice(BASES)
        body = dict(base)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.8:
                body[rng.choice(FIELDS)] = self.value()
            else:
                body["messages"] = [{"role": rng.choice(["user", "assistant", "system", "tool"]),
                                     rng.choice(INNER): self.value()}]
        # Bounded work: generation of at most 4 tokens a choice, 2 choices (the server's context is short too).
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and body[key] > 4:
                body[key] = 4
        if isinstance(body.get("n"), int) and body["n"] > 2:
            body["n"] = 2
        payload = json.dumps(body).encode()
        return request(b"POST", path, [b"Content-Type: application/json", b"Content-Length: %d" % len(payload)],
                       payload)


def parse_responses(data):
    """The statuses of the responses in `data` (HTTP/1.1 with Content-Length or chunked bodies), in order, and
    whether the bytes end inside a response. A response to HEAD announces a length it does not send: the next
    status line is then found by searching."""
    statuses, at = [], 0
    while at < len(data):
        end = data.find(b"\r\n\r\n", at)
        if end < 0:
            return statuses, True
        head = data[at:end]
        match = re.match(rb"HTTP/1\.1 (\d{3}) ", head)
        if not match:
            at = data.find(b"HTTP/1.1 ", at + 1)
            if at < 0:
                break
            continue
        status = int(match.group(1))
        statuses.append(status)
        at = end + 4
        if status < 200:  # 100 Continue: the final response follows
            continue
        length = re.search(rb"(?im)^content-length: *(\d+)\r?$", head)
        if length:
            at += int(length.group(1))
        elif re.search(rb"(?im)^transfer-encoding: *chunked\r?$", head):
            while True:
                line_end = data.find(b"\r\n", at)
                if line_end < 0:
                    return statuses, True
                size = int(data[at:line_end].split(b";")[0], 16)
                at = line_end + 2 + size + 2
                if size == 0:
                    break
    return statuses, at > len(data)


def exchange(address, data, whole, timeout=60):
    """Sends one case on a fresh connection and reads what comes back: the whole response of a `whole` request, else
    everything until the server closes (after a half-close: it sees the end of the request at once). Returns the
    statuses; raises TimeoutError when the server neither answers nor closes within the timeout."""
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(data)
            if not whole:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the server answered and closed before taking it all (a 431, a 413 on the announced length)
        reply = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            reply += chunk
            if whole:
                statuses, partial = parse_responses(reply)
                if statuses and statuses[-1] >= 200 and not partial:
                    return statuses
        return parse_responses(reply)[0]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024


class TestHttpFuzz(unittest.TestCase):
    def test_fuzz(self):
        # A short context bounds what a valid generated request costs.
        server = Server("--max-context", "64", "--header-timeout", "10", "--idle-timeout", "10")
        try:
            host, port = server.url.removeprefix("http://").split(":")
            address = (host, int(port))
            self.assertEqual(server.http.get("/health").status_code, 200)
            before = rss_mb(server.proc.pid)
            start = time.monotonic()
            lock = threading.Lock()
            statuses, kinds, failures = {}, {}, []
            sent = [0]

            def worker(w):
                cases = Cases(SEED * 1000 + w)
                for i in range(w, REQUESTS, WORKERS):
                    kind, data, whole = cases.next()
                    try:
                        got = exchange(address, data, whole)
                    except Exception as e:  # a hang, a reply that is not HTTP
                        got, error = [], e
                    else:
                        error = None
                    with lock:
                        sent[0] += 1
                        kinds[kind] = kinds.get(kind, 0) + 1
                        for s in got:
                            statuses[s] = statuses.get(s, 0) + 1
                        bad = [s for s in got if s >= 500]
                        if (error or bad) and len(failures) < 10:
                            failures.append(f"worker {w} case {i // WORKERS} ({kind}): {error or bad}: {data[:300]!r}")
                    if failures:
                        return

            threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.monotonic() - start
            self.assertEqual(failures, [])
            self.assertIsNone(server.proc.poll(), "the server exited")
            self.assertEqual(server.http.get("/health").status_code, 200)
            # Every thread is back, the batch is empty.
            deadline = time.time() + 30
            while server.metric("dsv4:num_requests_running") != 0 and time.time() < deadline:
                time.sleep(0.1)
            self.assertEqual(server.metric("dsv4:num_requests_running"), 0)
            after = rss_mb(server.proc.pid)
            answered = sum(n for s, n in statuses.items() if s >= 200)
            print(f"\nfuzz: {sent[0]} requests in {seconds:.0f} s ({kinds}), {answered} responses "
                  f"{dict(sorted(statuses.items()))}, resident memory {before:.0f} -> {after:.0f} MB", flush=True)
            self.assertEqual(sent[0], REQUESTS)
            # Most cases reach a handler, not only the parser's 400.
            for status in (200, 400, 404, 405, 413, 415, 431):
                self.assertGreater(statuses.get(status, 0), REQUESTS // 1000, status)
            self.assertLess(after - before, 100, f"resident memory {before:.0f} -> {after:.0f} MB")
        finally:
            self.assertEqual(server.stop(), 0, "".join(server.log))


if __name__ == "__main__":
    unittest.main()
