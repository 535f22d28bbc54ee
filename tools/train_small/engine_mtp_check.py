#!/usr/bin/env python3
"""dsv4's MTP module on a held-out text, against the PyTorch MTP of mtp.py on the same stored weights.

Usage:
    python3 tools/train_small/engine_mtp_check.py --dsv4 build/bin/dsv4 --model models/small
                                                  [--text FILE] [--chunks N] [--json OUT.json]

For every perplexity chunk ([BOS] + 255 tokens, tools/train_tiny/perplexity_hf.py) it runs
`dsv4 logits --mtp` (rows j: main state at j and token j+1 -> logits of token j+2) and `dsv4 logits` (main
logits) on the CPU backend under --numerics exact and reference, and the PyTorch MTP (float32) on the
exactly dequantised checkpoint (mtp_eval.py). Reports, over rows j = 0 .. len - 3 of every chunk:
  * exact vs PyTorch: the largest |logit difference| and the share of rows with the same argmax;
  * for each of PyTorch, dsv4 exact and dsv4 reference: the MTP's mean NLL of token j+2, its top-1
    accuracy, and its greedy acceptance (MTP argmax = the same run's main argmax at j + 1).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "train_tiny"))
from mtp_eval import load_with_mtp, mtp_rows  # noqa: E402
from perplexity_hf import chunk_ids, tokenize  # noqa: E402


def dsv4_logits(dsv4, model, tokens, numerics, mtp, tmp):
    out = os.path.join(tmp, "logits.f32")
    cmd = [dsv4, "logits", "--model", model, "--tokens", ",".join(map(str, tokens)), "--out", out,
           "--backend", "cpu", "--numerics", numerics] + (["--mtp"] if mtp else [])
    subprocess.run(cmd, check=True, capture_output=True)
    return np.fromfile(out, dtype="<f4")


class Tally:
    def __init__(self):
        self.nll, self.rows, self.top1, self.accept = 0.0, 0, 0, 0

    def add(self, mtp_logits, main_logits, x):
        """mtp_logits rows j = 0 .. T-3 predict x[j+2]; main_logits rows j + 1 give the main argmax."""
        m = torch.log_softmax(torch.as_tensor(mtp_logits, dtype=torch.float64), dim=-1)
        tgt = torch.as_tensor(x[2:])
        self.nll += float(-m.gather(1, tgt[:, None]).sum())
        self.rows += len(tgt)
        draft = m.argmax(-1)
        self.top1 += int((draft == tgt).sum())
        self.accept += int((draft == torch.as_tensor(main_logits[1:-1]).argmax(-1)).sum())

    def report(self):
        return {"rows": self.rows, "mtp_mean_nll": self.nll / self.rows, "mtp_perplexity": math.exp(self.nll / self.rows),
                "mtp_top1": self.top1 / self.rows, "mtp_greedy_acceptance": self.accept / self.rows}


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsv4", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default="")
    ap.add_argument("--chunks", type=int, default=0, help="only the first N chunks (default: all)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_float32_matmul_precision("highest")
    text = open(a.text or os.path.join(a.model, "heldout.txt"), encoding="utf-8").read()
    tallies = {"pytorch_float32": Tally(), "dsv4_exact": Tally(), "dsv4_reference": Tally()}
    max_diff, same_top, rows = 0.0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, model, mtp, tap = load_with_mtp(a.model, "cpu", tmp)
        V = model.config.vocab_size
        chunks = chunk_ids(tokenize(hf_dir, text))
        chunks = chunks[:a.chunks] if a.chunks else chunks
        for i, c in enumerate(chunks):
            x = [model.config.bos_token_id] + c
            T = len(x)
            main_pt, mtp_pt = mtp_rows(model, mtp, tap, torch.tensor([x]))
            main_pt, mtp_pt = main_pt[0].float().numpy(), mtp_pt[0, :T - 2].float().numpy()
            tallies["pytorch_float32"].add(mtp_pt, main_pt, x)
            for numerics in ("exact", "reference"):
                mtp_e = dsv4_logits(a.dsv4, a.model, x, numerics, True, tmp).reshape(T - 1, V)[:T - 2]
                main_e = dsv4_logits(a.dsv4, a.model, x, numerics, False, tmp).reshape(T, V)
                tallies["dsv4_" + numerics].add(mtp_e, main_e, x)
                if numerics == "exact":
                    max_diff = max(max_diff, float(np.abs(mtp_e - mtp_pt).max()))
                    same_top += int((mtp_e.argmax(-1) == mtp_pt.argmax(-1)).sum())
                    rows += T - 2
            if i % 10 == 0:
                print(f"chunk {i + 1}/{len(chunks)}: max |dsv4 exact - pytorch| so far {max_diff:.3g}", flush=True)
    res = {"model": a.model, "chunks": len(chunks), "rows": rows,
           "exact_vs_pytorch_max_abs_logit_diff": max_diff, "exact_vs_pytorch_same_argmax": same_top / rows}
    res.update({k: t.report() for k, t in tallies.items()})
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
