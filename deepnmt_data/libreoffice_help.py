#!/usr/bin/env python3
"""Build a sentence-aligned parallel corpus from the LibreOffice help.

The Debian packages ``libreoffice-help-<lang>`` ship the LibreOffice help as
HTML under ``usr/share/libreoffice/help/<lang-dir>/text/``.  Every language
has the same files, and every paragraph or heading carries the same id
(``par_id...``, ``hd_id...``) in every language, so the help is a real,
human-translated parallel corpus that can be aligned without any statistics.

Pipeline (all counts end up in STATS.json):

1. Read the two .deb files (own ``ar`` reader, then ``tarfile``/``lzma``).
2. Parse each HTML file with ``html.parser``; a *segment* is the text of an
   element whose id starts with ``par_id`` or ``hd_id``.  Markup is dropped,
   whitespace normalised.  Of every ``switch``/``switchinline`` span only the
   default variant is kept (the OS/application specific ``<span hidden
   class="MAC|WIN|UNIX|WRITER|CALC|...">`` cases are dropped).
   Code samples (``class="code"``, ``codeintable``, ``smathcode``, ``example``,
   anything inside ``<pre>``/``<code>``) and segments that contain a broken
   embed placeholder (``<span class="bug">``) are dropped.
3. Align segments on (relative file path, id, occurrence of that id in the
   file).
4. Split a segment into sentences only where both sides split into the same
   number of sentences; otherwise keep it whole.
5. Drop pairs that are empty (no letter or digit on a side), untranslated
   (target == source), or of extreme length ratio (more than 3 times as many
   words on one side as on the other, plus an allowance of 2 words for very
   short segments: keep iff ``max <= 3 * min + 2``).
6. Whole files go to valid and test (about 3 % of the pairs each, files chosen
   by a seeded shuffle, no set overshooting its target by more than half);
   exact duplicate pairs are removed within each split, and valid/test pairs
   whose source side occurs in train (test: also in valid) are removed.
7. What is written: train is a seeded sample of ``--train-size`` pairs with
   at most ``--max-train-words`` words per side; valid and test are complete
   except for lines over 200 words; ``--full`` adds the whole train split
   under OUT/full/.  Write gzip files that are byte-for-byte reproducible (mtime 0, fixed
   order), plus STATS.json and NOTICE, into a temporary directory next to the
   output that is renamed into place at the end; an existing output is only
   replaced with ``--force``.

The .deb reading and the atomic output are in :mod:`deepnmt_data.debs`.  Standard library
only.  Example (``deepnmt-extract-libreoffice-help`` is the same command)::

    python scripts/extract_libreoffice_help.py --src en --tgt de \\
        --out data/libreoffice-help/en-de --download
"""

from __future__ import annotations

import argparse
import html.parser
import random
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from deepnmt_deploy.help_format import HelpFormatter
from .debs import (DebFiles, ExtractError, add_deb_source_args, checked_out_dir, deb_dir, download_packages,
                   find_pkg_deb, package_entry, publish_dataset, read_deb_files, run_reporting_errors,
                   write_gz_lines)

# what STATS.json and NOTICE name as the producer (the command's name since the shipped corpus was made)
SCRIPT_NAME = "scripts/extract_libreoffice_help.py"

# Length-ratio filter: keep a pair iff max_words <= RATIO * min_words + ALLOWANCE.
MAX_RATIO = 3.0
RATIO_ALLOWANCE = 2
# valid/test: lines longer than this (words, either side) are dropped.
MAX_EVAL_WORDS = 200
# Fraction of the pairs that go to valid and to test each.
HELDOUT_FRACTION = 0.03
# A held-out set may overshoot its target by at most this fraction.
MAX_HELDOUT_OVERSHOOT = 0.5


# --------------------------------------------------------------------------
# Languages and packages
# --------------------------------------------------------------------------

def help_dir_for(lang: str) -> str:
    """Directory name of a language under usr/share/libreoffice/help/."""
    return "en-US" if lang.lower() in ("en", "en-us") else lang


def package_for(lang: str) -> str:
    """Debian package that ships the help for ``lang``."""
    return "libreoffice-help-" + help_dir_for(lang).lower()


HelpPackage = DebFiles  # a libreoffice-help package: its HTML files under text/


def read_help_deb(path: Path, lang: str) -> HelpPackage:
    """Read the HTML help files of ``lang`` from a libreoffice-help .deb."""
    prefix = f"usr/share/libreoffice/help/{help_dir_for(lang)}/text/"
    return read_deb_files(path, prefix, ".html",
                          f"no help files under {prefix} "
                          f"(is this the {package_for(lang)} package?)")


def find_deb(directory: Path, lang: str) -> Path:
    return find_pkg_deb(directory, package_for(lang))


def download_debs(langs: list[str], directory: Path) -> None:
    download_packages([package_for(lang) for lang in langs], directory)


# --------------------------------------------------------------------------
# HTML -> segments
# --------------------------------------------------------------------------

VOID_TAGS = frozenset("area base br col embed hr img input link meta param source track wbr".split())
BREAK_TAGS = frozenset("br p div li td th tr h1 h2 h3 h4 h5 h6 h table ul ol pre".split())
# Block starts that implicitly close an open <p> (HTML rules), so that a
# missing </p> cannot swallow the rest of the page.
CLOSES_P = frozenset("p div h1 h2 h3 h4 h5 h6 ul ol table pre".split())
SKIP_TAGS = frozenset("script style noscript head title".split())
CODE_TAGS = frozenset("pre code".split())
CODE_CLASSES = frozenset("code codeintable smathcode example bascode pycode sqlcode".split())
SEGMENT_ID = re.compile(r"^(par|hd)_id")
INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"), None)


def normalise(text: str) -> str:
    """Drop invisible characters, collapse all (Unicode) whitespace."""
    return " ".join(text.translate(INVISIBLE).split())


@dataclass
class Segment:
    key: tuple[str, int]  # (id, occurrence of that id in the file)
    text: str
    is_code: bool
    broken: bool


@dataclass
class _Open:
    tag: str
    suppress: bool       # text inside is not rendered by default
    is_switch: bool      # a switch/switchinline span
    segment: bool        # this element opened the current segment
    code: bool


class HelpHTMLParser(html.parser.HTMLParser):
    """Collect the text of every par_id/hd_id element of one help page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[_Open] = []
        self.segments: list[Segment] = []
        self._seen: dict[str, int] = {}
        self._parts: list[str] | None = None
        self._seg_id = ""
        self._seg_code = False
        self._seg_broken = False

    # -- helpers
    def _suppressed(self) -> bool:
        return bool(self.stack) and self.stack[-1].suppress

    def _in_code(self) -> bool:
        return bool(self.stack) and self.stack[-1].code

    def _close_to(self, index: int) -> None:
        while len(self.stack) > index:
            el = self.stack.pop()
            if el.segment:
                self._finish_segment()
            elif self._parts is not None and el.tag in BREAK_TAGS:
                self._parts.append(" ")

    def _finish_segment(self) -> None:
        assert self._parts is not None
        occurrence = self._seen.get(self._seg_id, 0)
        self._seen[self._seg_id] = occurrence + 1
        self.segments.append(Segment(key=(self._seg_id, occurrence),
                                     text=normalise("".join(self._parts)),
                                     is_code=self._seg_code, broken=self._seg_broken))
        self._parts = None

    # -- parser callbacks
    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        classes = set(a.get("class", "").split())
        if tag in CLOSES_P and self.stack and self.stack[-1].tag == "p":
            self._close_to(len(self.stack) - 1)
        parent = self.stack[-1] if self.stack else None
        suppress = self._suppressed() or tag in SKIP_TAGS
        # A case of a switch: <span hidden="true" class="MAC">...; the default
        # case is the child span without a class.
        if parent is not None and parent.is_switch and tag == "span" and "class" in a:
            suppress = True
        code = self._in_code() or tag in CODE_TAGS or bool(classes & CODE_CLASSES)
        if self._parts is not None and not suppress:
            if tag in BREAK_TAGS:
                self._parts.append(" ")
            if "bug" in classes:
                self._seg_broken = True
        if tag in VOID_TAGS:
            return
        seg_id = a.get("id", "")
        opens_segment = (self._parts is None and not suppress and "bug" not in classes
                         and bool(SEGMENT_ID.match(seg_id)))
        if opens_segment:
            self._parts = []
            self._seg_id = seg_id
            self._seg_code = code
            self._seg_broken = False
        self.stack.append(_Open(tag=tag, suppress=suppress,
                                is_switch=tag == "span" and bool(classes & {"switch", "switchinline"}),
                                segment=opens_segment, code=code))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID_TAGS and self.stack and self.stack[-1].tag == tag:
            self._close_to(len(self.stack) - 1)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i].tag == tag:
                self._close_to(i)
                return
        # stray end tag: ignore

    def handle_data(self, data: str) -> None:
        if self._parts is not None and not self._suppressed():
            self._parts.append(data)

    def close(self) -> None:
        super().close()
        self._close_to(0)


def parse_help_page(source: str) -> list[Segment]:
    parser = HelpHTMLParser()
    parser.feed(source)
    parser.close()
    return parser.segments


# --------------------------------------------------------------------------
# Sentence splitting
# --------------------------------------------------------------------------

ABBREVIATIONS = frozenset("""
e.g. i.e. etc. vs. approx. cf. incl. no. nos. fig. figs. mr. mrs. ms. dr. prof. st.
min. max. resp. esp. ca. vol. ch. sec. ref. ed. jan. feb. mar. apr. jun. jul. aug. sep.
sept. oct. nov. dec. inc. ltd. co. corp. ver. rev. pp. p. pt. pts. approx.
z.b. d.h. u.a. bzw. usw. ggf. evtl. inkl. bspw. abb. vgl. sog. nr. s. o. u. z.t. u.u.
o.ä. u.ä. zzgl. abs. bzgl. mind. ggü. str. tel. gem. eigtl. allg. einschl. entspr.
p.ex. ex. env. chap. éd. mme. mlle. qqch. hab. av. apr. j.-c.
""".split())
_BOUNDARY = re.compile(r"[.!?]+[\"'»”“’)\]]*\s+(?=[\"'«»„“‘(\[]?[0-9A-ZÀ-ÖØ-ÞĀ-Ž])")


def _protected(token: str) -> bool:
    """True if a sentence must not end after ``token`` (ends in [.!?])."""
    low = token.lower().lstrip("(\"'„“«‘[")
    if not low.endswith("."):
        return False  # ! and ? always end a sentence
    if low.endswith("..") or low.endswith("…"):
        return True  # ellipsis: often a menu entry ("Open...")
    if low in ABBREVIATIONS:
        return True
    core = low[:-1]
    if re.fullmatch(r"[^\W\d_]", core):  # single letter: initial, "z." of "z. B."
        return True
    if re.fullmatch(r"[0-9]+", core):  # "1." list number or German ordinal
        return True
    if re.fullmatch(r"(?:[^\W\d_]{1,2}\.)+[^\W\d_]{1,2}", core):  # e.g / z.B / d.h
        return True
    return False


def split_sentences(text: str) -> list[str]:
    """Split on ., ! or ? followed by whitespace and a capital letter/digit,
    except after abbreviations, single letters, numbers ("1.") and ellipses."""
    sentences: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        head = text[start:m.start() + len(m.group(0).rstrip())]
        # the token that ends before the boundary (including its punctuation)
        punct_end = m.start() + len(re.match(r"[.!?]+", m.group(0)).group(0))
        token = text[:punct_end].rsplit(None, 1)[-1]
        if _protected(token):
            continue
        sentences.append(head.strip())
        start = m.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


# --------------------------------------------------------------------------
# Corpus building
# --------------------------------------------------------------------------

_HAS_WORD = re.compile(r"[^\W_]")


def length_ratio_ok(src: str, tgt: str) -> bool:
    a, b = len(src.split()), len(tgt.split())
    return max(a, b) <= MAX_RATIO * min(a, b) + RATIO_ALLOWANCE


@dataclass
class Corpus:
    stats: dict = field(default_factory=dict)
    # pairs in order (file, src, tgt) after all pair filters, before dedup
    pairs: list[tuple[str, str, str]] = field(default_factory=list)


def build_corpus(src_files: dict[str, str], tgt_files: dict[str, str]) -> Corpus:
    st: dict[str, int] = {
        "files_src": len(src_files), "files_tgt": len(tgt_files),
        "files_common": 0, "segments_src": 0, "segments_tgt": 0,
        "segments_aligned": 0, "segments_src_only": 0, "segments_tgt_only": 0,
        "dropped_code": 0, "dropped_broken_embed": 0,
        "segments_kept": 0, "segments_split": 0,
        "pairs_after_sentence_split": 0,
        "dropped_empty": 0, "dropped_untranslated": 0, "dropped_length_ratio": 0,
        "pairs_after_filters": 0, "pairs_unique": 0,
    }
    corpus = Corpus(stats=st)
    for rel in sorted(set(src_files) & set(tgt_files)):
        st["files_common"] += 1
        src_segs = parse_help_page(src_files[rel])
        tgt_segs = {s.key: s for s in parse_help_page(tgt_files[rel])}
        st["segments_src"] += len(src_segs)
        st["segments_tgt"] += len(tgt_segs)
        matched = 0
        for s in src_segs:
            t = tgt_segs.get(s.key)
            if t is None:
                continue
            matched += 1
            if s.is_code or t.is_code:
                st["dropped_code"] += 1
                continue
            if s.broken or t.broken:
                st["dropped_broken_embed"] += 1
                continue
            st["segments_kept"] += 1
            ss, ts = split_sentences(s.text), split_sentences(t.text)
            if len(ss) > 1 and len(ss) == len(ts):
                st["segments_split"] += 1
                units = list(zip(ss, ts))
            else:
                units = [(s.text, t.text)]
            for a, b in units:
                st["pairs_after_sentence_split"] += 1
                if not _HAS_WORD.search(a) or not _HAS_WORD.search(b):
                    st["dropped_empty"] += 1
                elif a == b:
                    st["dropped_untranslated"] += 1
                elif not length_ratio_ok(a, b):
                    st["dropped_length_ratio"] += 1
                else:
                    corpus.pairs.append((rel, a, b))
        st["segments_aligned"] += matched
        st["segments_src_only"] += len(src_segs) - matched
        st["segments_tgt_only"] += len(tgt_segs) - matched
    for rel in set(src_files) ^ set(tgt_files):
        side = "src" if rel in src_files else "tgt"
        st[f"files_{side}_only"] = st.get(f"files_{side}_only", 0) + 1
    st["pairs_after_filters"] = len(corpus.pairs)
    st["pairs_unique"] = len({(a, b) for _, a, b in corpus.pairs})
    return corpus


def choose_heldout_files(pairs: list[tuple[str, str, str]], seed: int,
                         fraction: float = HELDOUT_FRACTION) -> tuple[list[str], list[str]]:
    """Pick whole files for valid and test, each holding about ``fraction``
    of the pairs.  Deterministic given the seed.

    The files are shuffled with ``random.Random(seed)``; each file in turn
    goes to whichever of valid/test is still below its target and has fewer
    pairs, provided that this does not overshoot the target by more than
    half (so no single large page dominates a held-out set)."""
    counts: dict[str, int] = {}
    for rel, _, _ in pairs:
        counts[rel] = counts.get(rel, 0) + 1
    files = sorted(counts)
    random.Random(seed).shuffle(files)
    target = max(1, round(fraction * len(pairs)))
    limit = target * (1 + MAX_HELDOUT_OVERSHOOT)
    chosen: list[list[str]] = [[], []]
    totals = [0, 0]
    for rel in files:
        open_sets = [i for i in (0, 1) if totals[i] < target]
        if not open_sets:
            break
        i = min(open_sets, key=lambda k: (totals[k], k))
        if totals[i] + counts[rel] <= limit:
            chosen[i].append(rel)
            totals[i] += counts[rel]
    if not chosen[0] or not chosen[1]:
        raise ExtractError(f"cannot choose whole files for valid and test: {len(pairs)} pairs "
                           f"in {len(files)} files, target {target} pairs each; "
                           "try a larger --heldout-fraction")
    return sorted(chosen[0]), sorted(chosen[1])


def _dedup(pairs):
    seen = set()
    out = []
    for p in pairs:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def make_splits(corpus: Corpus, seed: int, fraction: float = HELDOUT_FRACTION,
                ) -> tuple[dict[str, list[tuple[str, str]]], dict]:
    valid_files, test_files = choose_heldout_files(corpus.pairs, seed, fraction)
    vset, tset = set(valid_files), set(test_files)
    raw = {"train": [], "valid": [], "test": []}
    for rel, a, b in corpus.pairs:
        split = "valid" if rel in vset else "test" if rel in tset else "train"
        raw[split].append((a, b))
    info: dict = {"valid_files": valid_files, "test_files": test_files}
    splits = {name: _dedup(p) for name, p in raw.items()}
    for name in splits:
        info[f"{name}_pairs_before_dedup"] = len(raw[name])
        info[f"{name}_pairs_after_dedup"] = len(splits[name])
    train_src = {a for a, _ in splits["train"]}
    valid = [p for p in splits["valid"] if p[0] not in train_src]
    info["valid_dropped_src_in_train"] = len(splits["valid"]) - len(valid)
    valid_src = {a for a, _ in valid}
    test = [p for p in splits["test"] if p[0] not in train_src]
    info["test_dropped_src_in_train"] = len(splits["test"]) - len(test)
    test2 = [p for p in test if p[0] not in valid_src]
    info["test_dropped_src_in_valid"] = len(test) - len(test2)
    splits["valid"], splits["test"] = valid, test2
    for name in splits:
        info[f"{name}_pairs"] = len(splits[name])
    return splits, info


def shipped_subsets(splits, max_train_words: int, train_size: int, seed: int):
    def short(p, limit):
        return len(p[0].split()) <= limit and len(p[1].split()) <= limit

    train_ok = [p for p in splits["train"] if short(p, max_train_words)]
    if train_size and train_size < len(train_ok):
        idx = sorted(random.Random(seed).sample(range(len(train_ok)), train_size))
        train = [train_ok[i] for i in idx]
    else:
        train = train_ok
    info = {"train_pairs_within_max_words": len(train_ok)}
    out = {"train": train}
    for name in ("valid", "test"):
        out[name] = [p for p in splits[name] if short(p, MAX_EVAL_WORDS)]
        info[f"{name}_dropped_over_{MAX_EVAL_WORDS}_words"] = len(splits[name]) - len(out[name])
    return out, info


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

def notice_text(packages: list[HelpPackage]) -> str:
    pkg_lines = "\n".join(f"  - {p.package} {p.version} (sha256 {p.sha256})" for p in packages)
    return f"""\
LibreOffice help parallel text
==============================

The sentences in this directory are taken from the LibreOffice help
(https://help.libreoffice.org), Copyright (c) The Document Foundation and
the LibreOffice contributors (portions Copyright 2000, 2010 Oracle and/or its
affiliates; some material incorporates work licensed to the Apache Software
Foundation under the Apache License 2.0,
https://www.apache.org/licenses/LICENSE-2.0).

The text is licensed under the Mozilla Public License, v. 2.0 (MPL-2.0).
A copy of the licence is at https://mozilla.org/MPL/2.0/ (on Debian systems
also at /usr/share/common-licenses/MPL-2.0).

It was extracted from the Debian packages
{pkg_lines}
(Debian bookworm, source package "libreoffice",
https://packages.debian.org/source/bookworm/libreoffice).

These files are a derived, filtered subset of that text, produced by
{SCRIPT_NAME}: paragraphs aligned on their help ids, markup removed,
split into sentences, filtered and sampled. No sentence was edited otherwise.
"""


def write_dataset(out: Path, args, packages, stats: dict, shipped, full_train) -> None:
    src, tgt = args.src, args.tgt

    def write_files(tmp: Path) -> None:
        for name, pairs in shipped.items():
            write_gz_lines(tmp / f"{name}.{src}.gz", [a for a, _ in pairs])
            write_gz_lines(tmp / f"{name}.{tgt}.gz", [b for _, b in pairs])
        if full_train is not None:
            (tmp / "full").mkdir()
            write_gz_lines(tmp / "full" / f"train.{src}.gz", [a for a, _ in full_train])
            write_gz_lines(tmp / "full" / f"train.{tgt}.gz", [b for _, b in full_train])

    publish_dataset(out, args.force, write_files, stats, notice_text(packages))


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="deepnmt-extract-libreoffice-help", formatter_class=HelpFormatter,
        description="Extract a sentence-aligned parallel corpus from the LibreOffice "
                    "help shipped in the Debian libreoffice-help-* packages.",
        epilog="Example: %(prog)s --src en --tgt de --out data/libreoffice-help/en-de "
               "--download")
    ap.add_argument("--src", default="en", help="source language (default: en)")
    ap.add_argument("--tgt", default="de", help="target language, e.g. de or fr (default: de)")
    ap.add_argument("--out", "--output", dest="out", required=True, type=Path, help="output directory (must not exist)")
    add_deb_source_args(
        ap, "directory with the already downloaded libreoffice-help-*.deb files")
    ap.add_argument("--max-train-words", type=int, default=30,
                    help="shipped train: at most this many words per side (default: 30)")
    ap.add_argument("--train-size", type=int, default=18000,
                    help="shipped train: seeded sample of this many pairs; 0 = all (default: 18000)")
    ap.add_argument("--seed", type=int, default=1,
                    help="seed for the valid/test file choice and the train sample (default: 1)")
    ap.add_argument("--heldout-fraction", type=float, default=HELDOUT_FRACTION,
                    help="fraction of the pairs (whole files) for valid and for test each "
                         f"(default: {HELDOUT_FRACTION})")
    ap.add_argument("--full", action="store_true",
                    help="also write the complete, unsampled train split to OUT/full/")
    ap.add_argument("--force", action="store_true", help="replace an existing output directory")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.src == args.tgt:
        ap.error("--src and --tgt must differ")
    if args.max_train_words < 1 or args.train_size < 0:
        ap.error("--max-train-words must be >= 1 and --train-size >= 0")
    if not 0 < args.heldout_fraction < 0.5:
        ap.error("--heldout-fraction must be in (0, 0.5)")
    return args


def run(args: argparse.Namespace) -> dict:
    out = checked_out_dir(args)
    with tempfile.TemporaryDirectory(prefix="lo-help-debs-") as dl:
        debdir = deb_dir(args, dl, lambda d: download_debs([args.src, args.tgt], d))
        src_pkg = read_help_deb(find_deb(debdir, args.src), args.src)
        tgt_pkg = read_help_deb(find_deb(debdir, args.tgt), args.tgt)
    corpus = build_corpus(src_pkg.files, tgt_pkg.files)
    splits, split_info = make_splits(corpus, args.seed, args.heldout_fraction)
    shipped, ship_info = shipped_subsets(splits, args.max_train_words, args.train_size, args.seed)
    stats = {
        "languages": {"src": args.src, "tgt": args.tgt},
        "packages": [package_entry(p) for p in (src_pkg, tgt_pkg)],
        "settings": {"seed": args.seed, "max_train_words": args.max_train_words,
                     "train_size": args.train_size, "max_eval_words": MAX_EVAL_WORDS,
                     "length_ratio": f"keep iff max_words <= {MAX_RATIO:g} * min_words "
                                     f"+ {RATIO_ALLOWANCE}",
                     "heldout_fraction": args.heldout_fraction},
        "extraction": corpus.stats,
        "splits": {k: v for k, v in split_info.items() if not k.endswith("_files")},
        "heldout_files": {"valid": split_info["valid_files"], "test": split_info["test_files"]},
        "shipped": {**{f"{k}_pairs": len(v) for k, v in shipped.items()}, **ship_info},
        "generated_by": SCRIPT_NAME,
    }
    write_dataset(out, args, [src_pkg, tgt_pkg], stats, shipped,
                  splits["train"] if args.full else None)
    return stats


def main(argv=None) -> int:
    args = parse_args(argv)
    stats = run_reporting_errors(run, args)
    if stats is None:
        return 1
    ex, sp, sh = stats["extraction"], stats["splits"], stats["shipped"]
    print(f"aligned segments: {ex['segments_aligned']}, pairs after filters: "
          f"{ex['pairs_after_filters']} (unique {ex['pairs_unique']})")
    print(f"splits: train {sp['train_pairs']}, valid {sp['valid_pairs']}, test {sp['test_pairs']}")
    print(f"shipped: train {sh['train_pairs']}, valid {sh['valid_pairs']}, "
          f"test {sh['test_pairs']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
