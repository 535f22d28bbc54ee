#!/usr/bin/env python3
"""Train the tiny model's byte-level BPE tokenizer (DeepSeek-V3 pre-tokenizer, vocab 4096).

Usage:
    python3 tools/train_tiny/train_tokenizer.py --train DIR/train.txt --ref tests/data/tokenizer/deepseek-v3
                                                --out models/tiny [--vocab 4096]

Needs only the `tokenizers` package (Apache-2.0). The normalizer, pre-tokenizer (a Sequence of three
Split regexes + ByteLevel), post-processor and decoder are copied verbatim from the DeepSeek-V3
tokenizer.json, so the C++ tokenizer runs exactly the code path it runs for the real model. Ids:
    0 <｜begin▁of▁sentence｜>  special (BOS)
    1 <｜end▁of▁sentence｜>    special (EOS)
    2 <｜User｜>  3 <｜Assistant｜>  4 <think>  5 </think>   added, non-special (as in DeepSeek's files)
    6 .. 261  the 256 byte symbols, then the learned merges up to --vocab ids in all.
Writes OUT/tokenizer.json, OUT/tokenizer_config.json and OUT/generation_config.json.
"""
import argparse
import gzip
import json
import os
import sys

from tokenizers import Tokenizer, pre_tokenizers, trainers

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
CHAT = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True, help="training text (train.txt from prepare_corpus.py)")
    ap.add_argument("--ref", required=True, help="folder with the DeepSeek-V3 tokenizer.json (or tokenizer.json.gz)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--min-frequency", type=int, default=2)
    a = ap.parse_args()

    path = os.path.join(a.ref, "tokenizer.json")
    with (open(path, encoding="utf-8") if os.path.exists(path)
          else gzip.open(path + ".gz", "rt", encoding="utf-8")) as f:
        ref = json.load(f)
    skeleton = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": ref["normalizer"],
        "pre_tokenizer": ref["pre_tokenizer"],
        "post_processor": ref["post_processor"],
        "decoder": ref["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": {}, "merges": []},
    }
    tok = Tokenizer.from_str(json.dumps(skeleton))
    trainer = trainers.BpeTrainer(
        vocab_size=a.vocab, min_frequency=a.min_frequency, show_progress=False,
        special_tokens=[BOS, EOS] + CHAT, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([a.train], trainer)

    # Re-emit with DeepSeek's added-token flags: BOS/EOS special, chat markers normalized & non-special.
    t = json.loads(tok.to_str())
    for at in t["added_tokens"]:
        chat = at["content"] in CHAT
        at.update(single_word=False, lstrip=False, rstrip=False, normalized=chat, special=not chat)
    # the pieces we copied must have survived training unchanged
    for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        assert t[k] == ref[k], f"{k} changed"
    ids = {at["content"]: at["id"] for at in t["added_tokens"]}
    assert [ids[s] for s in [BOS, EOS] + CHAT] == list(range(6)), ids
    vocab = t["model"]["vocab"]
    assert len(vocab) == a.vocab and sorted(vocab.values()) == list(range(a.vocab)), len(vocab)

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False, indent=1)
        f.write("\n")
    added = lambda s: {"__type": "AddedToken", "content": s, "lstrip": False, "normalized": True,
                       "rstrip": False, "single_word": False}
    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": added(BOS),
        "eos_token": added(EOS),
        "pad_token": added(EOS),
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")
    gen = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1, "do_sample": True,
           "temperature": 0.8, "top_p": 0.95}
    with open(os.path.join(a.out, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")

    # report: compression on the training text and a round trip
    text = open(a.train, encoding="utf-8").read()
    tok = Tokenizer.from_file(os.path.join(a.out, "tokenizer.json"))
    enc = tok.encode(text, add_special_tokens=False)
    assert tok.decode(enc.ids) == text, "decode(encode(text)) != text"
    print(f"vocab {tok.get_vocab_size()}  train text {len(text.encode())} bytes -> {len(enc.ids)} tokens "
          f"({len(text.encode()) / len(enc.ids):.2f} bytes/token); round trip exact")
    sample = "Once upon a time, Elizabeth said: \"It is 1811!\"\n\n<｜User｜>Hi<｜Assistant｜><think>ok</think>"
    e = tok.encode(sample, add_special_tokens=False)
    print(sample.replace("\n", "\\n"), "->", e.ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
