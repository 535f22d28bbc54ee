#!/usr/bin/env python3
"""Greedy and sampled continuations of a saved tiny model with transformers generate (float32).

Usage:
    python3 tools/train_tiny/samples_hf.py --model DIR [--device cpu|cuda] [--new 60] [--json OUT.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import samples  # noqa: E402

PROMPTS = ["Once upon a time", "It is a truth universally acknowledged", "Elizabeth", "\"My dear,\" said"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--new", type=int, default=60)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    out = samples(a.model, a.device, PROMPTS, n_new=a.new)
    for s in out:
        print(json.dumps(s, ensure_ascii=False))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
