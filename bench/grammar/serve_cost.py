#!/usr/bin/env python3
"""What constrained decoding costs a running `dsv4 serve`: the engine's mean step time (its busy seconds over its
steps, from /metrics) while --batch chat requests decode at once, free and then held to a JSON schema by
response_format, at the same temperature. The schema is a long array of short strings, and the free answers are as
long (ignore_eos), so the batch stays full for as many steps. At temperature 0 the free rows take the backend's
argmax while the constrained ones bring their logits to the host: the grammar's worst case.

    build/bin/dsv4 serve --backend cpu --max-seqs 16 --port 8123 &
    build/venv/bin/python bench/grammar/serve_cost.py --base-url http://127.0.0.1:8123 --batch 16 --temperature 0

The venv comes from tools/setup (the `openai` package). Sends traffic only to --base-url.
"""

import argparse
import re
import statistics
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 40, "maxItems": 40}


def engine(base_url):
    """(steps, busy seconds) from dsv4's /metrics."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=10) as r:
        text = r.read().decode()
    value = lambda name: float(re.search("^" + re.escape(name) + r"(\{[^}]*\})? (\S+)$", text, re.M).group(2))
    return value("dsv4:engine_steps_total"), value("dsv4:engine_step_seconds_total")


def round_of(client, args, constrained, tokens):
    """Runs --batch requests at once; returns (ms per step, mean completion tokens)."""
    def one(i):
        extra = {} if constrained else {"ignore_eos": True}
        r = client.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": "List forty names."}], temperature=args.temperature,
            seed=i, max_tokens=tokens, extra_body=extra,
            **({"response_format": {"type": "json_schema", "json_schema": {"name": "names", "schema": SCHEMA}}}
               if constrained else {}))
        return r.usage.completion_tokens

    steps0, seconds0 = engine(args.base_url)
    with ThreadPoolExecutor(args.batch) as pool:
        generated = list(pool.map(one, range(args.batch)))
    steps1, seconds1 = engine(args.base_url)
    return 1000 * (seconds1 - seconds0) / (steps1 - steps0), statistics.mean(generated)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url.rstrip("/") + "/v1", api_key="unused", timeout=600)
    print("| round | free: ms/step | constrained: ms/step | constrained tokens/answer | cost |\n|---|---|---|---|---|")
    for r in range(args.rounds):
        constrained_ms, tokens = round_of(client, args, True, 800)
        free_ms, _ = round_of(client, args, False, int(tokens))
        print(f"| {r + 1} | {free_ms:.2f} | {constrained_ms:.2f} | {tokens:.0f} | "
              f"{100 * (constrained_ms / free_ms - 1):+.1f}% |")


if __name__ == "__main__":
    main()
