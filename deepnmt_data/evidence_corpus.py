#!/usr/bin/env python3
"""Build the evidence-study (GPU preset) en-de corpus from Debian packages.

Two human-translated sources, both read straight from the Debian .deb files:

(a) the LibreOffice help (``libreoffice-help-en-us`` / ``libreoffice-help-de``),
    aligned on paragraph ids by the pipeline of
    :mod:`deepnmt_data.libreoffice_help` (imported, not copied), at all
    lengths: no 30-word cap and no sampling;
(b) the GIMP help (``gimp-help-en`` / ``gimp-help-de``): DocBook-generated
    HTML under ``usr/share/gimp/2.0/help/<lang>/`` with the same file names in
    every language but no shared paragraph ids.  It is paired *by document
    structure*: each page is reduced to its sequence of block elements
    (headings, paragraphs, list items, table cells, terms, ...) and a page is
    used only if that sequence is identical in both languages; then block i of
    the English page pairs with block i of the German page.  Pages whose
    structure differs are dropped and counted (STATS.json,
    ``gimp.extraction.files_structure_mismatch``).  Navigation bars, the
    table of contents, "report a bug" links, index terms and code
    (``pre``/``code``/``programlisting``/``screen``...) are skipped.

The LibreOffice part is split into sentences where both sides split into the
same number of sentences (as in the bundled corpus); the GIMP part is kept as
whole blocks (its German text is a freer translation, and equal sentence
counts inside a block often pair unrelated sentences).  Both then go through
the same pair filters (drop empty / untranslated / extreme length ratio).  Valid
and test are whole documents, chosen per source with the LibreOffice script's
seeded whole-file chooser (about 3 % of each source's pairs each), then
merged.  Exact duplicate pairs are removed within each split; valid/test pairs
whose English side occurs in train, and test pairs whose English side occurs
in valid, are removed.  Lines over 200 words (either side) are dropped from
every split (none in the current packages' LibreOffice part).

Output OUT/{train,valid,test}.{en,de}.gz (gzip mtime 0, fixed order: byte-for-
byte reproducible), STATS.json (counts per source and stage, package versions,
sha256 of the .deb files and of the outputs) and NOTICE (MPL-2.0 for the
LibreOffice part, GFDL-1.2+ for the GIMP part, quoting the copyright file of
``gimp-help-common``, which the language packages link their doc directory
to).  Written into a temporary directory and renamed into place; an existing
output is only replaced with ``--force``.

Standard library only.  Example (``deepnmt-build-evidence-corpus`` is the same command)::

    python scripts/build_evidence_corpus.py --download
    # or, with the five .deb files in DIR:
    python scripts/build_evidence_corpus.py --debs DIR
"""

from __future__ import annotations

import argparse
import html.parser
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from deepnmt_deploy.help_format import HelpFormatter
from . import debs
from . import libreoffice_help as lo
from .debs import DebFiles, find_pkg_deb, read_deb_files

# what STATS.json and NOTICE name as the producer
SCRIPT_NAME = "scripts/build_evidence_corpus.py"
DEFAULT_OUT = Path("work/evidence-corpus/en-de")

SRC, TGT = "en", "de"
LO_PACKAGES = {SRC: "libreoffice-help-en-us", TGT: "libreoffice-help-de"}
GIMP_PACKAGES = {SRC: "gimp-help-en", TGT: "gimp-help-de"}
GIMP_COMMON = "gimp-help-common"  # holds the copyright file of gimp-help-*
ALL_PACKAGES = [LO_PACKAGES[SRC], LO_PACKAGES[TGT], GIMP_PACKAGES[SRC], GIMP_PACKAGES[TGT],
                GIMP_COMMON]
MAX_WORDS = lo.MAX_EVAL_WORDS  # 200, every split


def progress(msg: str) -> None:
    print(f"[evidence-corpus] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# .deb reading (GIMP help; the LibreOffice help uses lo.read_help_deb)
# --------------------------------------------------------------------------

def gimp_help_prefix(lang: str) -> str:
    return f"usr/share/gimp/2.0/help/{lang}/"


def download(directory: Path) -> None:
    progress(f"apt-get download {' '.join(ALL_PACKAGES)}")
    debs.download_packages(ALL_PACKAGES, directory)


# --------------------------------------------------------------------------
# GIMP help: HTML -> block sequence
# --------------------------------------------------------------------------

# Elements that start a new block of text.  Their sequence (tag names, in
# document order) is the structure a page must share with its translation.
GIMP_BLOCK_TAGS = frozenset(
    "p h1 h2 h3 h4 h5 h6 li dt dd td th caption div table tr ul ol dl blockquote".split())
# Skipped with everything inside (not part of the structure either).
GIMP_SKIP_TAGS = frozenset("head script style pre code".split())
GIMP_SKIP_CLASSES = frozenset(
    "navheader navfooter toc reportbug indexterm programlisting screen synopsis "
    "literallayout".split())


@dataclass
class Block:
    tag: str
    text: str


class GimpHTMLParser(html.parser.HTMLParser):
    """Split a GIMP help page into blocks.

    Every start or end of a block element ends the current run of text; a run
    belongs to the innermost open block element.  ``structure`` is the list of
    block start tags in document order (outside skipped regions), ``blocks``
    the text runs with their block tag, including empty ones, so that block i
    of two pages with equal structure are translations of each other."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []  # (tag, skipped)
        self.structure: list[str] = []
        self.blocks: list[Block] = []
        self._parts: list[str] = []
        self._code = False

    def _skipped(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def _block_tag(self) -> str:
        for tag, _ in reversed(self.stack):
            if tag in GIMP_BLOCK_TAGS:
                return tag
        return "body"

    def _flush(self) -> None:
        self.blocks.append(Block(tag=self._block_tag(), text=lo.normalise("".join(self._parts))))
        self._parts = []

    def handle_starttag(self, tag, attrs) -> None:
        a = {k: (v or "") for k, v in attrs}
        skipped = (self._skipped() or tag in GIMP_SKIP_TAGS
                   or bool(set(a.get("class", "").split()) & GIMP_SKIP_CLASSES))
        if not skipped and tag in GIMP_BLOCK_TAGS:
            self._flush()
            self.structure.append(tag)
        if tag == "br" and not skipped:
            self._parts.append(" ")
        if tag in lo.VOID_TAGS:
            return
        self.stack.append((tag, skipped))

    def handle_startendtag(self, tag, attrs) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in lo.VOID_TAGS and self.stack and self.stack[-1][0] == tag:
            self.handle_endtag(tag)

    def handle_endtag(self, tag) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                closing_block = any(t in GIMP_BLOCK_TAGS and not s for t, s in self.stack[i:])
                if closing_block:
                    self._flush()
                del self.stack[i:]
                return

    def handle_data(self, data) -> None:
        if not self._skipped():
            self._parts.append(data)

    def close(self) -> None:
        super().close()
        self._flush()
        self.stack.clear()


def parse_gimp_page(source: str) -> tuple[list[str], list[Block]]:
    parser = GimpHTMLParser()
    parser.feed(source)
    parser.close()
    return parser.structure, parser.blocks


def filter_units(units, rel: str, st: dict, pairs: list) -> None:
    """The LibreOffice script's pair filters, applied to (src, tgt) units."""
    for a, b in units:
        st["pairs_before_filters"] += 1
        if not lo._HAS_WORD.search(a) or not lo._HAS_WORD.search(b):
            st["dropped_empty"] += 1
        elif a == b:
            st["dropped_untranslated"] += 1
        elif not lo.length_ratio_ok(a, b):
            st["dropped_length_ratio"] += 1
        else:
            pairs.append((rel, a, b))


def build_gimp_corpus(src_files: dict[str, str], tgt_files: dict[str, str]):
    """Pair the GIMP help pages by structure; returns lo.Corpus."""
    st = {
        "files_src": len(src_files), "files_tgt": len(tgt_files), "files_common": 0,
        "files_src_only": len(set(src_files) - set(tgt_files)),
        "files_tgt_only": len(set(tgt_files) - set(src_files)),
        "files_structure_match": 0, "files_structure_mismatch": 0,
        "blocks_in_mismatched_files_src": 0,
        "blocks_aligned": 0, "blocks_empty_both": 0, "blocks_empty_one_side": 0,
        "pairs_before_filters": 0,
        "dropped_empty": 0, "dropped_untranslated": 0, "dropped_length_ratio": 0,
        "pairs_after_filters": 0, "pairs_unique": 0,
    }
    mismatched: list[str] = []
    corpus = lo.Corpus(stats=st)
    for rel in sorted(set(src_files) & set(tgt_files)):
        st["files_common"] += 1
        s_struct, s_blocks = parse_gimp_page(src_files[rel])
        t_struct, t_blocks = parse_gimp_page(tgt_files[rel])
        if s_struct != t_struct or len(s_blocks) != len(t_blocks):
            st["files_structure_mismatch"] += 1
            st["blocks_in_mismatched_files_src"] += sum(1 for b in s_blocks if b.text)
            mismatched.append(rel)
            continue
        st["files_structure_match"] += 1
        for s, t in zip(s_blocks, t_blocks):
            if not s.text and not t.text:
                st["blocks_empty_both"] += 1
                continue
            if not s.text or not t.text:
                st["blocks_empty_one_side"] += 1
                continue
            st["blocks_aligned"] += 1
            # Whole blocks, no sentence split: the German GIMP help is a freer
            # translation than the LibreOffice help, and equal sentence counts
            # within a block often do not mean corresponding sentences.
            filter_units([(s.text, t.text)], rel, st, corpus.pairs)
    st["pairs_after_filters"] = len(corpus.pairs)
    st["pairs_unique"] = len({(a, b) for _, a, b in corpus.pairs})
    st["files_structure_mismatch_list"] = mismatched
    return corpus


# --------------------------------------------------------------------------
# Merging and splitting
# --------------------------------------------------------------------------

def make_merged_splits(corpora: dict[str, "lo.Corpus"], seed: int, fraction: float):
    """Whole documents per source to valid/test (lo.choose_heldout_files),
    merged; dedup within splits; valid/test English sides not in train, test
    English sides not in valid; lines over MAX_WORDS dropped.

    Returns ({split: [(source, en, de)]}, info)."""
    raw: dict[str, list[tuple[str, str, str]]] = {"train": [], "valid": [], "test": []}
    info: dict = {"heldout_files": {}}
    for source, corpus in corpora.items():
        valid_files, test_files = lo.choose_heldout_files(corpus.pairs, seed, fraction)
        info["heldout_files"][source] = {"valid": valid_files, "test": test_files}
        vset, tset = set(valid_files), set(test_files)
        for rel, a, b in corpus.pairs:
            split = "valid" if rel in vset else "test" if rel in tset else "train"
            raw[split].append((source, a, b))
    counts: dict = {}
    splits: dict[str, list[tuple[str, str, str]]] = {}
    for name, triples in raw.items():
        seen: set[tuple[str, str]] = set()
        out = []
        for t in triples:
            if t[1:] not in seen:
                seen.add(t[1:])
                out.append(t)
        splits[name] = out
        counts[f"{name}_pairs_before_dedup"] = len(triples)
        counts[f"{name}_pairs_after_dedup"] = len(out)
    train_src = {a for _, a, _ in splits["train"]}
    valid = [t for t in splits["valid"] if t[1] not in train_src]
    counts["valid_dropped_src_in_train"] = len(splits["valid"]) - len(valid)
    valid_src = {a for _, a, _ in valid}
    test = [t for t in splits["test"] if t[1] not in train_src]
    counts["test_dropped_src_in_train"] = len(splits["test"]) - len(test)
    test2 = [t for t in test if t[1] not in valid_src]
    counts["test_dropped_src_in_valid"] = len(test) - len(test2)
    splits["valid"], splits["test"] = valid, test2
    for name in list(splits):
        kept = [t for t in splits[name]
                if len(t[1].split()) <= MAX_WORDS and len(t[2].split()) <= MAX_WORDS]
        counts[f"{name}_dropped_over_{MAX_WORDS}_words"] = len(splits[name]) - len(kept)
        splits[name] = kept
    per_source = {src: {name: sum(1 for t in splits[name] if t[0] == src) for name in splits}
                  for src in corpora}
    info["counts"] = counts
    info["pairs"] = {name: len(v) for name, v in splits.items()}
    info["pairs_per_source"] = per_source
    return splits, info


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

def copyright_text(common: DebFiles | None) -> str:
    if common is None:
        return "(gimp-help-common not given: copyright file not read)\n"
    return common.files.get("gimp-help-common/copyright", "(no copyright file found)\n")


def notice_text(lo_pkgs, gimp_pkgs, common: DebFiles | None) -> str:
    def lines(pkgs):
        return "\n".join(f"  - {p.package} {p.version} (sha256 {p.sha256})" for p in pkgs)
    lo_notice = lo.notice_text(lo_pkgs)
    copyright_quoted = "\n".join("    " + ln if ln else "" for ln in
                                 copyright_text(common).rstrip("\n").splitlines())
    common_line = (f"  - {common.package} {common.version} (sha256 {common.sha256})\n"
                   if common is not None else "")
    return f"""\
Evidence-study corpus (GPU preset), English-German
===================================================

This corpus merges two sources.  Each line of train/valid/test comes from
exactly one of them; STATS.json counts the pairs per source.

Part 1 of 2
-----------

{lo_notice}
(For this corpus: no length cap on train and no sampling; produced by
{SCRIPT_NAME} through the functions of that script.)

Part 2 of 2: GIMP help parallel text
------------------------------------

The remaining sentences are taken from the GIMP user manual (GIMP help,
https://docs.gimp.org), by the GIMP Documentation Team.  Debian's copyright
file for it (usr/share/doc/gimp-help-common/copyright; the gimp-help-en and
gimp-help-de doc directories are links to it) says:

{copyright_quoted}

That is: GNU Free Documentation License, version 1.2 or any later version,
with no Invariant Sections, no Front-Cover Texts and no Back-Cover Texts
(GFDL-NIV-1.2+).  A copy of the licence is at
https://www.gnu.org/licenses/old-licenses/fdl-1.2.html (on Debian systems
also at /usr/share/common-licenses/GFDL-1.2).

It was extracted from the Debian packages
{lines(gimp_pkgs)}
{common_line}(Debian bookworm, source package "gimp-help",
https://packages.debian.org/source/bookworm/gimp-help).

These files are a derived, filtered subset (a modified version in the sense
of the GFDL) of that text, produced by {SCRIPT_NAME}: the English and German
pages paired by document structure (block i of a page with block i of its
translation, pages whose block structure differs dropped), markup removed
and filtered.  No sentence was edited otherwise.
"""


def write_output(out: Path, force: bool, splits, stats: dict, notice: str) -> None:
    """OUT/{train,valid,test}.{en,de}.gz, STATS.json and NOTICE, written and
    moved into place by the LibreOffice script's ``publish_dataset``."""
    def write_files(tmp: Path) -> None:
        for name, triples in splits.items():
            progress(f"writing {name}: {len(triples)} pairs")
            debs.write_gz_lines(tmp / f"{name}.{SRC}.gz", [a for _, a, _ in triples])
            debs.write_gz_lines(tmp / f"{name}.{TGT}.gz", [b for _, _, b in triples])

    debs.publish_dataset(out, force, write_files, stats, notice)


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="deepnmt-build-evidence-corpus", formatter_class=HelpFormatter,
        description="Build the en-de evidence-study (GPU preset) corpus: LibreOffice help "
                    "(all lengths) + GIMP help (paired by document structure) from the "
                    "Debian packages " + ", ".join(ALL_PACKAGES) + ".")
    ap.add_argument("--out", "--output", dest="out", type=Path, default=DEFAULT_OUT,
                    help=f"output directory (default: {DEFAULT_OUT})")
    debs.add_deb_source_args(
        ap, "directory with the downloaded .deb files (gimp-help-common "
            "is optional: without it NOTICE cannot quote the copyright file)")
    ap.add_argument("--seed", type=int, default=1,
                    help="seed for the choice of valid/test documents (default: 1)")
    ap.add_argument("--heldout-fraction", type=float, default=lo.HELDOUT_FRACTION,
                    help="fraction of each source's pairs (whole documents) for valid and "
                         f"for test each (default: {lo.HELDOUT_FRACTION})")
    ap.add_argument("--force", action="store_true", help="replace an existing output directory")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if not 0 < args.heldout_fraction < 0.5:
        ap.error("--heldout-fraction must be in (0, 0.5)")
    return args


def run(args: argparse.Namespace) -> dict:
    out = debs.checked_out_dir(args)
    with tempfile.TemporaryDirectory(prefix="evidence-debs-") as dl:
        debdir = debs.deb_dir(args, dl, download)
        progress("reading LibreOffice help packages")
        lo_pkgs = [lo.read_help_deb(find_pkg_deb(debdir, LO_PACKAGES[lang]), lang)
                   for lang in (SRC, TGT)]
        progress("reading GIMP help packages")
        gimp_pkgs = [read_deb_files(find_pkg_deb(debdir, GIMP_PACKAGES[lang]),
                                    gimp_help_prefix(lang), ".html") for lang in (SRC, TGT)]
        common_deb = sorted(debdir.glob(f"{GIMP_COMMON}_*.deb"))
        common = None
        if common_deb:
            common = read_deb_files(find_pkg_deb(debdir, GIMP_COMMON),
                                    "usr/share/doc/", "/copyright")
        else:
            progress(f"warning: no {GIMP_COMMON}_*.deb in {debdir}; NOTICE will not "
                     "quote the GIMP help copyright file")
    progress(f"aligning LibreOffice help ({len(lo_pkgs[0].files)} pages)")
    lo_corpus = lo.build_corpus(lo_pkgs[0].files, lo_pkgs[1].files)
    progress(f"  {lo_corpus.stats['pairs_after_filters']} pairs "
             f"({lo_corpus.stats['pairs_unique']} unique)")
    progress(f"pairing GIMP help by structure ({len(gimp_pkgs[0].files)} pages)")
    gimp_corpus = build_gimp_corpus(gimp_pkgs[0].files, gimp_pkgs[1].files)
    gs = gimp_corpus.stats
    progress(f"  {gs['files_structure_match']} pages match, {gs['files_structure_mismatch']} "
             f"dropped (structure differs); {gs['pairs_after_filters']} pairs "
             f"({gs['pairs_unique']} unique)")
    splits, info = make_merged_splits({"libreoffice": lo_corpus, "gimp": gimp_corpus},
                                      args.seed, args.heldout_fraction)
    pkg_entries = [debs.package_entry(p)
                   for p in [*lo_pkgs, *gimp_pkgs, *([common] if common else [])]]
    stats = {
        "languages": {"src": SRC, "tgt": TGT},
        "packages": pkg_entries,
        "settings": {"seed": args.seed, "heldout_fraction": args.heldout_fraction,
                     "max_words_all_splits": MAX_WORDS, "train_length_cap": None,
                     "length_ratio": f"keep iff max_words <= {lo.MAX_RATIO:g} * min_words "
                                     f"+ {lo.RATIO_ALLOWANCE}",
                     "gimp_unit": "whole block (no sentence split)",
                     "libreoffice_unit": "sentence where both sides split equally, "
                                         "else whole paragraph",
                     "gimp_block_tags": sorted(GIMP_BLOCK_TAGS),
                     "gimp_skipped_tags": sorted(GIMP_SKIP_TAGS),
                     "gimp_skipped_classes": sorted(GIMP_SKIP_CLASSES)},
        "extraction": {"libreoffice": lo_corpus.stats, "gimp": gimp_corpus.stats},
        "splits": info["counts"],
        "pairs": info["pairs"],
        "pairs_per_source": info["pairs_per_source"],
        "heldout_files": info["heldout_files"],
        "generated_by": SCRIPT_NAME,
    }
    write_output(out, args.force, splits, stats,
                 notice_text(lo_pkgs, gimp_pkgs, common))
    return stats


def main(argv=None) -> int:
    args = parse_args(argv)
    stats = debs.run_reporting_errors(run, args)
    if stats is None:
        return 1
    pp = stats["pairs_per_source"]
    for name in ("train", "valid", "test"):
        print(f"{name}: {stats['pairs'][name]} pairs (libreoffice {pp['libreoffice'][name]}, "
              f"gimp {pp['gimp'][name]})")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
