#!/usr/bin/env python3
"""Build the tiny model's training corpus from Debian's r-cran-janeaustenr package.

Usage:
    python3 tools/train_tiny/prepare_corpus.py --out DIR [--deb PATH.deb] [--heldout-frac 0.02]
                                               [--heldout-copy models/tiny/heldout.txt]

The package (Debian bookworm, r-cran-janeaustenr 1.0.0-1, MIT; the novels themselves are in the
public domain) stores Jane Austen's six completed novels as R character vectors (one element per
line of the Project Gutenberg text) in an R lazy-load database (data/Rdata.rdx + Rdata.rdb).
This script reads that database with a small R-serialization (XDR) reader of its own, so neither R
nor an R-reading Python package is needed, then
  1. reflows each novel: lines within a paragraph are joined with one space, paragraphs are separated
     by one blank line, runs of spaces collapse, Gutenberg's _italic_ underscores are dropped;
  2. concatenates the novels in publication order (Sense and Sensibility, Pride and Prejudice,
     Mansfield Park, Emma, Northanger Abbey, Persuasion), separated by a blank line;
  3. splits off the last --heldout-frac of the characters (a contiguous tail, cut at a paragraph
     boundary) as the validation text.
Writes DIR/train.txt and DIR/heldout.txt (UTF-8, '\n' line ends) and prints sizes and SHA-256s.
Without --deb it runs `apt-get download r-cran-janeaustenr=1.0.0-1` into DIR.
"""
import argparse
import glob
import gzip
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib

PACKAGE = "r-cran-janeaustenr"
VERSION = "1.0.0-1"
DATA_DIR = "usr/lib/R/site-library/janeaustenr/data"
# (R object name, title) in publication order
NOVELS = [
    ("sensesensibility", "Sense and Sensibility"),
    ("prideprejudice", "Pride and Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
]


class RReader:
    """Minimal reader for R's XDR serialization format (versions 2 and 3).

    Handles what data packages contain: NULL, symbols, pairlists (attributes), character, logical,
    integer, double and generic vectors, and back-references. Returns Python values: str/None for
    CHARSXP, lists for vectors; attributes are read and dropped.
    """

    NILVALUE, REFSXP, GLOBALENV, EMPTYENV, BASEENV = 254, 255, 253, 242, 241
    SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 1, 2, 9, 10, 13, 14, 16, 19

    def __init__(self, data):
        self.d = data
        self.p = 0
        self.refs = []

    def _int(self):
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def _len(self):
        n = self._int()
        if n == -1:
            hi, lo = self._int(), self._int()
            n = (hi << 32) + lo
        return n

    def read(self):
        if self.d[:2] != b"X\n":
            raise ValueError(f"not an XDR R serialization (starts {self.d[:2]!r})")
        self.p = 2
        version = self._int()
        self._int()  # writer R version
        self._int()  # minimal reader R version
        if version == 3:
            n = self._int()
            self.p += n  # native encoding name
        elif version != 2:
            raise ValueError(f"unsupported R serialization version {version}")
        return self.item()

    def item(self):
        flags = self._int()
        t = flags & 0xFF
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t in (self.NILVALUE, self.GLOBALENV, self.EMPTYENV, self.BASEENV):
            return None
        if t == self.REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self._int()
            return self.refs[idx - 1]
        if t == self.SYMSXP:
            name = self.item()
            self.refs.append(name)
            return name
        if t == self.LISTSXP:
            out = []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out.append((tag, self.item()))
                flags = self._int()
                t = flags & 0xFF
                if t == self.NILVALUE:
                    return out
                if t != self.LISTSXP:
                    raise ValueError(f"pairlist tail of type {t}")
                has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t == self.CHARSXP:
            n = self._int()
            if n == -1:
                return None
            s = self.d[self.p:self.p + n].decode("utf-8" if (flags >> 12) & 8 else "latin-1")
            self.p += n
            return s
        if t in (self.LGLSXP, self.INTSXP):
            n = self._len()
            v = list(struct.unpack_from(f">{n}i", self.d, self.p))
            self.p += 4 * n
        elif t == self.REALSXP:
            n = self._len()
            v = list(struct.unpack_from(f">{n}d", self.d, self.p))
            self.p += 8 * n
        elif t in (self.STRSXP, self.VECSXP):
            v = [self.item() for _ in range(self._len())]
        else:
            raise ValueError(f"unsupported R SEXP type {t} at byte {self.p - 4}")
        if has_attr:
            self.item()
        return v


class NamedRReader(RReader):
    """RReader that keeps the 'names' attribute of generic vectors: returns a list of (name, value)."""

    def item(self):
        start = self.p
        flags = struct.unpack_from(">i", self.d, start)[0]
        t, has_attr = flags & 0xFF, bool(flags & (1 << 9))
        if t != self.VECSXP or not has_attr:
            return super().item()
        self.p += 4
        v = [self.item() for _ in range(self._len())]
        attrs = self.item()  # pairlist of (tag, value)
        names = dict(attrs).get("names")
        return list(zip(names, v)) if names else v


def load_novels(deb):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
        data_dir = os.path.join(tmp, DATA_DIR)
        with gzip.open(os.path.join(data_dir, "Rdata.rdx")) as f:
            index = dict(NamedRReader(f.read()).read())
        if index["compressed"] not in ([True], [1]):
            raise ValueError(f"unsupported lazy-load compression {index['compressed']}")
        with open(os.path.join(data_dir, "Rdata.rdb"), "rb") as f:
            rdb = f.read()
        out = {}
        for name, (off, n) in index["variables"]:
            blob = rdb[int(off):int(off) + int(n)]
            raw_len = struct.unpack(">I", blob[:4])[0]
            raw = zlib.decompress(blob[4:])  # compress=TRUE: 4-byte length + zlib stream
            if len(raw) != raw_len:
                raise ValueError(f"{name}: {len(raw)} bytes, index says {raw_len}")
            out[name] = RReader(raw).read()
    missing = [n for n, _ in NOVELS if n not in out]
    if missing:
        raise ValueError(f"novels missing from the package: {missing} (found {sorted(out)})")
    return out


def reflow(lines):
    """Gutenberg hard-wrapped lines -> paragraphs separated by one blank line."""
    paras, cur = [], []
    for ln in lines:
        ln = (ln or "").strip()
        if ln:
            cur.append(ln)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    out = []
    for p in paras:
        p = re.sub(r"_([^_]+)_", r"\1", p)  # _italics_
        p = p.replace("_", "")
        p = re.sub(r"\s+", " ", p).strip()
        if p:
            out.append(p)
    return "\n\n".join(out)


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--deb", default="", help=f"path to {PACKAGE}_{VERSION}_all.deb (else apt-get download)")
    ap.add_argument("--heldout-frac", type=float, default=0.02)
    ap.add_argument("--heldout-copy", default="", help="also copy heldout.txt here (e.g. models/tiny/heldout.txt)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    deb = a.deb
    if not deb:
        subprocess.run(["apt-get", "download", f"{PACKAGE}={VERSION}"], check=True, cwd=a.out)
        deb = glob.glob(os.path.join(a.out, f"{PACKAGE}_*.deb"))[0]
    print(f"package {deb} sha256 {sha256(open(deb, 'rb').read())}")
    novels = load_novels(deb)
    texts = []
    for name, title in NOVELS:
        t = reflow(novels[name])
        print(f"  {name:18s} {title:24s} {len(novels[name]):6d} lines -> {len(t):8d} chars")
        texts.append(t)
    corpus = "\n\n".join(texts) + "\n"
    cut = int(len(corpus) * (1.0 - a.heldout_frac))
    cut = corpus.index("\n\n", cut) + 2  # start the held-out text at a paragraph
    train, held = corpus[:cut], corpus[cut:]
    for fname, text in (("train.txt", train), ("heldout.txt", held)):
        b = text.encode("utf-8")
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(b)
        print(f"{fname}: {len(b)} bytes, {len(text)} chars, sha256 {sha256(b)}")
    if a.heldout_copy:
        with open(a.heldout_copy, "wb") as f:
            f.write(held.encode("utf-8"))
        print(f"copied held-out text to {a.heldout_copy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
