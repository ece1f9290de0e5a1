"""Tokenization and subword segmentation in worker processes: the per-process state
(Moses tokenizer and punctuation normalizer, BPE codes or sentencepiece model), the jobs the
workers run, and the pool that returns their results in input order."""

from __future__ import annotations

import collections
import inspect

from .. import cnndm
from .text import norm_ws

CHUNK = 5000          # pairs per worker job (read when ``chunks`` is called)

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


def chunks(it, n: int | None = None):
    """Lists of ``n`` items (default :data:`CHUNK`) of ``it``, the last one shorter."""
    n = n or CHUNK
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) == n:
            yield buf
            buf = []
    if buf:
        yield buf


def _story_job(stories):
    mt = _W["mt"]["en"]

    def tokenize(line):
        return mt.tokenize(line, escape=False, return_str=True)

    return [cnndm.make_pair(st["article"], st["highlights"], tokenize) for st in stories]
