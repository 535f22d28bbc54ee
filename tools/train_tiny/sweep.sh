#!/usr/bin/env bash
# Train the tiny model under several regularisation settings at once on one GPU, keep the one with the
# lowest dev loss (dev = last 1% of the TRAINING tokens; the held-out text plays no part in the choice),
# then measure its held-out perplexity and write samples.
# Usage: tools/train_tiny/sweep.sh CORPUS_DIR WORK_DIR   (run from the repo root; prints a summary)
# models/tiny/README.md says which run was shipped and gives its own command.
set -euo pipefail
corpus=$1; work=$2
mkdir -p "$work"
common=(--data "$corpus" --tokenizer models/tiny --device cuda --no-samples)
# name  dropout  steps (57.5 steps = one pass over the training tokens at batch 32 x 512)
runs=("a 0.0 345" "b 0.1 575" "c 0.1 920" "d 0.2 1380")
for r in "${runs[@]}"; do
  set -- $r
  python3 tools/train_tiny/train.py "${common[@]}" --out "$work/$1" --dropout "$2" --steps "$3" \
    > "$work/$1.log" 2>&1 &
done
wait
for r in "${runs[@]}"; do
  set -- $r
  python3 tools/train_tiny/perplexity_hf.py --model "$work/$1" --text models/tiny/heldout.txt \
    --json "$work/$1/perplexity.json" > /dev/null 2>&1
done
python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
rows = []
for n in "abcd":
    t = json.load(open(os.path.join(work, n, "train_log.json")))
    p = json.load(open(os.path.join(work, n, "perplexity.json")))
    rows.append((t["saved_dev_loss"], n, t["args"]["dropout"], t["steps"], t["saved_step"], t["final_train_loss"],
                 t["final_dev_loss"], p["perplexity"], t["train_seconds"]))
    print(f"run {n}: dropout {rows[-1][2]} steps {rows[-1][3]} best dev {rows[-1][0]:.4f} at step {rows[-1][4]} "
          f"final train {rows[-1][5]} final dev {rows[-1][6]} held-out ppl {rows[-1][7]:.3f} ({rows[-1][8]} s)")
best = min(rows)[1]
print("best by dev loss:", best)
open(os.path.join(work, "best"), "w").write(best)
PY
