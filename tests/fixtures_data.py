"""Tiny archives in the real formats of the IWSLT (WIT3) and WMT (statmt.org) releases.

Used by tests/test_prepare_data.py to run scripts/prepare_data.py offline (``--from-dir``).
The sentences are already "Moses-stable" (punctuation separated by spaces) so the tests can
predict the tokenized text exactly; each carries a marker naming where it comes from, so a
test can check that valid/test were taken from the right files and in the right order.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

# ----------------------------------------------------------------------------- archives


def write_tar(path: Path, members: dict, mode: str = "w:gz") -> Path:
    """``members``: archive path -> bytes or str.  Directories are implied by the paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as tar:
        dirs = sorted({str(Path(n).parent) for n in members if str(Path(n).parent) != "."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for name, data in members.items():
            b = data.encode("utf-8") if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(b)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(b))
    return path


def truncate(path: Path, fraction: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


# ----------------------------------------------------------------------------- IWSLT
IWSLT14_SETS = ["TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012"]
IWSLT17_SETS = ["TED.dev2010", "TED.tst2010", "TED.tst2011", "TED.tst2012", "TED.tst2013", "TED.tst2014",
                "TED.tst2015"]
WORDS = {"de": ("Das ist Satz", "von Vortrag"), "en": ("This is sentence", "of talk"),
         "fr": ("Voici la phrase", "du discours")}
LONG = 180          # tokens: above IWSLT's 175-token limit


def iwslt_talks(n_talks: int = 2, per_talk: int = 30, src: str = "de", tgt: str = "en"):
    """Talks as lists of (src, tgt, kind) content lines; kind 'ok', 'title', 'desc', 'ratio', 'long'.

    Talk 0, sentence 5 has a length ratio > 1.5 and talk 1, sentence 7 is longer than 175
    tokens: clean-corpus drops both.  Header lines are added by :func:`iwslt_train_tags`."""
    talks = []
    for k in range(n_talks):
        lines = [(f"Anna Muster {k} : Ein Vortrag", f"Anna Muster {k} : A Talk", "title"),
                 (f"TED Talk Untertitel {k} .", f"TED Talk Subtitles {k} .", "desc")]
        for i in range(per_talk):
            a = f"{WORDS[src][0]} {i} {WORDS[src][1]} {k} ."
            b = f"{WORDS[tgt][0]} {i} {WORDS[tgt][1]} {k} ."
            kind = "ok"
            if k == 0 and i == 5:
                a, kind = f"Ja {i} .", "ratio"
            if k == 1 and i == 7:
                a, b, kind = " ".join(["Wort"] * LONG), " ".join(["word"] * LONG), "long"
            lines.append((a, b, kind))
        talks.append(lines)
    return talks


def iwslt_train_tags(talks, side: int, year: int) -> str:
    """The ``train.tags.x-y.l`` format: metadata tag lines around each talk's text."""
    out = []
    for k, lines in enumerate(talks):
        if year >= 17:
            out.append(f'<doc docid="{k + 100}" genre="lectures">')
        out.append(f"<url>http://www.ted.com/talks/talk_{k}.html</url>")
        out.append("<keywords>talks, TED Conference, science</keywords>")
        if year >= 17:
            out.append("<speaker>Anna Muster</speaker>")
        out.append(f"<talkid>{k + 100}</talkid>")
        for a, b, kind in lines:
            text = (a, b)[side]
            if kind == "title":
                out.append(f"<title>{text}</title>")
            elif kind == "desc":
                out.append(f"<description>{text}</description>")
            else:
                out.append(text)
        if year >= 17:
            out.append('<reviewer href="http://www.ted.com/profiles/1">Rita Review</reviewer>')
            out.append('<translator href="http://www.ted.com/profiles/2">Tom Trans</translator>')
            out.append("</doc>")
    return "\n".join(out) + "\n"


def iwslt_set_segments(set_name: str, lang: str, n: int = 3):
    """Segments of one dev/test set; the set name is in every segment."""
    tag = set_name.replace(".", " ")
    segs = [f"{WORDS[lang][0]} {i} {tag} ." for i in range(n)]
    segs[1] = segs[1].replace(" .", " \u2019 .")     # U+2019 -> ' as fairseq's recipe does
    return segs


def iwslt_xml(set_id: str, lang: str, segs, other: str, source: bool) -> str:
    head = (f'<srcset setid="{set_id}" srclang="{lang}">' if source
            else f'<refset setid="{set_id}" srclang="{other}" trglang="{lang}" refid="ref">')
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", head,
             '<doc docid="535" genre="lectures">', "<url>http://www.ted.com/talks/x.html</url>",
             "<description>TED Talk Subtitles and Transcript: nothing to keep</description>",
             "<keywords>talks, science</keywords>", "<talkid>535</talkid>", "<title>A title to drop</title>"]
    for i, s in enumerate(segs, 1):
        lines.append(f'<seg id="{i}"> {s} </seg>')
    lines += ["</doc>", "</srcset>" if source else "</refset>", "</mteval>"]
    return "\n".join(lines) + "\n"


def make_iwslt(dest: Path, year: int = 14, src: str = "de", tgt: str = "en", *, drop_line: str | None = None,
               empty: str | None = None, bad_utf8: str | None = None, omit: str | None = None,
               n_talks: int = 2, per_talk: int = 30) -> dict:
    """Write ``de-en.tgz`` (year 14) or ``en-fr.tgz`` (year 17) into ``dest``.

    Error variants: ``drop_line=lang`` removes the last sentence of that side's train.tags,
    ``empty=lang`` makes it empty, ``bad_utf8=lang`` puts an invalid byte into its 4th line,
    ``omit=member basename`` leaves a member out.  Returns what a test needs to predict the output."""
    pair = f"{src}-{tgt}"
    sets = IWSLT14_SETS if year == 14 else IWSLT17_SETS
    talks = iwslt_talks(n_talks, per_talk, src, tgt)
    members = {f"{pair}/README": "IWSLT fixture\n", f"{pair}/train.{tgt}": "monolingual , not used .\n"}
    for side, lang in enumerate((src, tgt)):
        text = iwslt_train_tags(talks, side, year)
        data = text.encode("utf-8")
        if drop_line == lang:
            lines = text.splitlines(keepends=True)
            last = max(i for i, ln in enumerate(lines) if not ln.startswith("<"))
            data = "".join(lines[:last] + lines[last + 1:]).encode("utf-8")
        if empty == lang:
            data = b""
        if bad_utf8 == lang:
            lines = data.split(b"\n")
            lines[3] = lines[3] + b" \xff\xfe broken"
            data = b"\n".join(lines)
        members[f"{pair}/train.tags.{pair}.{lang}"] = data
    test = {}
    for s in sets:
        test[s] = {lang: iwslt_set_segments(s, lang) for lang in (src, tgt)}
        for lang, other in ((src, tgt), (tgt, src)):
            name = f"IWSLT{year}.{s}.{pair}.{lang}.xml"
            members[f"{pair}/{name}"] = iwslt_xml(f"iwslt20{year}-{s}", lang, test[s][lang], other, lang == src)
    if omit:
        members = {k: v for k, v in members.items() if not k.endswith("/" + omit)}
    archive = write_tar(dest / f"{pair}.tgz", members)
    content = [(a, b, kind) for t in talks for a, b, kind in t]
    return {"archive": archive, "content": content, "test": test, "sets": sets}


# ----------------------------------------------------------------------------- WMT
def sgm(set_id: str, lang: str, segs, docs: int = 2) -> str:
    """WMT 'fake SGML': <doc> blocks with <p>/<hl> and one <seg id=..> per line."""
    lines = [f'<srcset setid="{set_id}" srclang="any">']
    per = -(-len(segs) // docs)
    sid = 0
    for d in range(docs):
        lines.append(f'<doc sysid="ref" docid="doc{d}" genre="news" origlang="en">')
        lines.append("<hl>" if d == 0 else "<p>")
        for s in segs[d * per:(d + 1) * per]:
            sid += 1
            lines.append(f'<seg id="{sid}">{s}</seg>')
        lines.append("</hl>" if d == 0 else "</p>")
        lines.append("</doc>")
    lines.append("</srcset>")
    return "\n".join(lines) + "\n"


WMT_TRAIN = {"en": "Item {i} : the red house from {c} .", "de": "Item {i} : das rote Haus aus {c} .",
             "fr": "Item {i} : la maison rouge de {c} .", "cs": "Item {i} : ten červený dům z {c} ."}


def wmt_corpus(name: str, x: str, n: int):
    """(en, x) pairs; for x = de, special lines test the WMT processing:
    a hyphen compound (aggressive dash splits), typographic quotes (normalize-punctuation),
    a zero-width space (remove-non-printing-char), a carriage return inside a line, a
    length-ratio outlier and a pair longer than 250 tokens (both dropped by cleaning)."""
    pairs = [(WMT_TRAIN["en"].format(i=i, c=name), WMT_TRAIN[x].format(i=i, c=name)) for i in range(n)]
    if x == "de":
        if name == "europarl":
            pairs[1] = ("a state-of-the-art house from europarl .", "ein hochmodernes Haus aus europarl .")
            pairs[2] = ("he said \u201cyes\u201d .", "er sagte \u201eja\u201c .")
            pairs[3] = ("the red\u200b house .", "das rote\u200b Haus .")
        if name == "commoncrawl":
            pairs[4] = ("Yes .", "Ja , natürlich , das ist ein sehr sehr langer Satz aus commoncrawl .")
            pairs[6] = ("a line\rwith a carriage return .", "eine Zeile\rmit Wagenrücklauf .")
        if name == "nc":
            pairs[5] = (" ".join(["word"] * 260), " ".join(["Wort"] * 260))
    return pairs


def _both(members: dict, prefix: str, x: str, pairs) -> None:
    members[prefix + ".en"] = "\n".join(p[0] for p in pairs) + "\n"
    members[prefix + "." + x] = "\n".join(p[1] for p in pairs) + "\n"


def make_wmt(dest: Path, langs=("de",), n: int = 20) -> dict:
    """The statmt.org archives for the pairs x-en, x in ``langs`` (plain-text training
    corpora, .sgm test sets), as the real ones: one Europarl/Common Crawl archive for all
    pairs, News Commentary v9 (de, fr) or v10 (cs), UN + giga-fren (fr), WMT12/13 test
    (multi-parallel newstestYYYY-src.<l>.sgm), WMT14 test-full, WMT15/16 test.  Decoys (the
    other direction's src/ref files) have different text.  Returns the expected texts."""
    info = {"archives": {}, "train": {}, "valid": {}, "test": {}}
    euro, cc, nc9, nc10 = {}, {"commoncrawl.de-en.annotation": "x\n" * n}, {}, {}
    for x in langs:
        corp = {c: wmt_corpus(c, x, n) for c in ("europarl", "commoncrawl", "nc")}
        _both(euro, f"training/europarl-v7.{x}-en", x, corp["europarl"])
        _both(cc, f"commoncrawl.{x}-en", x, corp["commoncrawl"])
        if x == "cs":
            _both(nc10, "news-commentary-v10/news-commentary-v10.cs-en", x, corp["nc"])
        else:
            _both(nc9, f"training/news-commentary-v9.{x}-en", x, corp["nc"])
        info["train"][x] = corp["europarl"] + corp["commoncrawl"] + corp["nc"]
    A = info["archives"]
    A["europarl"] = write_tar(dest / "training-parallel-europarl-v7.tgz", euro)
    A["commoncrawl"] = write_tar(dest / "training-parallel-commoncrawl.tgz", cc)
    if nc9:
        A["nc9"] = write_tar(dest / "training-parallel-nc-v9.tgz", nc9)
    if nc10:
        A["nc10"] = write_tar(dest / "training-parallel-nc-v10.tgz", nc10)
    if "fr" in langs:
        un = {}
        _both(un, "un/undoc.2000.fr-en", "fr", [(f"un {i} en .", f"un {i} fr .") for i in range(4)])
        un["un/undoc.2000.es-en.es"] = "decoy\n"
        A["un"] = write_tar(dest / "training-parallel-un.tgz", un)
        A["giga"] = make_giga_fren(dest)["archive"]
    ml = ("en", *langs)
    for year, n_seg in ((2012, 4), (2013, 6)):
        segs = {lang: [f"nt{year % 100} {lang} sentence {i} is here ." for i in range(n_seg)] for lang in ml}
        info["valid"][year] = segs
        A[f"wmt{year % 100}"] = write_tar(dest / f"wmt{year % 100}-test.tgz", {
            f"test/newstest{year}-src.{lang}.sgm": sgm(f"newstest{year}", lang, s) for lang, s in segs.items()})
    full = {}
    for x in langs:
        if x == "cs":
            continue
        src = [f"nt14 src en {i} : a well-known fact ." for i in range(5)]
        ref = [f"nt14 ref {x} {i} : eine \u201eTatsache\u201c ." for i in range(5)]
        src[2] = "nt14 src en 2 : it\u2019s here ."
        info["test"][x] = {"en": src, x: ref}
        p = f"{x}en"
        full[f"test-full/newstest2014-{p}-src.en.sgm"] = sgm("newstest2014", "en", src)
        full[f"test-full/newstest2014-{p}-ref.{x}.sgm"] = sgm("newstest2014", x, ref)
        full[f"test-full/newstest2014-{p}-src.{x}.sgm"] = sgm("newstest2014", x, [f"DECOY {x} {i} ." for i in range(5)])
        full[f"test-full/newstest2014-{p}-ref.en.sgm"] = sgm("newstest2014", "en", [f"DECOY en {i} ." for i in range(5)])
    A["test-full"] = write_tar(dest / "test-full.tgz", full)
    if "cs" in langs:
        cs = {"cs": [f"nt15 src cs {i} ." for i in range(4)], "en": [f"nt15 ref en {i} ." for i in range(4)]}
        info["test"]["cs"] = cs
        A["wmt15"] = write_tar(dest / "wmt15-test.tgz", {
            "test/newstest2015-csen-src.cs.sgm": sgm("newstest2015", "cs", cs["cs"]),
            "test/newstest2015-csen-ref.en.sgm": sgm("newstest2015", "en", cs["en"]),
            "test/newstest2015-encs-src.en.sgm": sgm("newstest2015", "en", ["DECOY ."] * 4)})
    if "de" in langs:
        nt16 = {"en": [f"nt16 src en {i} ." for i in range(3)], "de": [f"nt16 ref de {i} ." for i in range(3)]}
        info["valid"][2016] = nt16
        A["wmt16"] = write_tar(dest / "wmt16-test.tgz", {
            "test/newstest2016-ende-src.en.sgm": sgm("newstest2016", "en", nt16["en"]),
            "test/newstest2016-ende-ref.de.sgm": sgm("newstest2016", "de", nt16["de"])})
    return info


def make_giga_fren(dest: Path, n: int = 5) -> dict:
    """``training-giga-fren.tar`` (an uncompressed tar holding gzip'ed members)."""
    import gzip
    en = "\n".join(f"giga {i} en ." for i in range(n)) + "\n"
    fr = "\n".join(f"giga {i} fr ." for i in range(n)) + "\n"
    members = {"giga-fren.release2.fixed.en.gz": gzip.compress(en.encode(), mtime=0),
               "giga-fren.release2.fixed.fr.gz": gzip.compress(fr.encode(), mtime=0)}
    return {"archive": write_tar(dest / "training-giga-fren.tar", members, mode="w"), "n": n}
