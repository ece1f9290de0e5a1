"""Reading the corpora's text formats (IWSLT ``train.tags``, IWSLT ``.xml`` / WMT ``.sgm``,
plain text) into one sentence a line, and Moses' clean-corpus-n rule."""

from __future__ import annotations

import re

from .common import DataPrepError

_META_TAGS = ("url", "keywords", "speaker", "talkid", "reviewer", "translator", "doc")
_META_RE = re.compile(r"^<\s*/?\s*(?:%s)\b" % "|".join(_META_TAGS), re.I)
_TITLE_RE = re.compile(r"</?\s*(?:title|description)\s*>", re.I)
_SEG_RE = re.compile(r"<seg\b([^>]*)>(.*?)</seg\s*>", re.I)
_SEG_OPEN_RE = re.compile(r"<seg\b", re.I)
_ID_RE = re.compile(r"""\bid\s*=\s*["']?([^"'\s>]*)""", re.I)


def norm_ws(s: str) -> str:
    """Unify whitespace: every run of (Unicode) whitespace becomes one space, none at the ends."""
    return " ".join(s.split())


def decoded_lines(binary_lines, label: str, stats: dict, allow_invalid: bool):
    """Yield (line number, text) from an iterable of byte lines split on b'\\n' only.

    Only '\\n' ends a line (a stray '\\r' or U+2028 inside a sentence must not break the
    alignment of the two sides, as Python's universal newlines would).  Invalid UTF-8 is an
    error naming the file and line, unless ``allow_invalid`` (then U+FFFD, counted)."""
    for n, raw in enumerate(binary_lines, 1):
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if not allow_invalid:
                ctx = raw[max(0, e.start - 20): e.start + 20]
                raise DataPrepError(
                    f"{label}: invalid UTF-8 at line {n}, byte {e.start} of the line ({ctx!r}). The file is damaged "
                    "or not UTF-8: download it again, or pass --allow-invalid-utf8 to replace undecodable bytes "
                    "with U+FFFD") from None
            s = raw.decode("utf-8", errors="replace")
            stats["invalid_utf8_lines"] = stats.get("invalid_utf8_lines", 0) + 1
        if n == 1 and s.startswith("\ufeff"):
            s = s[1:]
        yield n, s.rstrip("\n")


def parse_text(lines, label, stats):
    for _, s in lines:
        yield norm_ws(s)


def parse_tags(lines, label, stats):
    """IWSLT ``train.tags.x-y.l``: one talk after the other, metadata in tag lines.

    Lines starting with the tags <url>, <keywords>, <speaker>, <talkid>, <reviewer>,
    <translator>, <doc>/</doc> are dropped; <title>/<description> lines keep their text
    without the tags, as fairseq's prepare-iwslt14.sh and prepare-iwslt17-multilingual.sh do
    (the papers' 160k/236k counts include them).  Every other line is a sentence."""
    dropped = 0
    for _, s in lines:
        st = s.strip()
        if st.startswith("<") and _META_RE.match(st):
            dropped += 1
            continue
        yield norm_ws(_TITLE_RE.sub(" ", s))
    stats["metadata_lines_dropped"] = stats.get("metadata_lines_dropped", 0) + dropped


def parse_segs(lines, label, stats, ids: list):
    """IWSLT .xml / WMT .sgm: the text of every ``<seg ...>text</seg>``, in file order.

    The text is kept as it is (whitespace unified, entities untouched), as sacrebleu reads
    these files, so ``raw/test.<lang>`` is the reference sacreBLEU expects."""
    for n, s in lines:
        if not _SEG_OPEN_RE.search(s):
            continue
        segs = _SEG_RE.findall(s)
        if len(segs) != len(_SEG_OPEN_RE.findall(s)):
            raise DataPrepError(f"{label}: line {n} has a <seg> without its </seg> on the same line: {s[:200]!r}")
        for attrs, text in segs:
            m = _ID_RE.search(attrs)
            ids.append(m.group(1) if m else "")
            yield norm_ws(text)


def clean_reason(a: str, b: str, lo: int, hi: int, ratio: float, max_word: int = 1000):
    """Moses clean-corpus-n.perl: None if the pair is kept, else why it is dropped.

    Kept iff both sides have lo..hi whitespace tokens, neither side is more than ``ratio``
    times longer than the other, and no token is longer than 1000 characters.  (The Perl
    script also deletes '|' characters, a factored-corpus convention; fairseq's data keep
    them, escaped by the Moses tokenizer, and so do we.)"""
    wa, wb = a.split(), b.split()
    if not wa or not wb:
        return "empty"
    na, nb = len(wa), len(wb)
    if na > hi or nb > hi or na < lo or nb < lo:
        return "length"
    if na / nb > ratio or nb / na > ratio:
        return "ratio"
    if max(map(len, wa)) > max_word or max(map(len, wb)) > max_word:
        return "long_word"
    return None
