"""The one scorer: hypotheses and references -> sacreBLEU (with its signature) and the project's
other metrics.  Every module that scores calls this one (the only importer of ``sacrebleu``):
``deepnmt-repro evaluate``, the quickstart, ``deepnmt-distill``'s report, the GPKD pipeline, the
difficulty analysis and the evidence study.  (fairseq-generate output is read by
:func:`deepnmt_fairseq.generate_output.parse_generate`, fairseq-train logs by
:mod:`deepnmt_fairseq.analysis.logs`; decoding is :mod:`deepnmt_fairseq.jobs.decode`.)

* **sacreBLEU** (:func:`corpus_bleu`): sacreBLEU's corpus BLEU with its options (default: 13a
  tokenization, ``exp`` smoothing, as ``sacrebleu.corpus_bleu``), returned with its signature;
  :func:`sentence_stats` / :func:`bleu_from_stats`: its statistics per sentence and the corpus BLEU
  of summed statistics (the evidence study's paired bootstrap);
* **tokenized BLEU** (``multi-bleu.perl``): corpus BLEU over whitespace tokens of the
  Moses-tokenized hypothesis and reference, no smoothing, ``-lc`` lowercases both.
  Computed with sacrebleu's API (``tokenize='none'``, ``smooth_method='none'``), which is
  the same formula; :func:`multi_bleu` is an independent port of multi-bleu.perl's
  algorithm used to check that (tests/test_experiments.py).
* **compound splitting** (WMT En-De, Vaswani et al. 2017 and after):
  ``s/(\\S)-(\\S)/\\1 ##AT##-##AT## \\2/g`` on hypothesis and reference before tokenized
  BLEU (the ``compound_split_bleu.sh`` convention).
* **detokenized sacreBLEU**: hypotheses detokenized with sacremoses (after joining
  aggressive-hyphen tokens ``@-@``), scored against the raw reference with sacreBLEU's
  default 13a tokenization; the signature is reported.  ``fairseq-score --sacrebleu`` is
  broken in fairseq 0.12, so sacrebleu's Python API is used.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

_COMPOUND = re.compile(r"(\S)-(\S)")
_AT_JOIN = re.compile(r" ?@([^@\s]{1,3})@ ?")


def compound_split(line: str) -> str:
    """``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` (same left-to-right, non-overlapping
    matching: ``a-b-c`` -> ``a ##AT##-##AT## b-c``, exactly as perl)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


@dataclass(frozen=True)
class Bleu:
    """A corpus BLEU: sacreBLEU's result (``result``, a ``BLEUScore``: ``score``, ``counts``,
    ``totals``, ... read through) and the metric's signature."""

    result: object
    signature: str

    def __getattr__(self, name: str):
        if name in ("result", "signature") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.result, name)

    def __str__(self) -> str:
        return str(self.result)


def _metric(tokenize: Optional[str] = None, lowercase: bool = False, smooth_method: str = "exp",
            force: bool = False):
    from sacrebleu.metrics import BLEU

    kw = {} if tokenize is None else {"tokenize": tokenize}
    return BLEU(lowercase=lowercase, smooth_method=smooth_method, force=force, **kw)


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str], tokenize: Optional[str] = None, lowercase: bool = False,
                smooth_method: str = "exp", force: bool = False) -> Bleu:
    """sacreBLEU's corpus BLEU of ``hyps`` against one reference each (``tokenize``: sacreBLEU's
    tokenizer, its default 13a when None; the other options as sacreBLEU's), with its signature.
    The defaults are ``sacrebleu.corpus_bleu``'s and ``sacrebleu.BLEU()``'s."""
    metric = _metric(tokenize, lowercase, smooth_method, force)
    return Bleu(metric.corpus_score(list(hyps), [list(refs)]), str(metric.get_signature()))


def sentence_stats(hyps: Sequence[str], refs: Sequence[str]) -> List[List[int]]:
    """sacreBLEU's per-sentence statistics (13a tokenization, as :func:`corpus_bleu`): one list of 10
    ints per sentence, [hyp length, ref length, matches 1..4, totals 1..4]."""
    return [[int(x) for x in row] for row in _metric()._extract_corpus_statistics(list(hyps), [list(refs)])]


def bleu_from_stats(totals) -> float:
    """Corpus BLEU of summed statistics (sacreBLEU's formula: exp smoothing, brevity penalty)."""
    return float(_metric()._compute_score_from_stats([int(x) for x in totals]).score)


#: the paired bootstrap's resamples and seed (the evidence study's and the serve study's)
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345


def _bleu_rows(sums):
    """Corpus BLEU of each row of summed statistics: sacreBLEU's formula with its default 'exp'
    smoothing (an n-gram order without a match counts 1 / (2^k * total), k the number of such
    orders so far) and brevity penalty, vectorised over the rows."""
    import numpy as np

    sums = np.asarray(sums, dtype=np.float64)
    hyp, ref = sums[:, 0], sums[:, 1]
    smooth = np.ones(len(sums))
    logs = np.zeros(len(sums))
    for k in range(4):
        match, total = sums[:, 2 + k], sums[:, 6 + k]
        safe_total = np.where(total > 0, total, 1.0)
        zero = (match == 0) & (total > 0)
        smooth = np.where(zero, smooth * 2, smooth)
        prec = np.where(total > 0, np.where(zero, 1.0 / (smooth * safe_total), match / safe_total), 0.0)
        with np.errstate(divide="ignore"):
            logs = logs + np.log(prec)
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(hyp < ref, np.exp(1 - ref / np.where(hyp > 0, hyp, 1.0)), 1.0)
        score = 100 * bp * np.exp(logs / 4)
    return np.where((hyp > 0) & np.isfinite(score), score, 0.0)


def paired_bootstrap(a: Sequence[Sequence[Sequence[int]]], b: Sequence[Sequence[Sequence[int]]],
                     samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> Optional[dict]:
    """System A (its seeds' sentence statistics) against system B on the same test sentences:
    {"delta": seed-mean BLEU of A - of B, "p", "low", "high", "samples", "sentences"}; None when a
    seed's statistics are missing or the runs were evaluated on different test sets."""
    import numpy as np

    if not a or not b or any(s is None for s in (*a, *b)):
        return None
    n = len(a[0])
    if n == 0 or any(len(s) != n for s in (*a, *b)):
        return None
    rng = np.random.default_rng(seed)
    # counts[r, i]: how often sentence i is drawn in resample r (the same draws for both systems)
    counts = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(samples)]).astype(np.float64)

    def seed_mean(system):
        observed = np.mean([_bleu_rows(np.asarray(s, dtype=np.float64).sum(0, keepdims=True))[0] for s in system])
        resampled = np.mean([_bleu_rows(counts @ np.asarray(s, dtype=np.float64)) for s in system], axis=0)
        return observed, resampled

    obs_a, res_a = seed_mean(a)
    obs_b, res_b = seed_mean(b)
    delta = float(obs_a - obs_b)
    diffs = res_a - res_b
    against = np.sum(diffs <= 0) if delta > 0 else np.sum(diffs >= 0)
    return {"delta": round(delta, 2), "p": round(float((against + 1) / (samples + 1)), 4),
            "low": round(float(np.percentile(diffs, 2.5)), 2), "high": round(float(np.percentile(diffs, 97.5)), 2),
            "samples": samples, "sentences": n}


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def multi_bleu(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False) -> float:
    """multi-bleu.perl's corpus BLEU (one reference), unrounded, in percent.

    Per sentence: clipped n-gram matches and hypothesis n-gram counts for n = 1..4,
    the reference length; corpus BLEU = BP * exp(mean_n log(correct_n / total_n)) with
    BP = exp(1 - ref_len / hyp_len) if hyp_len < ref_len; a zero precision gives 0
    (multi-bleu's ``my_log(0) = -9999999999``)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    correct, total = [0] * 5, [0] * 5
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs):
        if lowercase:
            h, r = h.lower(), r.lower()
        ht, rt = h.split(), r.split()
        hyp_len += len(ht)
        ref_len += len(rt)
        for n in range(1, 5):
            hc, rc = _ngrams(ht, n), _ngrams(rt, n)
            total[n] += sum(hc.values())
            correct[n] += sum(min(c, rc[g]) for g, c in hc.items())
    if ref_len == 0 or hyp_len == 0:
        return 0.0
    logs = []
    for n in range(1, 5):
        p = correct[n] / total[n] if total[n] else 0.0
        if p == 0:
            return 0.0
        logs.append(math.log(p))
    bp = math.exp(1 - ref_len / hyp_len) if hyp_len < ref_len else 1.0
    return 100.0 * bp * math.exp(sum(logs) / 4)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False):
    """sacreBLEU equal to multi-bleu.perl (tokenize none, no smoothing)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    return corpus_bleu(hyps, refs, tokenize="none", lowercase=lowercase, smooth_method="none", force=True)


def join_at_tokens(line: str) -> str:
    """Undo aggressive-hyphen splitting: ``a @-@ b`` -> ``a-b`` (and ``@,@`` etc.)."""
    return _AT_JOIN.sub(r"\1", line)


def detokenize(lines: Sequence[str], lang: str, join_at: bool = True) -> List[str]:
    """Moses detokenization (sacremoses) of tokenized lines; ``join_at``: aggressive-hyphen tokens
    (``@-@``) joined first (:func:`join_at_tokens`)."""
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    return [md.detokenize((join_at_tokens(ln) if join_at else ln).split()) for ln in lines]


def detok_sacrebleu(hyps_tok: Sequence[str], raw_refs: Sequence[str], lang: str, lowercase: bool = False):
    """(score, signature, detokenized hypotheses)."""
    if len(hyps_tok) != len(raw_refs):
        raise ValueError(f"{len(hyps_tok)} hypotheses but {len(raw_refs)} references")
    detok = detokenize(hyps_tok, lang)
    bleu = corpus_bleu(detok, raw_refs, lowercase=lowercase)
    return bleu.result, bleu.signature, detok


# ---------------------------------------------------------------------- by sentence id
def ordered(table: Dict[int, str], n: Optional[int] = None) -> Tuple[List[str], List[int]]:
    """Values in sentence-id order and the ids missing from 0..n-1."""
    n = (max(table) + 1 if table else 0) if n is None else n
    missing = [i for i in range(n) if i not in table]
    return [table.get(i, "") for i in range(n)], missing
