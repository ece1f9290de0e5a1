#!/usr/bin/env python
"""Download (or take from a directory), process and binarize the papers' corpora for fairseq.

    python scripts/prepare_data.py --list
    python scripts/prepare_data.py NAME [--data-root DIR] [--from-dir DIR] [--workers N]
                                        [--spm] [--bpe-merges N] [--force] [--dry-run]

NAME is one of the corpora in deepnmt_fairseq/repro/corpora.py (``--list``): iwslt14-de-en,
iwslt14-en-de, iwslt14-de-en-fairseq, iwslt17-en-fr (MSC Sec. 4.1), wmt14-en-de (MSC),
wmt14-en-de-dd, wmt14-en-fr (deep-decoder paper Sec. 4.1), wmt15-cs-en (transparent
attention, Sec. 4), wmt14-en-de-gpkd (GPKD).  docs/data-preparation.md explains every choice.

Output (DATA_ROOT = --data-root, else $DEEPNMT_DATA, else <repo>/work/data)::

    DATA_ROOT/downloads/         archives fetched from the network (shared by all corpora)
    DATA_ROOT/NAME/raw/          the text the tokenizer reads: metadata/markup removed, whitespace unified
                                 (<split>.<part>.<lang>; {valid,test}.<lang> = untokenized references)
    DATA_ROOT/NAME/tok/          Moses-tokenized (lowercased for IWSLT); IWSLT train cleaned, valid split off
    DATA_ROOT/NAME/bpe/          joint BPE (subword-nmt ``code``) or sentencepiece (``spm.model``) applied;
                                 WMT train cleaned here (fairseq's recipes clean after BPE)
    DATA_ROOT/NAME/bin/          fairseq-preprocess --joined-dictionary: train/valid/test
    DATA_ROOT/NAME/CONFIG.json   the settings the data were made with
    DATA_ROOT/NAME/SOURCES.json  the archives used: origin, size, SHA-256, checksum verification
    DATA_ROOT/NAME/STATS.json    line counts at every step, next to the papers' sizes
    DATA_ROOT/NAME/.done         written last: the dataset is complete

Robustness: each step builds ``<step>.partial/`` and renames it when complete, so a re-run
skips finished steps and an interrupted step starts again from scratch; ``.done`` is written
last.  A finished dataset is never overwritten (``--force`` rebuilds it), a dataset made with
other settings is refused, and a lock file stops two runs on the same dataset.  Large
corpora are streamed line by line; tokenization and subword segmentation run in
``--workers`` processes with results written in input order (identical output for every
worker count).
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import gzip
import hashlib
import http.client
import importlib.util
import inspect
import io
import json
import lzma
import os
import re
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = ("raw", "tok", "bpe", "bin")
SPLITS = ("train", "valid", "test")
FORMAT_VERSION = 1
CHUNK = 5000          # pairs per worker job
REPORT_EVERY = 10.0   # seconds between progress lines


def _load_corpora(module: str = "corpora"):
    """The corpora registry of the installed package, deepnmt_fairseq/repro/corpora.py (or
    another standard-library-only module beside it, e.g. ``cnndm``).

    Loaded from the package's directory without importing ``deepnmt_fairseq`` itself (that
    would load fairseq and torch before this script forks its workers); the module uses the
    standard library only."""
    name = f"deepnmt_data_{module}"
    if name in sys.modules:
        return sys.modules[name]
    pkg = importlib.util.find_spec("deepnmt_fairseq")
    if pkg is None or not pkg.submodule_search_locations:
        sys.exit("prepare_data.py: the deepnmt_fairseq package is not installed (pip install -e . or "
                 "bash scripts/setup_env.sh): its corpora registry is deepnmt_fairseq/repro/corpora.py")
    path = Path(list(pkg.submodule_search_locations)[0]) / "repro" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


corpora = _load_corpora()
cnndm = _load_corpora("cnndm")


class DataPrepError(Exception):
    """A problem with the inputs or settings, reported to the user without a traceback."""


# ============================================================================ logging
class Log:
    def __init__(self, name: str):
        self.name = name
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        el = int(time.time() - self.t0)
        print(f"[prepare_data {self.name} {el // 3600}:{el // 60 % 60:02d}:{el % 60:02d}] {msg}", flush=True)


class Progress:
    """Counts items and logs a line every REPORT_EVERY seconds (and once at the end)."""

    def __init__(self, log: Log, what: str, unit: str = "lines"):
        self.log, self.what, self.unit = log, what, unit
        self.n = 0
        self.t0 = self.last = time.time()

    def add(self, k: int = 1) -> None:
        self.set(self.n + k)

    def set(self, n: int) -> None:
        self.n = n
        now = time.time()
        if now - self.last >= REPORT_EVERY:
            self.last = now
            self.log(f"{self.what}: {self.n:,} {self.unit} ({self.n / max(now - self.t0, 1e-9):,.0f}/s)")

    def done(self, extra: str = "") -> None:
        dt = time.time() - self.t0
        self.log(f"{self.what}: {self.n:,} {self.unit} in {dt:.1f} s{extra}")


# ============================================================================ text parsing
_META_TAGS = ("url", "keywords", "speaker", "talkid", "reviewer", "translator", "doc")
_META_RE = re.compile(r"^<\s*/?\s*(?:%s)\b" % "|".join(_META_TAGS), re.I)
_TITLE_RE = re.compile(r"</?\s*(?:title|description)\s*>", re.I)
_SEG_RE = re.compile(r"<seg\b([^>]*)>(.*?)</seg\s*>", re.I)
_SEG_OPEN_RE = re.compile(r"<seg\b", re.I)
_ID_RE = re.compile(r"""\bid\s*=\s*["']?([^"'\s>]*)""", re.I)


def nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


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


# ============================================================================ archives
def hash_file(path: Path, log: Log | None = None) -> dict:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    size = path.stat().st_size
    prog = Progress(log, f"checksum {path.name}", "MB") if log and size > 200 * 2**20 else None
    with open(path, "rb") as f:
        while True:
            b = f.read(2**22)
            if not b:
                break
            sha.update(b)
            md5.update(b)
            if prog:
                prog.add(len(b) // 2**20)
    return {"size": size, "sha256": sha.hexdigest(), "md5": md5.hexdigest()}


def archive_candidates(arch) -> list:
    return [arch.filename, *arch.also_named]


def locate_archive(arch, from_dir: Path | None, downloads: Path):
    """(path or None, origin).  --from-dir first, then the download cache."""
    if from_dir is not None:
        for c in archive_candidates(arch):
            if (from_dir / c).is_file():
                return from_dir / c, "from-dir"
    if (downloads / arch.filename).is_file():
        return downloads / arch.filename, "cache"
    return None, "missing"


def download(arch, dest: Path, log: Log, timeout: float = 60.0) -> str:
    """Download ``arch`` to ``dest`` atomically (``dest.part`` then rename), resuming a
    previous ``.part`` with an HTTP Range request when the server allows it.  Tries the
    URLs in order; returns the URL used."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    errors = []
    with open(dest.with_name(dest.name + ".lock"), "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if dest.is_file():      # another process finished it while we waited
            return "(downloaded by another process)"
        for url in arch.urls:
            try:
                _download_one(url, part, log, timeout)
            except urllib.error.HTTPError as e:
                errors.append(f"{url}: HTTP {e.code} {e.reason}")
                continue
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
                reason = getattr(e, "reason", e)
                errors.append(f"{url}: {reason}")
                continue
            os.replace(part, dest)
            return url
    names = " or ".join(archive_candidates(arch))
    raise DataPrepError(
        f"could not download {arch.filename} ({arch.description}):\n  " + "\n  ".join(errors) +
        f"\nNo network here?  Download it on a machine with internet access (URLs above), put it in a "
        f"directory as {names} and pass --from-dir DIR.  A partial download is kept in {part} and resumed "
        "on the next attempt.")


def _download_one(url: str, part: Path, log: Log, timeout: float) -> None:
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "deepnmt-prepare-data/1"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:      # nothing left to fetch, or a stale .part: start again
            part.unlink()
            return _download_one(url, part, log, timeout)
        raise
    with resp:
        if have and resp.status == 206:
            mode, start = "ab", have
            log(f"resuming {url} at {have:,} bytes")
        else:
            mode, start = "wb", 0
            log(f"downloading {url}")
        length = resp.headers.get("Content-Length")
        total = start + int(length) if length is not None else None
        prog = Progress(log, f"download {part.name[:-5]}", "MB")
        got = start
        with open(part, mode) as out:
            while True:
                b = resp.read(2**20)
                if not b:
                    break
                out.write(b)
                got += len(b)
                prog.set(got // 2**20)
    if total is not None and got != total:
        raise OSError(f"connection closed after {got:,} of {total:,} bytes (kept for resuming)")
    prog.done()


class ArchiveReader:
    """Reads the wanted members of one tar archive in a single streaming pass."""

    def __init__(self, path: Path, arch):
        self.path, self.arch = path, arch

    def read(self, wanted: dict, handle) -> None:
        """``wanted``: member suffix -> gz flag.  ``handle(suffix, binary_stream)`` is called
        once per wanted member.  Errors name the archive and the member."""
        found, seen = {}, []
        try:
            with tarfile.open(self.path, mode="r|*") as tar:
                for m in tar:
                    seen.append(m.name)
                    if not m.isfile():
                        continue
                    for suffix, gz in wanted.items():
                        if m.name == suffix or m.name.endswith("/" + suffix):
                            if suffix in found:
                                raise DataPrepError(
                                    f"archive {self.path} has two members matching {suffix!r}: "
                                    f"{found[suffix]} and {m.name}")
                            found[suffix] = m.name
                            f = tar.extractfile(m)
                            stream = gzip.GzipFile(fileobj=f, mode="rb") if gz else f
                            handle(suffix, stream, f"{self.path.name}:{m.name}")
                            break
        except DataPrepError:
            raise
        except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as e:
            raise self._corrupt(e) from None
        except OSError as e:
            if e.errno is not None:     # a real I/O error (disk full, ...), not bad archive data
                raise
            raise self._corrupt(e) from None
        missing = [s for s in wanted if s not in found]
        if missing:
            sample = ", ".join(seen[:12]) + (" ..." if len(seen) > 12 else "")
            raise DataPrepError(
                f"archive {self.path} lacks the expected member(s) {', '.join(missing)} "
                f"(it has {len(seen)} entries: {sample or 'none'}). Is it the right file ({self.arch.description})? "
                "A truncated download can also end early: delete it and download again.")

    def _corrupt(self, e) -> DataPrepError:
        return DataPrepError(
            f"archive {self.path} is truncated or corrupt ({type(e).__name__}: {e}). Delete it and download "
            f"it again ({' or '.join(self.arch.urls)}).")


# ============================================================================ workers
_W: dict = {}


def _init_worker(spec: dict) -> None:
    """Per-process state: tokenizers, normalizers, the BPE or sentencepiece model."""
    _W.clear()
    _W.update(spec)
    if spec.get("tok"):
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
        _W["mt"] = {lang: MosesTokenizer(lang=lang) for lang in spec["langs"]}
        if spec.get("normalize"):
            kw = {"perl_parity": True} if "perl_parity" in inspect.signature(MosesPunctNormalizer).parameters else {}
            _W["mpn"] = {lang: MosesPunctNormalizer(lang=lang, **kw) for lang in spec["langs"]}
            import regex
            _W["nonprint"] = regex.compile(r"\p{C}")
    if spec.get("codes"):
        from subword_nmt.apply_bpe import BPE
        with open(spec["codes"], encoding="utf-8") as f:
            _W["bpe"] = BPE(f)
    if spec.get("spm"):
        import sentencepiece as spm
        _W["sp"] = spm.SentencePieceProcessor(model_file=spec["spm"])


def _tok_line(text: str, lang: str, train: bool) -> str:
    if not train:
        # fairseq's recipes: dev/test sets get ``sed -e "s/\’/\'/g"`` before the tokenizer
        text = text.replace("\u2019", "'")
    elif _W.get("normalize"):
        # normalize-punctuation.perl -l lang | remove-non-printing-char.perl (fairseq's WMT recipes)
        text = _W["nonprint"].sub(" ", _W["mpn"][lang].normalize(text))
    out = _W["mt"][lang].tokenize(text, aggressive_dash_splits=_W["aggressive"], escape=False, return_str=True)
    if _W["lowercase"]:
        out = out.lower()
    return norm_ws(out)


def _tok_job(job):
    train, pairs = job
    s, t = _W["langs"]
    return [(_tok_line(a, s, train), _tok_line(b, t, train)) for a, b in pairs]


def _seg_job(pairs):
    if "bpe" in _W:
        bpe = _W["bpe"]
        return [(bpe.process_line(a), bpe.process_line(b)) for a, b in pairs]
    sp = _W["sp"]
    return [(" ".join(sp.encode(a, out_type=str)), " ".join(sp.encode(b, out_type=str))) for a, b in pairs]


class Workers:
    """``workers`` processes sharing the state set up by :func:`_init_worker`.

    ``map`` returns results in input order with at most 2*workers jobs in flight, so memory
    stays bounded however long the input is.  With one worker everything runs in-process.
    The state is also built in this process before forking, so the children inherit the
    imported modules instead of importing them again."""

    def __init__(self, n: int, spec: dict):
        self.n, self.spec, self.ex = n, spec, None

    def __enter__(self):
        _init_worker(self.spec)
        if self.n > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
            self.ex = ProcessPoolExecutor(self.n, mp_context=ctx, initializer=_init_worker, initargs=(self.spec,))
        return self

    def __exit__(self, *exc):
        if self.ex is not None:
            self.ex.shutdown(wait=True, cancel_futures=True)
        return False

    def map(self, fn, jobs):
        if self.ex is None:
            for j in jobs:
                yield fn(j)
            return
        window = collections.deque()
        for j in jobs:
            window.append(self.ex.submit(fn, j))
            if len(window) >= 2 * self.n:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def chunks(it, n: int):
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) == n:
            yield buf
            buf = []
    if buf:
        yield buf


# ============================================================================ cleaning
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


# ============================================================================ the job
class Job:
    def __init__(self, args, recipe):
        self.args = args
        self.r = recipe
        self.root = Path(args.data_root).resolve()
        self.ds = self.root / recipe.name
        self.downloads = self.root / "downloads"
        self.from_dir = Path(args.from_dir).resolve() if args.from_dir else None
        self.log = Log(recipe.name)
        self.workers = max(1, args.workers)
        self.merges = args.bpe_merges or recipe.bpe_merges
        self.config = {
            "format": FORMAT_VERSION,
            "name": recipe.name,
            "recipe": recipe.fingerprint(),
            "src": recipe.src,
            "tgt": recipe.tgt,
            "segmenter": f"sentencepiece-{args.spm_model_type}" if args.spm else "subword-nmt",
            "bpe_merges" if not args.spm else "spm_vocab_size": self.merges,
            "invalid_utf8": "replace" if args.allow_invalid_utf8 else "error",
        }
        self.archives = {}      # key -> Path
        self.sources = {}

    # ------------------------------------------------------------------ helpers
    def step_done(self, step: str) -> bool:
        return (self.ds / step / "STEP.json").is_file()

    def step_info(self, step: str) -> dict:
        return json.loads((self.ds / step / "STEP.json").read_text())

    def fresh_partial(self, step: str) -> Path:
        p = self.ds / f"{step}.partial"
        if p.exists():
            self.log(f"{step}: removing the unfinished {p.name} of an earlier run")
            shutil.rmtree(p)
        p.mkdir(parents=True)
        return p

    def finish_step(self, step: str, partial: Path, stats: dict, t0: float) -> None:
        info = {"config": self.config, "stats": stats, "seconds": round(time.time() - t0, 1),
                "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        if step == "raw":
            info["sources"] = {k: v["sha256"] for k, v in self.sources.items()}
        (partial / "STEP.json").write_text(json.dumps(info, indent=1) + "\n")
        os.replace(partial, self.ds / step)
        self.log(f"{step}: done in {info['seconds']} s")

    def parts(self, split: str):
        r = self.r
        return {"train": r.train, "valid": r.valid, "test": r.test}[split]

    def langs(self):
        return self.r.src, self.r.tgt

    # ------------------------------------------------------------------ plan / dry run
    def describe_steps(self) -> list:
        r, a = self.r, self.args
        tok = f"Moses tokenizer (sacremoses, escape=False{', aggressive dash splits' if r.aggressive_dash else ''})"
        if r.normalize_train:
            tok += "; train first normalize-punctuation + remove-non-printing-char"
        if r.lowercase:
            tok += "; lowercased"
        if r.valid_every:
            order = "before" if r.split_before_clean else "after"
            tok += (f"; valid = every {nth(r.valid_every)} training line ({order} cleaning); train cleaned "
                    f"{r.clean_min}..{r.clean_max} tokens, ratio {r.clean_ratio}")
        seg = (f"joint sentencepiece {a.spm_model_type} model, vocabulary {self.merges}" if a.spm
               else f"joint BPE, subword-nmt, {self.merges} merges")
        seg += " learned on train src+tgt, applied to all splits"
        if r.clean_stage == "bpe":
            seg += f"; train cleaned {r.clean_min}..{r.clean_max} subword units, ratio {r.clean_ratio}"
        return [
            ("raw", "extract " + ", ".join(f"{s}: " + " + ".join(p.name for p in self.parts(s))
                                           for s in SPLITS if self.parts(s))),
            ("tok", tok),
            ("bpe", seg),
            ("bin", f"fairseq-preprocess --source-lang {r.src} --target-lang {r.tgt} --joined-dictionary "
                    f"--workers {self.workers}"),
        ]

    def dry_run(self) -> None:
        r = self.r
        print(f"{r.name}: {r.title}  [{r.papers}]")
        print(f"  output: {self.ds}")
        print(f"  settings: {json.dumps(self.config)}")
        if (self.ds / ".done").exists():
            print("  status: already prepared (.done exists)")
        try:
            self.check_config()
        except DataPrepError as e:
            print(f"  WARNING: {e}")
        print("  archives:")
        for key in sorted(set(r.archive_keys()) if hasattr(r, "archive_keys") else {p.archive for p in r.parts()}):
            arch = corpora.ARCHIVES[key]
            path, origin = locate_archive(arch, self.from_dir, self.downloads)
            if path is not None:
                where = f"use {path} ({origin})"
            elif self.from_dir is not None:
                where = f"MISSING in --from-dir {self.from_dir} (expected {' or '.join(archive_candidates(arch))})"
            else:
                where = f"download {arch.urls[0]} -> {self.downloads / arch.filename}"
            chk = f"sha256 {arch.sha256}" if arch.sha256 else (f"md5 {arch.md5}" if arch.md5 else "no known checksum")
            print(f"    {arch.filename}: {where}; {chk}")
        print("  steps:")
        for step, what in self.describe_steps():
            state = "done" if self.step_done(step) else (
                "unfinished (restarts)" if (self.ds / f"{step}.partial").exists() else "to do")
            print(f"    {step:4s} [{state}] {what}")
        if self.args.stop_after:
            print(f"  stops after: {self.args.stop_after}")

    # ------------------------------------------------------------------ sources
    def fetch(self) -> None:
        keys = sorted(set(self.r.archive_keys()) if hasattr(self.r, "archive_keys")
                      else {p.archive for p in self.r.parts()})
        if self.from_dir is not None:
            missing = [corpora.ARCHIVES[k] for k in keys
                       if locate_archive(corpora.ARCHIVES[k], self.from_dir, self.downloads)[0] is None]
            if missing:
                raise DataPrepError(f"not found in --from-dir {self.from_dir}:\n" + "\n".join(
                    f"  {a.filename} (or {', '.join(archive_candidates(a)[1:]) or '-'}): {a.description}; "
                    f"URL {a.urls[0]}" for a in missing))
        for key in keys:
            arch = corpora.ARCHIVES[key]
            path, origin = locate_archive(arch, self.from_dir, self.downloads)
            url = None
            if path is None:
                url = download(arch, self.downloads / arch.filename, self.log)
                path, origin = self.downloads / arch.filename, "downloaded"
            self.log(f"source {arch.filename}: {path} ({origin}); computing checksums")
            h = hash_file(path, self.log)
            verified = self.verify(arch, path, h, origin)
            self.archives[key] = path
            self.sources[key] = {"file": str(path), "origin": origin, "downloaded_from": url,
                                 "canonical_url": arch.urls[0], **h,
                                 "verified": verified, "checksum_source": arch.checksum_source}

    def verify(self, arch, path: Path, h: dict, origin: str) -> str:
        want = ("sha256", arch.sha256) if arch.sha256 else (("md5", arch.md5) if arch.md5 else None)
        if want is None:
            return "no known checksum (SHA-256 recorded)"
        kind, value = want
        if h[kind] == value:
            return f"{kind} matches"
        if self.args.ignore_checksums:
            self.log(f"WARNING: {path.name}: {kind} {h[kind]} != expected {value} (--ignore-checksums)")
            return f"{kind} MISMATCH ignored (--ignore-checksums)"
        msg = f"{path} has {kind} {h[kind]}, expected {value} ({arch.checksum_source})."
        if origin in ("downloaded", "cache"):
            bad = path.with_name(path.name + f".bad-{int(time.time())}")
            os.replace(path, bad)
            msg += f" Moved it aside to {bad}; run again to download it anew."
        else:
            msg += " The file in --from-dir was left as it is."
        raise DataPrepError(msg + " Pass --ignore-checksums if the upstream file was re-released.")

    # ------------------------------------------------------------------ step raw
    def step_raw(self) -> dict:
        out = self.fresh_partial("raw")
        stats = {"files": {}}
        bykey = collections.defaultdict(list)
        for split in SPLITS:
            for p in self.parts(split):
                for lang in self.langs():
                    bykey[p.archive].append((split, p, lang))
        ids = {}
        for key, items in bykey.items():
            wanted = {}
            targets = collections.defaultdict(list)
            for split, p, lang in items:
                wanted[p.members[lang]] = p.gz
                targets[p.members[lang]].append((split, p, lang))
            arch = corpora.ARCHIVES[key]

            def handle(suffix, stream, label, targets=targets):
                tl = targets[suffix]
                split, p, lang = tl[0]
                fst = {}
                lines = decoded_lines(stream, label, fst, self.args.allow_invalid_utf8)
                seg_ids = []
                if p.fmt == "text":
                    gen = parse_text(lines, label, fst)
                elif p.fmt == "tags":
                    gen = parse_tags(lines, label, fst)
                elif p.fmt in ("xml", "sgm"):
                    gen = parse_segs(lines, label, fst, seg_ids)
                else:
                    raise DataPrepError(f"unknown format {p.fmt}")
                names = [f"{s}.{q.name}.{lg}" for s, q, lg in tl]
                prog = Progress(self.log, f"raw: {label}")
                tmp = out / (names[0] + ".tmp")
                n = 0
                with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                    for line in gen:
                        f.write(line + "\n")
                        n += 1
                        prog.add()
                if n == 0:
                    raise DataPrepError(
                        f"{label} is empty (no {'segments' if p.fmt in ('xml', 'sgm') else 'sentences'} in it)")
                for extra in names[1:]:
                    shutil.copyfile(tmp, out / extra)
                os.replace(tmp, out / names[0])
                prog.done()
                for nm in names:
                    stats["files"][nm] = {"member": label, "lines": n, **fst}
                    ids[nm] = seg_ids

            self.log(f"raw: reading {self.archives[key]}")
            ArchiveReader(self.archives[key], arch).read(wanted, handle)
        s, t = self.langs()
        for split in SPLITS:
            for p in self.parts(split):
                a, b = f"{split}.{p.name}.{s}", f"{split}.{p.name}.{t}"
                na, nb = stats["files"][a]["lines"], stats["files"][b]["lines"]
                if na != nb:
                    what = {"xml": "segments", "sgm": "segments", "tags": "lines after removing metadata"}.get(
                        p.fmt, "lines")
                    raise DataPrepError(
                        f"{p.name}: {stats['files'][a]['member']} has {na:,} {what} but "
                        f"{stats['files'][b]['member']} has {nb:,}; the two sides are not parallel")
                if ids.get(a) and ids[a] != ids[b]:
                    k = next(i for i, (x, y) in enumerate(zip(ids[a], ids[b])) if x != y)
                    raise DataPrepError(f"{p.name}: segment {k + 1} has id {ids[a][k]!r} in {a} but "
                                        f"{ids[b][k]!r} in {b}; the two sides are not aligned")
        for split in ("valid", "test"):     # untokenized references (sacreBLEU), parts concatenated
            if self.parts(split):
                for lang in (s, t):
                    with open(out / f"{split}.{lang}.tmp", "wb") as f:
                        for p in self.parts(split):
                            f.write((out / f"{split}.{p.name}.{lang}").read_bytes())
                    os.replace(out / f"{split}.{lang}.tmp", out / f"{split}.{lang}")
        return stats

    # ------------------------------------------------------------------ step tok
    def raw_pairs(self, split: str):
        s, t = self.langs()
        for p in self.parts(split):
            with open(self.ds / "raw" / f"{split}.{p.name}.{s}", encoding="utf-8", newline="\n") as fa, \
                    open(self.ds / "raw" / f"{split}.{p.name}.{t}", encoding="utf-8", newline="\n") as fb:
                for a, b in zip(fa, fb, strict=True):
                    yield a.rstrip("\n"), b.rstrip("\n")

    def step_tok(self) -> dict:
        r = self.r
        out = self.fresh_partial("tok")
        spec = {"tok": True, "langs": self.langs(), "lowercase": r.lowercase, "aggressive": r.aggressive_dash,
                "normalize": r.normalize_train}
        stats = {}
        with Workers(self.workers, spec) as pool:
            for split in SPLITS:
                self._tok_split(split, pool, out, stats)
        return stats

    def _tok_split(self, split: str, pool, out: Path, stats: dict) -> None:
        """Tokenize one split.  For IWSLT the training text is also split into train/valid
        (every ``valid_every``-th line, before or after cleaning) and cleaned here."""
        r = self.r
        s, t = self.langs()
        if split == "valid" and not r.valid:
            return              # written while the training data are tokenized
        train = split == "train"
        prog = Progress(self.log, f"tok: {split}", "pairs")
        jobs = ((train, c) for c in chunks(self.raw_pairs(split), CHUNK))
        if train and r.valid_every:
            writers = {"train": Writer(out, "train", s, t), "valid": Writer(out, "valid", s, t)}
        else:
            writers = {split: Writer(out, split, s, t)}
        clean = train and r.clean_stage == "tok"
        dropped = collections.Counter()
        n_in = n_clean = 0
        for res in pool.map(_tok_job, jobs):
            for a, b in res:
                n_in += 1
                if train and r.valid_every and r.split_before_clean and n_in % r.valid_every == 0:
                    writers["valid"].write(a, b)        # MSC reading: split first, valid not cleaned
                    continue
                if clean:
                    why = clean_reason(a, b, r.clean_min, r.clean_max, r.clean_ratio)
                    if why:
                        dropped[why] += 1
                        continue
                n_clean += 1
                if train and r.valid_every and not r.split_before_clean and n_clean % r.valid_every == 0:
                    writers["valid"].write(a, b)        # fairseq's order: clean first, then split
                    continue
                writers[split].write(a, b)
            prog.add(len(res))
        for w in writers.values():
            w.close()
            stats[w.split] = w.n
        if train:
            stats["train_input"] = n_in
            stats["train_dropped"] = dict(dropped)
        prog.done(" -> " + ", ".join(f"{w.split} {w.n:,}" for w in writers.values())
                  + (f" (cleaning dropped {sum(dropped.values()):,}: {dict(dropped)})" if dropped else ""))

    # ------------------------------------------------------------------ step bpe
    def tok_pairs(self, split: str):
        s, t = self.langs()
        with open(self.ds / "tok" / f"{split}.{s}", encoding="utf-8", newline="\n") as fa, \
                open(self.ds / "tok" / f"{split}.{t}", encoding="utf-8", newline="\n") as fb:
            for a, b in zip(fa, fb, strict=True):
                yield a.rstrip("\n"), b.rstrip("\n")

    def step_bpe(self) -> dict:
        a = self.args
        out = self.fresh_partial("bpe")
        stats = {}
        if a.spm:
            model = self.learn_spm(out)
            spec = {"spm": str(model)}
            stats["model"] = model.name
        else:
            codes = self.learn_bpe(out)
            spec = {"codes": str(codes)}
            stats["model"] = codes.name
        with Workers(self.workers, spec) as pool:
            for split in SPLITS:
                self._seg_split(split, pool, out, stats)
        return stats

    def _seg_split(self, split: str, pool, out: Path, stats: dict) -> None:
        """Apply the subword model to one split; WMT training pairs are cleaned afterwards
        (fairseq's WMT recipes run clean-corpus-n on the BPE'd text)."""
        r = self.r
        s, t = self.langs()
        prog = Progress(self.log, f"bpe: apply to {split}", "pairs")
        w = Writer(out, split, s, t)
        dropped = collections.Counter()
        clean = split == "train" and r.clean_stage == "bpe"
        for res in pool.map(_seg_job, chunks(self.tok_pairs(split), CHUNK)):
            for x, y in res:
                if clean:
                    why = clean_reason(x, y, r.clean_min, r.clean_max, r.clean_ratio)
                    if why:
                        dropped[why] += 1
                        continue
                w.write(x, y)
            prog.add(len(res))
        w.close()
        stats[split] = w.n
        if clean:
            stats["train_dropped"] = dict(dropped)
        prog.done(f" -> {w.n:,} pairs" + (f" (cleaning dropped {sum(dropped.values()):,}: {dict(dropped)})"
                                          if dropped else ""))

    def learn_bpe(self, out: Path) -> Path:
        from subword_nmt.learn_bpe import learn_bpe
        vocab = collections.Counter()
        prog = Progress(self.log, "bpe: counting words of train src+tgt")
        for lang in self.langs():
            with open(self.ds / "tok" / f"train.{lang}", encoding="utf-8", newline="\n") as f:
                for line in f:
                    vocab.update(line.split())
                    prog.add()
        prog.done(f", {len(vocab):,} word types")
        if not vocab:
            raise DataPrepError("the training data are empty after tokenization and cleaning")
        self.log(f"bpe: learning {self.merges} joint merges (subword-nmt)")
        tmp = out / "code.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            learn_bpe((f"{w} {c}" for w, c in vocab.most_common()), f, self.merges, min_frequency=2, is_dict=True)
        os.replace(tmp, out / "code")
        return out / "code"

    def learn_spm(self, out: Path) -> Path:
        import sentencepiece as spm
        a = self.args
        self.log(f"bpe: training a joint sentencepiece {a.spm_model_type} model, vocabulary {self.merges}")
        if hasattr(spm, "set_random_generator_seed"):
            spm.set_random_generator_seed(1)
        try:
            spm.SentencePieceTrainer.train(
                input=[str(self.ds / "tok" / f"train.{lang}") for lang in self.langs()],
                model_prefix=str(out / "spm"), vocab_size=self.merges, model_type=a.spm_model_type,
                character_coverage=1.0, input_sentence_size=a.spm_input_sentences, shuffle_input_sentence=True,
                hard_vocab_limit=False, num_threads=self.workers, minloglevel=1)
        except (RuntimeError, OSError) as e:
            raise DataPrepError(f"sentencepiece training failed: {e}") from None
        return out / "spm.model"

    # ------------------------------------------------------------------ step bin
    def step_bin(self) -> dict:
        out = self.fresh_partial("bin")
        s, t = self.langs()
        bpe = self.ds / "bpe"
        argv = ["--source-lang", s, "--target-lang", t, "--trainpref", str(bpe / "train"),
                "--validpref", str(bpe / "valid"), "--testpref", str(bpe / "test"), "--destdir", str(out),
                "--joined-dictionary", "--workers", str(self.workers)]
        self.log("bin: fairseq-preprocess " + " ".join(argv))
        from fairseq import options
        from fairseq.data import Dictionary, data_utils
        from fairseq_cli import preprocess as fp
        args = options.get_preprocessing_parser().parse_args(argv)
        before = list(fp.logger.handlers)
        try:
            fp.main(args)
        finally:
            for h in list(fp.logger.handlers):
                if h not in before:
                    fp.logger.removeHandler(h)
                    h.close()
        d = Dictionary.load(str(out / f"dict.{s}.txt"))
        stats = {"dictionary": len(d)}
        want = self.step_info("bpe")["stats"]
        for split in SPLITS:
            for lang in (s, t):
                ds = data_utils.load_indexed_dataset(str(out / f"{split}.{s}-{t}.{lang}"), d)
                if ds is None or len(ds) != want[split]:
                    raise DataPrepError(f"fairseq-preprocess wrote {0 if ds is None else len(ds)} {split}.{lang} "
                                        f"sentences, expected {want[split]}")
            stats[split] = want[split]
        return stats

    # ------------------------------------------------------------------ driver
    def run(self) -> int:
        a, ds = self.args, self.ds
        if a.dry_run:
            self.dry_run()
            return 0
        ds.mkdir(parents=True, exist_ok=True)
        with open(ds / ".lock", "a+") as lockf:
            try:
                fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lockf.seek(0)
                pid = lockf.read().strip() or "?"
                raise DataPrepError(f"another prepare_data.py run (pid {pid}) is working on {ds} "
                                    f"(lock {ds / '.lock'})") from None
            lockf.seek(0)
            lockf.truncate()
            lockf.write(f"{os.getpid()}\n")
            lockf.flush()
            return self._run_locked()

    def _run_locked(self) -> int:
        a, ds = self.args, self.ds
        if (ds / ".done").exists() and not a.force:       # re-checked under the lock
            self.check_config()
            self.log(f"already prepared: {ds / 'bin'}")
            return 0
        if a.force:
            self.wipe()
        self.check_config()
        (ds / "CONFIG.json").write_text(json.dumps(self.config, indent=1) + "\n")
        self.log(f"preparing {self.r.title} in {ds} ({self.workers} workers)")
        self.fetch()
        (ds / "SOURCES.json").write_text(json.dumps(self.sources, indent=1) + "\n")
        if self.step_done("raw"):
            old = self.step_info("raw").get("sources", {})
            new = {k: v["sha256"] for k, v in self.sources.items()}
            if old != new:
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise DataPrepError(f"the archives {', '.join(changed)} differ from those {ds / 'raw'} was built "
                                    "from; pass --force to rebuild the dataset from them")
        all_stats = {}
        for step in STEPS:
            if self.step_done(step):
                self.log(f"{step}: already done, skipped")
            else:
                t0 = time.time()
                self.log(f"{step}: start")
                stats = getattr(self, f"step_{step}")()
                self.finish_step(step, ds / f"{step}.partial", stats, t0)
            all_stats[step] = self.step_info(step)["stats"]
            if a.stop_after == step:
                self.log(f"stopped after {step} as asked (--stop-after); no .done written")
                return 0
        self.write_summary(all_stats)
        return 0

    def check_config(self) -> None:
        f = self.ds / "CONFIG.json"
        if not f.exists():
            return
        old = json.loads(f.read_text())
        started = (self.ds / ".done").exists() or any(
            (self.ds / s).exists() or (self.ds / f"{s}.partial").exists() for s in STEPS)
        if old != self.config and started:
            diff = ", ".join(f"{k}: {old.get(k)!r} -> {self.config.get(k)!r}"
                             for k in sorted(set(old) | set(self.config)) if old.get(k) != self.config.get(k))
            state = "a finished dataset" if (self.ds / ".done").exists() else "unfinished work"
            raise DataPrepError(
                f"{self.ds} holds {state} prepared with other settings ({diff}). Nothing was changed. Pass --force "
                "to delete it and rebuild with the new settings, or use another --data-root.")

    def wipe(self) -> None:
        ds = self.ds
        if (ds / ".done").exists():
            (ds / ".done").unlink()         # first: the directory must never look complete
        self.log(f"--force: deleting the prepared data in {ds}")
        for step in STEPS:
            for p in (ds / step, ds / f"{step}.partial"):
                if p.exists():
                    shutil.rmtree(p)
        for f in ("CONFIG.json", "SOURCES.json", "STATS.json"):
            if (ds / f).exists():
                (ds / f).unlink()

    def write_summary(self, all_stats: dict) -> None:
        r = self.r
        sizes = {split: all_stats["bin"][split] for split in SPLITS}
        comparison = {}
        for split in SPLITS:
            comparison[split] = {"ours": sizes[split], "paper": r.paper_sizes.get(split)}
            if split in r.expected:
                comparison[split]["expected"] = r.expected[split]
                comparison[split]["matches"] = r.expected[split] == sizes[split]
        summary = {"config": self.config, "sizes": sizes, "dictionary": all_stats["bin"]["dictionary"],
                   "comparison_with_paper": comparison, "steps": all_stats, "notes": r.notes}
        tmp = self.ds / "STATS.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1) + "\n")
        os.replace(tmp, self.ds / "STATS.json")
        self.log(f"finished: {self.ds / 'bin'} (joined dictionary {summary['dictionary']:,} types)")
        for split in SPLITS:
            c = comparison[split]
            flag = "" if "expected" not in c else ("  (= paper)" if c["matches"] else
                                                   f"  (paper/recipe: {c['expected']:,}; differs)")
            self.log(f"  {split:5s} {c['ours']:>11,} sentence pairs; paper: {c['paper']}{flag}")
        done = {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "sizes": sizes}
        (self.ds / ".done.tmp").write_text(json.dumps(done) + "\n")
        os.replace(self.ds / ".done.tmp", self.ds / ".done")


class SummarizationJob(Job):
    """CNN/DailyMail for MSC Appendix A (``cnndm``): story archives + See et al.'s URL lists ->
    ``raw/<split>.jsonl`` (parsed stories, URL-list order) -> ``tok/<split>.{article,summary}``
    (Moses-tokenized, lowercased, See et al.'s period fix, ``<q>`` between summary sentences)
    -> ``bpe/`` (joint BPE; articles truncated to their first 640 subword tokens) -> ``bin/``.
    The choices are in deepnmt_fairseq/repro/cnndm.py and docs/data-preparation.md."""

    def __init__(self, args, recipe):
        super().__init__(args, recipe)
        if args.spm:
            raise DataPrepError("--spm is not offered for cnndm (joint BPE, subword-nmt)")
        self.max_doc = args.max_doc_tokens or recipe.max_doc_tokens
        self.config["max_doc_tokens"] = self.max_doc

    def describe_steps(self) -> list:
        r = self.r
        return [
            ("raw", "read " + ", ".join(corpora.ARCHIVES[k].filename for k in r.stories) + " and the URL lists "
                    + ", ".join(corpora.ARCHIVES[r.url_lists[s]].filename for s in SPLITS)
                    + "; story = sha1(URL).story; article lines / @highlight sentences (See et al.)"),
            ("tok", "Moses tokenizer (sacremoses, en, escape=False; CoreNLP's PTB tokenizer in See et al.), "
                    "lowercased, See et al.'s missing-period fix; summary sentences joined with "
                    f"{cnndm.SENT_SEP}; empty articles or summaries dropped"),
            ("bpe", f"joint BPE, subword-nmt, {self.merges} merges learned on train article+summary; articles "
                    f"truncated to their first {self.max_doc} subword tokens"),
            ("bin", f"fairseq-preprocess --source-lang {r.src} --target-lang {r.tgt} --joined-dictionary "
                    f"--workers {self.workers}"),
        ]

    def step_raw(self) -> dict:
        r = self.r
        out = self.fresh_partial("raw")
        where = {}          # story hash -> (split, position)
        order = {}
        for split in SPLITS:
            path = self.archives[r.url_lists[split]]
            with open(path, encoding="utf-8") as f:
                hashes = cnndm.read_url_list(f)
            if not hashes:
                raise DataPrepError(f"the {split} URL list {path} is empty")
            for i, h in enumerate(hashes):
                if h in where:
                    raise DataPrepError(f"URL lists: story {h} is listed twice ({where[h][0]} and {split})")
                where[h] = (split, i)
            order[split] = hashes
        stats = {"url_lists": {s: len(order[s]) for s in SPLITS}, "archives": {}}
        offsets = {}
        blob = out / "stories.jsonl.tmp"
        with open(blob, "w", encoding="utf-8", newline="\n") as fout:
            for key in r.stories:
                path, n = self.archives[key], 0
                self.log(f"raw: reading {path}")
                prog = Progress(self.log, f"raw: {path.name}", "stories")
                try:
                    with tarfile.open(path, mode="r|*") as tar:
                        for m in tar:
                            base = m.name.rsplit("/", 1)[-1]
                            if not m.isfile() or not base.endswith(".story") or base[:-6] not in where:
                                continue
                            h = base[:-6]
                            data = tar.extractfile(m).read()
                            try:
                                text = data.decode("utf-8", errors="replace" if self.args.allow_invalid_utf8
                                                   else "strict")
                            except UnicodeDecodeError as e:
                                raise DataPrepError(f"{path.name}:{m.name} is not valid UTF-8 ({e}); "
                                                    "--allow-invalid-utf8 replaces bad bytes") from None
                            article, highlights = cnndm.parse_story(text)
                            offsets[h] = fout.tell()
                            fout.write(json.dumps({"id": h, "article": article, "highlights": highlights},
                                                  ensure_ascii=False) + "\n")
                            n += 1
                            prog.add()
                except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as e:
                    raise ArchiveReader(path, corpora.ARCHIVES[key])._corrupt(e) from None
                prog.done()
                stats["archives"][key] = n
        missing = [h for h in where if h not in offsets]
        if missing:
            raise DataPrepError(f"{len(missing):,} stories of the URL lists are in none of the archives "
                                f"(e.g. {', '.join(m + '.story' for m in missing[:3])}); are the archives "
                                "complete (cnn_stories.tgz and dailymail_stories.tgz)?")
        with open(blob, "rb") as fin:
            for split in SPLITS:
                with open(out / f"{split}.jsonl.tmp", "wb") as f:
                    for h in order[split]:
                        fin.seek(offsets[h])
                        f.write(fin.readline())
                os.replace(out / f"{split}.jsonl.tmp", out / f"{split}.jsonl")
                stats[split] = len(order[split])
        blob.unlink()
        return stats

    def step_tok(self) -> dict:
        out = self.fresh_partial("tok")
        spec = {"tok": True, "langs": ("en",), "lowercase": False, "aggressive": False, "normalize": False}
        stats = {}
        s, t = self.langs()
        with Workers(self.workers, spec) as pool:
            for split in SPLITS:
                prog = Progress(self.log, f"tok: {split}", "stories")
                w = Writer(out, split, s, t)
                dropped = collections.Counter()

                def stories(split=split):
                    with open(self.ds / "raw" / f"{split}.jsonl", encoding="utf-8") as f:
                        for line in f:
                            yield json.loads(line)

                for res in pool.map(_story_job, chunks(stories(), 500)):
                    for art, summ in res:
                        if not art or not summ:
                            dropped["empty article" if not art else "empty summary"] += 1
                            continue
                        w.write(art, summ)
                    prog.add(len(res))
                w.close()
                stats[split] = w.n
                stats[f"{split}_dropped"] = dict(dropped)
                prog.done(f" -> {w.n:,} pairs" + (f" (dropped {dict(dropped)})" if dropped else ""))
        return stats

    def _seg_split(self, split: str, pool, out: Path, stats: dict) -> None:
        """Apply BPE to one split and truncate every article to its first max_doc_tokens subword tokens."""
        n_max = self.max_doc
        s, t = self.langs()
        prog = Progress(self.log, f"bpe: apply to {split}", "pairs")
        w = Writer(out, split, s, t)
        truncated = 0
        for res in pool.map(_seg_job, chunks(self.tok_pairs(split), CHUNK)):
            for x, y in res:
                if len(x.split()) > n_max:
                    truncated += 1
                    x = cnndm.truncate(x, n_max)
                w.write(x, y)
            prog.add(len(res))
        w.close()
        stats[split] = w.n
        stats[f"{split}_truncated"] = truncated
        prog.done(f" -> {w.n:,} pairs ({truncated:,} articles truncated to {n_max} subword tokens)")


def _story_job(stories):
    mt = _W["mt"]["en"]

    def tokenize(line):
        return mt.tokenize(line, escape=False, return_str=True)

    return [cnndm.make_pair(st["article"], st["highlights"], tokenize) for st in stories]


class Writer:
    """Writes a parallel split as ``<split>.<src>`` / ``<split>.<tgt>`` (temp names, renamed on close)."""

    def __init__(self, out: Path, split: str, s: str, t: str):
        self.out, self.split, self.n = out, split, 0
        self.names = [out / f"{split}.{s}", out / f"{split}.{t}"]
        self.fs = [open(str(p) + ".tmp", "w", encoding="utf-8", newline="\n") for p in self.names]

    def write(self, a: str, b: str) -> None:
        self.fs[0].write(a + "\n")
        self.fs[1].write(b + "\n")
        self.n += 1

    def close(self) -> None:
        for f, p in zip(self.fs, self.names):
            f.close()
            os.replace(str(p) + ".tmp", p)


# ============================================================================ CLI
def list_corpora() -> None:
    for r in corpora.RECIPES.values():
        if getattr(r, "kind", "") == "summarization":
            print(f"{r.name:24s} {r.src}->{r.tgt}  {r.title}")
            print(f"{'':24s} paper: {r.papers}; sizes: " + ", ".join(f"{k} {v}" for k, v in r.paper_sizes.items()))
            print(f"{'':24s} default subwords: {r.bpe_merges}; documents truncated to {r.max_doc_tokens} subword "
                  f"tokens; archives: " + ", ".join(corpora.ARCHIVES[k].filename for k in r.archive_keys()))
            continue
        print(f"{r.name:24s} {r.src}->{r.tgt}  {r.title}")
        print(f"{'':24s} paper: {r.papers}; sizes: " + ", ".join(f"{k} {v}" for k, v in r.paper_sizes.items()))
        print(f"{'':24s} default subwords: {r.bpe_merges}; valid: "
              + (" + ".join(p.name for p in r.valid) if r.valid else f"every {nth(r.valid_every)} training line")
              + "; test: " + " + ".join(p.name for p in r.test))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Prepare the papers' corpora (IWSLT14/17, WMT14/15) for fairseq: download or --from-dir, "
                    "Moses tokenization, joint BPE (or sentencepiece), fairseq-preprocess --joined-dictionary. "
                    "See docs/data-preparation.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("name", nargs="?", choices=list(corpora.RECIPES), metavar="NAME",
                   help="corpus to prepare: " + ", ".join(corpora.RECIPES) + " (--list: papers, splits, sizes)")
    p.add_argument("--list", action="store_true", help="list the corpora and exit")
    p.add_argument("--data-root", default=os.environ.get("DEEPNMT_DATA", str(REPO / "work" / "data")),
                   help="output root (env DEEPNMT_DATA); the dataset goes to DATA_ROOT/NAME")
    p.add_argument("--from-dir", default=None,
                   help="take the archives from this directory (clusters without internet; --dry-run lists the "
                        "file names) instead of downloading them")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="processes for tokenization, subword segmentation and fairseq-preprocess")
    p.add_argument("--spm", action="store_true",
                   help="sentencepiece instead of subword-nmt BPE (joint model trained on the tokenized train "
                        "src+tgt; vocabulary size = --bpe-merges)")
    p.add_argument("--spm-model-type", choices=("unigram", "bpe"), default="unigram",
                   help="sentencepiece model type with --spm")
    p.add_argument("--spm-input-sentences", type=int, default=10_000_000,
                   help="with --spm: train on a random sample of this many sentences (0 = all)")
    p.add_argument("--bpe-merges", type=int, default=None,
                   help="BPE merge operations (with --spm: vocabulary size); default: the paper's value "
                        "(MSC Sec. 4.1: IWSLT 10k, WMT14 En-De 32k; deep-decoder paper Sec. 4.1: 40k; "
                        "transparent attention Sec. 4: Cs-En 32k; GPKD: 32k)")
    p.add_argument("--max-doc-tokens", type=int, default=None,
                   help="cnndm: truncate every article to its first N subword tokens (default: MSC Appendix A's "
                        "640)")
    p.add_argument("--force", action="store_true",
                   help="delete an existing (finished or differently configured) dataset and rebuild it")
    p.add_argument("--dry-run", action="store_true", help="show what would be done and exit")
    p.add_argument("--stop-after", choices=STEPS[:-1], default=None,
                   help="stop after this step (inspect the text before binarizing); .done is not written")
    p.add_argument("--allow-invalid-utf8", action="store_true",
                   help="replace undecodable bytes with U+FFFD instead of stopping (keeps the alignment)")
    p.add_argument("--ignore-checksums", action="store_true",
                   help="continue when an archive does not match its known checksum (recorded in SOURCES.json)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        list_corpora()
        return 0
    if not args.name:
        build_parser().error("NAME is required (or --list)")
    if args.max_doc_tokens is not None and args.max_doc_tokens < 1:
        build_parser().error("--max-doc-tokens must be positive")
    if args.bpe_merges is not None and args.bpe_merges < 1:
        build_parser().error("--bpe-merges must be positive")
    if args.from_dir and not Path(args.from_dir).is_dir():
        print(f"prepare_data: error: --from-dir {args.from_dir} is not a directory", file=sys.stderr)
        return 2
    recipe = corpora.RECIPES[args.name]
    job = (SummarizationJob if getattr(recipe, "kind", "") == "summarization" else Job)(args, recipe)
    try:
        return job.run()
    except DataPrepError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prepare_data: interrupted; finished steps are kept, a re-run continues from there", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
