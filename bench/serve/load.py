#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server, reporting what `vllm bench serve` reports: time to first token
(TTFT), inter-token latency (ITL), time per output token (TPOT), end-to-end latency (E2E) percentiles,
request and token throughput. Prints a markdown table.

Every request streams a completion of exactly --output-len tokens (ignore_eos) from a random prompt of
--input-len tokens (ids drawn from the vocabulary, so the length is exact without a tokenizer); at most
--concurrency requests are in flight at once. Greedy by default; --temperature T samples.

    python3 bench/serve/load.py --base-url http://127.0.0.1:8000 --concurrency 8 \
        --num-prompts 64 --input-len 128 --output-len 64

Python 3's standard library only (no client package), so it runs as is on the GPU machine. Sends traffic only
to --base-url.
"""

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
import urllib.parse
import urllib.request


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def engine_counters(base_url):
    """dsv4's engine counters from /metrics (steps, their tokens and busy seconds); None from other servers."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    names = ("dsv4:engine_steps_total", "dsv4:engine_step_tokens_total", "dsv4:engine_step_seconds_total")
    values = [re.search("^" + re.escape(n) + r"(\{[^}]*\})? (\S+)$", text, re.M) for n in names]
    return [float(v.group(2)) for v in values] if all(values) else None


async def events(base_url, path, body):
    """POSTs JSON over HTTP/1.1 and yields the server-sent events of the response (chunked or not) as objects,
    until `data: [DONE]`. A status other than 200 raises RuntimeError with the start of the body."""
    url = urllib.parse.urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
    try:
        data = json.dumps(body).encode()
        writer.write(f"POST {url.path.rstrip('/')}{path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
                     .encode() + data)
        await writer.drain()
        status = (await reader.readline()).split()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()

        async def pieces():
            if headers.get("transfer-encoding", "").lower() != "chunked":
                while piece := await reader.read(65536):
                    yield piece
                return
            while size := int((await reader.readline()).split(b";")[0], 16):
                yield await reader.readexactly(size)
                await reader.readline()  # the CRLF after the chunk

        if len(status) < 2 or status[1] != b"200":
            text = b"".join([p async for p in pieces()]).decode(errors="replace")
            raise RuntimeError(f"HTTP {b' '.join(status[1:]).decode()}: {text[:200]}")
        buffer = b""
        async for piece in pieces():
            buffer += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        return
                    yield json.loads(payload)
    finally:
        writer.close()


async def one_request(base_url, model, prompt, output_len, results, temperature=0.0, seed=None):
    start = time.perf_counter()
    times = []  # arrival of each chunk that carried text
    tokens = 0
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if seed is not None:
        body["seed"] = seed
    async for chunk in events(base_url, "/v1/completions", body):
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            times.append(time.perf_counter())
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    if not times:
        raise RuntimeError("a request produced no text")
    results.append({
        "ttft": times[0] - start,
        "itl": [b - a for a, b in zip(times, times[1:])],
        "tpot": (end - times[0]) / (tokens - 1) if tokens > 1 else 0.0,
        "e2e": end - start,
        "output_tokens": tokens,
    })


async def run(args):
    base_url = args.base_url.rstrip("/")
    if args.model:
        model = args.model
    else:
        with urllib.request.urlopen(base_url + "/v1/models", timeout=60) as r:
            model = json.load(r)["data"][0]["id"]
    vocab = args.vocab
    rng = random.Random(args.seed)
    # Token 0 is BOS in DeepSeek vocabularies; the rest avoids the special ids at the bottom of the range.
    prompts = [[0] + [rng.randrange(16, vocab) for _ in range(args.input_len - 1)] for _ in range(args.num_prompts)]

    # Warm-up: the first request pays one-time costs that are not the server's steady state.
    await one_request(base_url, model, prompts[0][: min(16, args.input_len)], 2, [])

    results = []
    limit = asyncio.Semaphore(args.concurrency)

    failures = []

    async def limited(p):
        async with limit:
            try:
                await one_request(base_url, model, p, args.output_len, results, args.temperature,
                                  rng.randrange(2 ** 31) if args.temperature > 0 else None)
            except (OSError, RuntimeError, ValueError, asyncio.IncompleteReadError) as e:
                failures.append(repr(e))

    before = engine_counters(base_url)
    start = time.perf_counter()
    await asyncio.gather(*(limited(p) for p in prompts))
    duration = time.perf_counter() - start
    after = engine_counters(base_url)
    engine = [b - a for a, b in zip(before, after)] if before and after else None
    return model, results, failures, duration, engine


def report(args, model, results, failures, duration, engine):
    ms = 1000.0
    ttft = [r["ttft"] * ms for r in results]
    tpot = [r["tpot"] * ms for r in results]
    itl = [x * ms for r in results for x in r["itl"]]
    e2e = [r["e2e"] * ms for r in results]
    out_tokens = sum(r["output_tokens"] for r in results)
    in_tokens = args.input_len * len(results)
    print(f"### {model} at {args.base_url}: concurrency {args.concurrency}, {len(results)} prompts, "
          f"input {args.input_len}, output {args.output_len}\n")
    print("| metric | mean | p50 | p90 | p99 |")
    print("|---|---|---|---|---|")
    for name, values in (("TTFT (ms)", ttft), ("TPOT (ms)", tpot), ("ITL (ms)", itl), ("E2E (ms)", e2e)):
        print(f"| {name} | {statistics.fmean(values):.1f} | {percentile(values, 50):.1f} | "
              f"{percentile(values, 90):.1f} | {percentile(values, 99):.1f} |")
    print()
    print("| throughput | value |")
    print("|---|---|")
    print(f"| successful / failed requests | {len(results)} / {len(failures)} |")
    print(f"| duration (s) | {duration:.2f} |")
    print(f"| requests/s | {len(results) / duration:.2f} |")
    print(f"| output tokens/s | {out_tokens / duration:.1f} |")
    print(f"| total tokens/s (input + output) | {(in_tokens + out_tokens) / duration:.1f} |")
    if engine and engine[0] > 0:
        steps, rows, busy = engine
        # The server's own view: how long its forward steps took, apart from HTTP, clients and queueing.
        print(f"| engine steps / mean tokens per step | {steps:.0f} / {rows / steps:.1f} |")
        print(f"| engine mean step (ms) | {busy / steps * ms:.1f} |")
        print(f"| engine busy (% of duration) | {100 * busy / duration:.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", help="model id (default: the first of /v1/models)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    parser.add_argument("--output-len", type=int, default=64, help="generated tokens per request")
    parser.add_argument("--vocab", type=int, default=4096, help="prompt ids are drawn below this (4096: tiny)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy; above, every request samples (seeded from --seed)")
    args = parser.parse_args()
    if min(args.concurrency, args.num_prompts, args.input_len, args.output_len) < 1:
        sys.exit("load.py: --concurrency, --num-prompts, --input-len and --output-len must be at least 1")
    model, results, failures, duration, engine = asyncio.run(run(args))
    if not results:
        sys.exit(f"load.py: every request failed, e.g. {failures[0]}")
    for failure in sorted(set(failures)):
        print(f"failed: {failure}", file=sys.stderr)
    report(args, model, results, failures, duration, engine)


if __name__ == "__main__":
    main()
