#!/usr/bin/env python3
"""Hugging Face `tokenizers` throughput on the tokenizer parity corpus, beside dsv4's bench_tokenizer.

    python3 tools/tokenizer/bench_hf.py [--tokenizer v3|v4|PATH] [--repeat N] [--cpp build/bin/bench_tokenizer]

Measures, on the same text as bench/tokenizer/bench_tokenizer.cpp (tests/data/tokenizer/samples.jsonl.gz):
encode with one call per sample from Python (one thread) and encode_batch (Rust threads), and decode.
With --cpp it also runs the C++ benchmark (--json) and prints both side by side.
"""
import argparse
import gzip
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "tokenizer"


def load(which):
    from tokenizers import Tokenizer
    if which in ("v3", "v4"):
        gz = DATA / ("deepseek-" + which) / "tokenizer.json.gz"
        return Tokenizer.from_str(gzip.decompress(gz.read_bytes()).decode())
    return Tokenizer.from_file(which)


def timed(fn, repeat):
    times = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="v3")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cpp", help="path of bench_tokenizer to run on the same text")
    args = ap.parse_args()

    import tokenizers
    texts = [json.loads(line)["text"] for line in gzip.open(DATA / "samples.jsonl.gz", "rt", encoding="utf-8")]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    t0 = time.perf_counter()
    tok = load(args.tokenizer)
    load_s = time.perf_counter() - t0

    enc_s, ids = timed(lambda: [tok.encode(t, add_special_tokens=False).ids for t in texts], args.repeat)
    batch_s, _ = timed(lambda: tok.encode_batch(texts, add_special_tokens=False), args.repeat)
    dec_s, _ = timed(lambda: [tok.decode(i, skip_special_tokens=False) for i in ids], args.repeat)
    hf = {"encode_mb_s": mb / enc_s, "encode_mt_mb_s": mb / batch_s, "decode_mb_s": mb / dec_s, "load_s": load_s,
          "tokens": sum(len(i) for i in ids)}
    print("corpus: %d samples, %.2f MB, %d tokens; tokenizers %s; %d CPUs; median of %d runs"
          % (len(texts), mb, hf["tokens"], tokenizers.__version__, os.cpu_count(), args.repeat))

    rows = [("encode, 1 thread", "encode_mb_s"), ("encode, all threads", "encode_mt_mb_s"), ("decode", "decode_mb_s"),
            ("load tokenizer.json (s)", "load_s")]
    cpp = None
    if args.cpp:
        out = subprocess.run([args.cpp, "--tokenizer", args.tokenizer, "--repeat", str(args.repeat), "--json"],
                             check=True, capture_output=True, text=True).stdout
        cpp = json.loads(out.strip().splitlines()[-1])
        if cpp["tokens"] != hf["tokens"]:
            print("WARNING: token counts differ: dsv4 %d, HF %d" % (cpp["tokens"], hf["tokens"]))
    print()
    print("| %s | HF tokenizers | dsv4 |" % ("tokenizer " + args.tokenizer))
    print("|---|---|---|")
    for label, key in rows:
        unit = "" if key == "load_s" else " MB/s"
        mine = "%.2f%s" % (cpp[key], unit) if cpp else "-"
        print("| %s | %.2f%s | %s |" % (label, hf[key], unit, mine))


if __name__ == "__main__":
    main()
