#!/usr/bin/env python3
"""What a chat fine-tune learnt, on the engine: the first assistant turn of held-out conversations, greedy.

Usage:
    python3 tools/train_small/chat_eval.py --model models/small [--n 64] [--seed 2] [--dsv4 build/bin/dsv4]

For each of chat_data.py's conversations (--n, --seed; the fine-tune's dev set is seed 2), the prompt is the text
up to the first assistant hand-over (<｜Assistant｜> then <think> or </think>), run through `dsv4 generate
--prompt-ids --temperature 0` (the CPU backend and its default numerics unless --backend / --numerics say
otherwise), and the new text up to EOS is compared with the conversation's own turn. Reported, as a table:
  * turns equal to the conversation's, whole;
  * turns that should call tools: the same tools in the same order, the whole DSML block equal, and well formed
    (one tool_calls block, ending the turn);
  * turns that should not: no DSML and an EOS.
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import chat_data  # noqa: E402

EOS, ASSISTANT, CALLS = chat_data.EOS, chat_data.ASSISTANT, chat_data.TOOL_CALLS_OPEN


def first_turn(text):
    """(prompt, turn): the text up to the first hand-over, and the assistant's turn after it, EOS included."""
    i = text.index(ASSISTANT) + len(ASSISTANT)
    i += len("<think>") if text.startswith("<think>", i) else len("</think>")
    j = text.index(EOS, i) + len(EOS)
    return text[:i], text[i:j]


def generate(args, ids):
    """The greedy continuation's ids (dsv4 generate prints them space-separated with --prompt-ids)."""
    cmd = [args.dsv4, "generate", "--model", args.model, "--prompt-ids", ",".join(map(str, ids)),
           "--max-tokens", str(args.max_tokens), "--temperature", "0", "--backend", args.backend]
    if args.numerics:
        cmd += ["--numerics", args.numerics]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    lines = [l for l in out.splitlines() if re.fullmatch(r"[\d ]+", l.strip() or "x")]
    return [int(x) for x in lines[-1].split()] if lines else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "models", "small"))
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--dsv4", default=os.path.join(REPO, "build", "bin", "dsv4"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--numerics", default="")
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--show", action="store_true", help="print every turn that differs")
    args = ap.parse_args()

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    n = dict(turns=0, equal=0, call_turns=0, same_tools=0, same_block=0, formed=0, plain_turns=0, plain_clean=0)
    for conv in chat_data.conversations(args.n, args.seed):
        prompt, want = first_turn(chat_data.render(conv))
        got = tok.decode(generate(args, tok.encode(prompt, add_special_tokens=False).ids), skip_special_tokens=False)
        got = got[:got.index(EOS) + len(EOS)] if EOS in got else got
        n["turns"] += 1
        n["equal"] += got == want
        if CALLS in want:
            names = re.compile(r'invoke name="([^"]+)"')
            n["call_turns"] += 1
            n["same_tools"] += names.findall(want) == names.findall(got)
            n["same_block"] += want[want.index(CALLS):] == (got[got.index(CALLS):] if CALLS in got else "")
            n["formed"] += got.count(CALLS) == 1 and got.endswith(chat_data.TOOL_CALLS_CLOSE + EOS)
        else:
            n["plain_turns"] += 1
            n["plain_clean"] += "DSML" not in got and got.endswith(EOS)
        if args.show and got != want:
            print(f"want {want!r}\ngot  {got!r}\n")
    print(f"| first assistant turns ({args.n} conversations, seed {args.seed}) | count |")
    print("|---|---|")
    print(f"| equal to the conversation's, whole | {n['equal']} / {n['turns']} |")
    print(f"| tool-call turns: the same tools | {n['same_tools']} / {n['call_turns']} |")
    print(f"| tool-call turns: the whole DSML block equal (arguments too) | {n['same_block']} / {n['call_turns']} |")
    print(f"| tool-call turns: well formed (one block, ending the turn) | {n['formed']} / {n['call_turns']} |")
    print(f"| turns without a call: no DSML, EOS | {n['plain_clean']} / {n['plain_turns']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
