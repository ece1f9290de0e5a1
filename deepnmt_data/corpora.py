"""Registry of the corpora used to reproduce the papers' tables (standard library only).

Read by ``deepnmt-prepare-data`` (:mod:`deepnmt_data.prepare`, ``scripts/prepare_data.py``)
and by the experiment registry (``deepnmt_fairseq.repro.spec.DATASETS``);
the corpus names are a contract with the training commands (``$DATA_ROOT/<name>/bin`` is
what they train on).  Every entry says where the
archives come from, which members are read, and how the text is processed; the papers'
own sizes are kept next to them so that a finished run can be compared with them.

Sources of the facts used here
------------------------------
* MSC = Wei et al. 2020, Sec. 4.1 (IWSLT14 En<->De, IWSLT17 En->Fr, WMT14 En->De 32k);
  DD = the deep-decoder paper, Sec. 4.1 (WMT14 En->De / En->Fr, 40k, valid nt2012+nt2013);
  TA = Bapna et al. 2018, Sec. 4 (WMT15 Cs->En, 32k, valid nt2013, test nt2015);
  GPKD = Li et al. 2021, Sec. "Datasets" (the 4.5M En-De set, 32k, valid nt2016, test nt2014).
* Recipes: fairseq's ``examples/translation/prepare-iwslt14.sh``, ``prepare-wmt14en2de.sh``
  (``--icml17``: News Commentary v9) and ``prepare-wmt14en2fr.sh``.
* Checksums: no SHA-256 of these archives is known to us for certain, so none is given
  (the SHA-256 of what was actually used is written to ``$DATA_ROOT/<name>/SOURCES.json``).
  Where sacrebleu 2.6.0's dataset registry lists an MD5 for the very same URL, it is given
  here and verified.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

SACREBLEU_MD5 = "MD5 from sacrebleu 2.6.0's dataset registry (same URL)"
TORCHTEXT_MD5 = "MD5 from torchtext's CNNDM dataset (same archive)"


def fingerprint(recipe) -> str:
    """Hash of every field of a recipe that changes the output (not the URLs or descriptions)."""
    keep = asdict(recipe)
    for k in ("title", "papers", "paper_sizes", "expected", "notes"):
        keep.pop(k)
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Archive:
    """One downloadable archive.

    ``filename`` is the name used in the download cache and looked for first in
    ``--from-dir``; ``also_named`` are other names accepted there (e.g. the name the
    server gives it).  ``sha256``/``md5`` are ``None`` where no checksum is known.
    """

    key: str
    filename: str
    urls: tuple
    description: str
    also_named: tuple = ()
    sha256: str | None = None
    md5: str | None = None
    checksum_source: str = "none known: the SHA-256 of the file used is recorded in SOURCES.json"


@dataclass(frozen=True)
class Part:
    """A parallel text inside an archive: one member per language.

    ``fmt``: ``tags`` (IWSLT ``train.tags.*``: metadata lines dropped, <title>/<description>
    text kept as fairseq's recipe does), ``xml`` (IWSLT ``<seg id=..>``), ``sgm`` (WMT
    ``<seg>``) or ``text`` (one sentence per line).  ``members`` maps a language code to the
    member's path suffix (its basename, or a longer suffix).  ``gz``: the member itself is
    gzip-compressed (giga-fren inside ``training-giga-fren.tar``).
    """

    name: str
    archive: str
    fmt: str
    members: dict
    gz: bool = False


@dataclass(frozen=True)
class Recipe:
    """How one corpus is built.  See docs/data-preparation.md for the reasoning."""

    name: str
    src: str
    tgt: str
    title: str
    papers: str
    train: tuple
    test: tuple
    valid: tuple = ()          # empty: valid is split off the training data (IWSLT)
    valid_every: int = 0       # IWSLT: every n-th line of the training data becomes valid
    split_before_clean: bool = False
    lowercase: bool = False
    aggressive_dash: bool = False
    normalize_train: bool = False  # normalize-punctuation.perl + remove-non-printing-char.perl
    clean_stage: str = "tok"   # "tok": clean-corpus on Moses tokens; "bpe": on subword units
    clean_min: int = 1
    clean_max: int = 250
    clean_ratio: float = 1.5
    bpe_merges: int = 10000
    paper_sizes: dict = field(default_factory=dict)   # human readable, from the papers/recipes
    expected: dict = field(default_factory=dict)      # exact counts we can check (valid/test)
    notes: str = ""

    def fingerprint(self) -> str:
        return fingerprint(self)

    def parts(self):
        return (*self.train, *self.valid, *self.test)


# ----------------------------------------------------------------------------- archives
def _statmt(path: str) -> tuple:
    return (f"https://www.statmt.org/{path}", f"http://statmt.org/{path}")


ARCHIVES = {a.key: a for a in [
    Archive(
        "iwslt14-de-en", "iwslt14-de-en.tgz",
        ("http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",
         "https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz"),
        "IWSLT 2014 TED De-En release (WIT3 2014-01): train.tags + IWSLT14.TED*/TEDX xml sets; "
        "the first URL is the mirror fairseq's prepare-iwslt14.sh uses since WIT3 went offline",
        also_named=("de-en.tgz",),
    ),
    Archive(
        "iwslt17-en-fr", "iwslt17-en-fr.tgz",
        ("https://raw.githubusercontent.com/hlt-mt/WIT3/master/archive/2017-01-trnted/texts/en/fr/en-fr.tgz",
         "https://wit3.fbk.eu/archive/2017-01-trnted/texts/en/fr/en-fr.tgz"),
        "IWSLT 2017 TED En-Fr release (WIT3 2017-01-trnted): train.tags + IWSLT17.TED.* xml sets",
        also_named=("en-fr.tgz",),
        md5="3cf07ebe305312b12f7f1a4d5f8f8377", checksum_source=SACREBLEU_MD5 + ", entry iwslt17/tst2015",
    ),
    Archive("europarl-v7", "training-parallel-europarl-v7.tgz", _statmt("wmt13/training-parallel-europarl-v7.tgz"),
            "Europarl v7 (WMT13-15 training data)"),
    Archive("commoncrawl", "training-parallel-commoncrawl.tgz", _statmt("wmt13/training-parallel-commoncrawl.tgz"),
            "Common Crawl parallel corpus (WMT13-15 training data)"),
    Archive("nc-v9", "training-parallel-nc-v9.tgz", _statmt("wmt14/training-parallel-nc-v9.tgz"),
            "News Commentary v9 (WMT14 training data)"),
    Archive("nc-v10", "training-parallel-nc-v10.tgz", _statmt("wmt15/training-parallel-nc-v10.tgz"),
            "News Commentary v10 (WMT15 training data)"),
    Archive("un", "training-parallel-un.tgz", _statmt("wmt13/training-parallel-un.tgz"),
            "UN corpus (undoc.2000, WMT13-14 Fr-En training data)"),
    Archive("giga-fren", "training-giga-fren.tar", _statmt("wmt10/training-giga-fren.tar"),
            "10^9 French-English corpus (giga-fren.release2.fixed.*.gz inside a .tar)"),
    Archive("wmt12-test", "wmt12-test.tgz", ("https://statmt.org/wmt12/test.tgz", "http://www.statmt.org/wmt12/test.tgz"),
            "WMT12 test sets (newstest2012 .sgm)", also_named=("wmt12/test.tgz",),
            md5="608232d34ebc4ba2ff70fead45674e47", checksum_source=SACREBLEU_MD5 + ", entry wmt12"),
    Archive("wmt13-test", "wmt13-test.tgz", ("https://statmt.org/wmt13/test.tgz", "http://www.statmt.org/wmt13/test.tgz"),
            "WMT13 test sets (newstest2013 .sgm)", also_named=("wmt13/test.tgz",),
            md5="48eca5d02f637af44e85186847141f67", checksum_source=SACREBLEU_MD5 + ", entry wmt13"),
    Archive("wmt14-test-full", "wmt14-test-full.tgz",
            ("https://statmt.org/wmt14/test-full.tgz", "http://www.statmt.org/wmt14/test-full.tgz"),
            "WMT14 test sets, full version (newstest2014: 3,003 sentences for En-De and En-Fr)",
            also_named=("test-full.tgz",),
            md5="a8cd784e006feb32ac6f3d9ec7eb389a", checksum_source=SACREBLEU_MD5 + ", entry wmt14/full"),
    Archive("wmt15-test", "wmt15-test.tgz", ("https://statmt.org/wmt15/test.tgz", "http://www.statmt.org/wmt15/test.tgz"),
            "WMT15 test sets (newstest2015 .sgm)", also_named=("wmt15/test.tgz",),
            md5="67e3beca15e69fe3d36de149da0a96df", checksum_source=SACREBLEU_MD5 + ", entry wmt15"),
    Archive("wmt16-test", "wmt16-test.tgz", ("https://data.statmt.org/wmt16/translation-task/test.tgz",),
            "WMT16 test sets (newstest2016 .sgm)", also_named=("wmt16/test.tgz",),
            md5="3d809cd0c2c86adb2c67034d15c4e446", checksum_source=SACREBLEU_MD5 + ", entry wmt16"),
    # CNN/DailyMail (MSC Appendix A; See et al. 2017): the story archives of Hermann et al. (2015)
    # (cs.nyu.edu/~kcho/DMQA, served from Google Drive, which needs a browser: use --from-dir) and
    # See et al.'s URL lists that define the splits.
    Archive("cnn-stories", "cnn_stories.tgz",
            ("https://drive.google.com/uc?export=download&id=0BwmD_VLjROrfTHk4NFg2SndKcjQ",),
            "CNN stories of the DeepMind Q&A dataset (cnn/stories/<sha1 of URL>.story), from "
            "https://cs.nyu.edu/~kcho/DMQA/", md5="85ac23a1926a831e8f46a6b8eaf57263",
            checksum_source=TORCHTEXT_MD5),
    Archive("dailymail-stories", "dailymail_stories.tgz",
            ("https://drive.google.com/uc?export=download&id=0BwmD_VLjROrfM1BxdkxVaTY2bWs",),
            "Daily Mail stories of the DeepMind Q&A dataset (dailymail/stories/<sha1 of URL>.story), from "
            "https://cs.nyu.edu/~kcho/DMQA/", md5="f9c5f565e8abe86c38bfa4ae8f96fd72",
            checksum_source=TORCHTEXT_MD5),
    *[Archive(f"cnndm-urls-{split}", f"all_{name}.txt",
              (f"https://raw.githubusercontent.com/abisee/cnn-dailymail/master/url_lists/all_{name}.txt",),
              f"See et al.'s {split} URL list (abisee/cnn-dailymail url_lists/all_{name}.txt)")
      for split, name in (("train", "train"), ("valid", "val"), ("test", "test"))],
]}


# ----------------------------------------------------------------------------- parts
def _pair(a: str, b: str, pattern: str) -> dict:
    return {a: pattern.format(lang=a), b: pattern.format(lang=b)}


IWSLT14_TRAIN = Part("iwslt14", "iwslt14-de-en", "tags", _pair("de", "en", "train.tags.de-en.{lang}"))


def _iwslt14_set(kind: str, year: str) -> Part:
    return Part(f"IWSLT14.{kind}.{year}", "iwslt14-de-en", "xml",
                _pair("de", "en", f"IWSLT14.{kind}.{year}.de-en.{{lang}}.xml"))


# MSC Sec. 4.1: "dev2010, dev2012, tst2010, tst2011, tst2012" = fairseq's test concatenation
# (dev2012 exists only as the TEDx set IWSLT14.TEDX.dev2012).
IWSLT14_TEST = (_iwslt14_set("TED", "dev2010"), _iwslt14_set("TEDX", "dev2012"), _iwslt14_set("TED", "tst2010"),
                _iwslt14_set("TED", "tst2011"), _iwslt14_set("TED", "tst2012"))

IWSLT17_TRAIN = Part("iwslt17", "iwslt17-en-fr", "tags", _pair("en", "fr", "train.tags.en-fr.{lang}"))
IWSLT17_TEST = tuple(
    Part(f"IWSLT17.TED.{y}", "iwslt17-en-fr", "xml", _pair("en", "fr", f"IWSLT17.TED.{y}.en-fr.{{lang}}.xml"))
    for y in ("dev2010", "tst2010", "tst2011", "tst2012", "tst2013", "tst2014", "tst2015"))


def _wmt_train(x: str, extra: tuple = ()) -> tuple:
    """Europarl v7 + Common Crawl (+ ...) for the pair x-en, in fairseq's order."""
    p = f"{x}-en"
    return (Part("europarl-v7", "europarl-v7", "text", _pair(x, "en", f"europarl-v7.{p}.{{lang}}")),
            Part("commoncrawl", "commoncrawl", "text", _pair(x, "en", f"commoncrawl.{p}.{{lang}}")),
            *extra)


def _nt(year: int, archive: str, x: str, src: str, tgt: str, pair_tag: str = "") -> Part:
    """newstestYYYY: WMT12/13 use multi-parallel ``newstestYYYY-src.<l>.sgm`` files,
    later years ``newstestYYYY-<pair>-src.<src>.sgm`` / ``-ref.<tgt>.sgm``."""
    if not pair_tag:
        members = {x: f"newstest{year}-src.{x}.sgm", "en": f"newstest{year}-src.en.sgm"}
    else:
        members = {src: f"newstest{year}-{pair_tag}-src.{src}.sgm", tgt: f"newstest{year}-{pair_tag}-ref.{tgt}.sgm"}
    return Part(f"newstest{year}", archive, "sgm", members)


NC9_DE = Part("news-commentary-v9", "nc-v9", "text", _pair("de", "en", "news-commentary-v9.de-en.{lang}"))
NC9_FR = Part("news-commentary-v9", "nc-v9", "text", _pair("fr", "en", "news-commentary-v9.fr-en.{lang}"))
NC10_CS = Part("news-commentary-v10", "nc-v10", "text", _pair("cs", "en", "news-commentary-v10.cs-en.{lang}"))
UN_FR = Part("undoc.2000", "un", "text", _pair("fr", "en", "undoc.2000.fr-en.{lang}"))
GIGA_FR = Part("giga-fren", "giga-fren", "text", _pair("fr", "en", "giga-fren.release2.fixed.{lang}.gz"), gz=True)

WMT14_ENDE_TRAIN = _wmt_train("de", (NC9_DE,))
NT2012_DE, NT2013_DE = _nt(2012, "wmt12-test", "de", "en", "de"), _nt(2013, "wmt13-test", "de", "en", "de")
NT2014_ENDE = _nt(2014, "wmt14-test-full", "de", "en", "de", "deen")

_IWSLT = dict(lowercase=True, clean_stage="tok", clean_max=175, clean_ratio=1.5, valid_every=23, bpe_merges=10000)
_WMT = dict(aggressive_dash=True, normalize_train=True, clean_stage="bpe", clean_max=250, clean_ratio=1.5)

_MSC_IWSLT_NOTE = (
    "valid = every 23rd line of the tokenized training text BEFORE length cleaning (not cleaned), train = the "
    "other lines after clean-corpus 1..175 / ratio 1.5.  This is the reading that reproduces MSC's counts: "
    "fairseq's cleaning step is reported to read 174,443 lines and keep 167,522 (not re-measured here); "
    "174,443 // 23 = 7,584 (MSC's valid), while splitting after cleaning gives fairseq's 7,283.")

RECIPES = {r.name: r for r in [
    Recipe(
        "iwslt14-de-en", "de", "en", "IWSLT14 De->En (Ranzato et al. 2016 split, MSC test set)", "MSC Sec. 4.1",
        train=(IWSLT14_TRAIN,), test=IWSLT14_TEST, split_before_clean=True, **_IWSLT,
        paper_sizes={"train": "160k", "valid": "7,584", "test": "dev2010+dev2012+tst2010+tst2011+tst2012"},
        expected={"valid": 7584, "test": 6750}, notes=_MSC_IWSLT_NOTE),
    Recipe(
        "iwslt14-en-de", "en", "de", "IWSLT14 En->De (same data as iwslt14-de-en, reversed)", "MSC Sec. 4.1",
        train=(IWSLT14_TRAIN,), test=IWSLT14_TEST, split_before_clean=True, **_IWSLT,
        paper_sizes={"train": "160k", "valid": "7,584", "test": "dev2010+dev2012+tst2010+tst2011+tst2012"},
        expected={"valid": 7584, "test": 6750}, notes=_MSC_IWSLT_NOTE),
    Recipe(
        "iwslt14-de-en-fairseq", "de", "en", "IWSLT14 De->En exactly as fairseq's prepare-iwslt14.sh",
        "fairseq examples/translation (the usual IWSLT14 De-En benchmark)",
        train=(IWSLT14_TRAIN,), test=IWSLT14_TEST, split_before_clean=False, **_IWSLT,
        paper_sizes={"train": "160,239", "valid": "7,283", "test": "6,750"},
        expected={"train": 160239, "valid": 7283, "test": 6750},
        notes="clean-corpus 1..175 / ratio 1.5 first, then every 23rd cleaned line is valid (fairseq's order). "
              "The test set is the same concatenation as iwslt14-de-en."),
    Recipe(
        "iwslt17-en-fr", "en", "fr", "IWSLT17 En->Fr (MSC)", "MSC Sec. 4.1",
        train=(IWSLT17_TRAIN,), test=IWSLT17_TEST, split_before_clean=True, **_IWSLT,
        paper_sizes={"train": "236k", "valid": "10,263", "test": "dev2010+tst2010..tst2015"},
        expected={"valid": 10263},
        notes="MSC gives no recipe for the 10,263 valid sentences; we split them off the training data like "
              "IWSLT14 (every 23rd line before cleaning; 10,263 * 23 = 236,049 ~ the '236k' of the paper)."),
    Recipe(
        "wmt14-en-de", "en", "de", "WMT14 En->De, 4.5M (Europarl v7, Common Crawl, News Commentary v9)",
        "MSC Sec. 4.1 (32k merges, ~37k joint vocabulary)",
        train=WMT14_ENDE_TRAIN, valid=(NT2013_DE,), test=(NT2014_ENDE,), bpe_merges=32000, **_WMT,
        paper_sizes={"train": "4.5M (before cleaning)", "valid": "newstest2013 (3,000)", "test": "newstest2014 (3,003)"},
        expected={"valid": 3000, "test": 3003}),
    Recipe(
        "wmt14-en-de-dd", "en", "de", "WMT14 En->De, 4.5M, 40k merges, valid newstest2012+2013",
        "deep-decoder paper Sec. 4.1",
        train=WMT14_ENDE_TRAIN, valid=(NT2012_DE, NT2013_DE), test=(NT2014_ENDE,), bpe_merges=40000, **_WMT,
        paper_sizes={"train": "4.5M (before cleaning)", "valid": "newstest2012+2013 (6,003)",
                     "test": "newstest2014 (3,003)"},
        expected={"valid": 6003, "test": 3003}),
    Recipe(
        "wmt14-en-de-gpkd", "en", "de", "the 4.5M En-De set with GPKD's split: valid newstest2016, test newstest2014",
        "GPKD Sec. Experiments ('WMT16 En-De', 32k merges)",
        train=WMT14_ENDE_TRAIN, valid=(_nt(2016, "wmt16-test", "de", "en", "de", "ende"),), test=(NT2014_ENDE,),
        bpe_merges=32000, **_WMT,
        paper_sizes={"train": "4.5M (before cleaning)", "valid": "newstest2016 (2,999)", "test": "newstest2014 (3,003)"},
        expected={"valid": 2999, "test": 3003}),
    Recipe(
        "wmt14-en-fr", "en", "fr", "WMT14 En->Fr, 36M (fairseq's prepare-wmt14en2fr.sh corpus list)",
        "deep-decoder paper Sec. 4.1 (40k merges)",
        train=_wmt_train("fr", (UN_FR, NC9_FR, GIGA_FR)),
        valid=(_nt(2012, "wmt12-test", "fr", "en", "fr"), _nt(2013, "wmt13-test", "fr", "en", "fr")),
        test=(_nt(2014, "wmt14-test-full", "fr", "en", "fr", "fren"),), bpe_merges=40000, **_WMT,
        paper_sizes={"train": "36M", "valid": "newstest2012+2013 (6,003)", "test": "newstest2014 (3,003)"},
        expected={"valid": 6003, "test": 3003}),
    Recipe(
        "wmt15-cs-en", "cs", "en", "WMT15 Cs->En (Europarl v7, Common Crawl, News Commentary v10; no CzEng)",
        "transparent attention paper Sec. 4 (shared 32k vocabulary)",
        train=_wmt_train("cs", (NC10_CS,)), valid=(_nt(2013, "wmt13-test", "cs", "cs", "en"),),
        test=(_nt(2015, "wmt15-test", "cs", "cs", "en", "csen"),), bpe_merges=32000, **_WMT,
        paper_sizes={"train": "not stated", "valid": "newstest2013 (3,000)", "test": "newstest2015 (2,656)"},
        expected={"valid": 3000, "test": 2656},
        notes="WMT15's constrained Cs-En data also contain CzEng 1.0 (~15M pairs), which is distributed only "
              "after registration and is not included."),
]}


@dataclass(frozen=True)
class SummarizationRecipe:
    """A document -> summary corpus (``src`` = documents, ``tgt`` = summaries), built by
    ``deepnmt-prepare-data`` from story archives and URL lists (:mod:`.cnndm`)."""

    name: str
    src: str
    tgt: str
    title: str
    papers: str
    stories: tuple            # archive keys of the story tarballs
    url_lists: dict           # split -> archive key of its URL list
    bpe_merges: int = 32000
    max_doc_tokens: int = 640
    lowercase: bool = True
    paper_sizes: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)
    notes: str = ""
    kind: str = "summarization"
    # what code shared with the translation recipes reads (no parallel parts, no split-off valid)
    train: tuple = ()
    valid: tuple = ()
    test: tuple = ()
    valid_every: int = 0

    def fingerprint(self) -> str:
        return fingerprint(self)

    def parts(self):
        return ()

    def archive_keys(self):
        return (*self.stories, *self.url_lists.values())


RECIPES["cnndm"] = SummarizationRecipe(
    "cnndm", "article", "summary", "CNN/DailyMail, non-anonymized (See et al. 2017 splits), for MSC Appendix A",
    "MSC Appendix A (Table 6)", stories=("cnn-stories", "dailymail-stories"),
    url_lists={"train": "cnndm-urls-train", "valid": "cnndm-urls-valid", "test": "cnndm-urls-test"},
    paper_sizes={"train": "287,226", "valid": "13,368", "test": "11,490"},
    expected={"train": 287226, "valid": 13368, "test": 11490},
    notes="See et al.'s make_datafiles.py with the Moses tokenizer in place of CoreNLP's PTB tokenizer; "
          "lowercased; summary sentences joined with <q>; empty articles dropped; joint BPE 32k (the paper "
          "gives no number); articles truncated to their first 640 BPE tokens (deepnmt_data/cnndm.py, "
          "docs/data-preparation.md).")


def check_registry() -> None:
    """Every part names a known archive and one member per language of each recipe."""
    for r in RECIPES.values():
        if getattr(r, "kind", "translation") == "summarization":
            for key in r.archive_keys():
                if key not in ARCHIVES:
                    raise AssertionError(f"{r.name}: unknown archive {key}")
            continue
        for p in r.parts():
            if p.archive not in ARCHIVES:
                raise AssertionError(f"{r.name}: part {p.name} uses unknown archive {p.archive}")
            if set(p.members) != {r.src, r.tgt}:
                raise AssertionError(f"{r.name}: part {p.name} has members for {sorted(p.members)}")
        if not r.valid and not r.valid_every:
            raise AssertionError(f"{r.name}: no valid set")
