"""Paired statistics of the evidence study over test sentences (issue: evidence round 2, section 4).

Each run's evaluation (``study/evaluate.py``) keeps, next to its test BLEU, the sufficient statistics of
sacreBLEU for every test sentence (the record's ``test_stats``, :func:`encode_stats`: hypothesis length,
reference length, matched and total 1- to 4-grams; :func:`sentence_stats`).  Records made before
this have none: their comparisons get no paired test.  From them :func:`paired_bootstrap` resamples the test
set (Koehn 2004, the test of ``sacrebleu --paired-bs``): in each of ``samples`` resamples the same
sentences are drawn for both systems, each system's corpus BLEU is computed on them for every seed
and averaged over its seeds, and the difference is recorded.  ``p`` is the share of resamples whose
difference does not have the sign of the observed one (plus one, over samples plus one); the 95%
interval is the 2.5th to 97.5th percentile of the resampled differences.

Evidence round 3 adds the seed-level test of a call, :func:`seed_bootstrap`: a hierarchical
bootstrap that resamples each system's seeds, then the test sentences (the sentence bootstrap alone
treats the seeds as fixed, so one outlying seed can carry its p).

The resampling seed is fixed, so a report regenerated from the same records prints the same p.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

# the paired bootstrap lives with the one scorer (benchmarks use it too); named here for the study
from deepnmt_fairseq.scoring import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, _bleu_rows, paired_bootstrap  # noqa: E402,F401
#: a difference is significant over the test sentences when p is below this
ALPHA = 0.05


def sentence_stats(hyps: Sequence[str], refs: Sequence[str]) -> List[List[int]]:
    """sacreBLEU's per-sentence statistics (:func:`deepnmt_fairseq.scoring.sentence_stats`: 13a
    tokenization, as ``corpus_bleu``): one list of 10 ints per sentence, [hyp length, ref length,
    matches 1..4, totals 1..4]."""
    from deepnmt_fairseq.scoring import sentence_stats as stats

    return stats(hyps, refs)


def encode_stats(stats: Sequence[Sequence[int]]) -> str:
    """The statistics as one line of a record: sentences separated by ';', numbers by spaces."""
    return ";".join(" ".join(str(int(x)) for x in row) for row in stats)


def decode_stats(text: Optional[str]) -> Optional[List[List[int]]]:
    if not text:
        return None
    return [[int(x) for x in row.split()] for row in text.split(";")]


def bleu_from_stats(totals) -> float:
    """Corpus BLEU of summed statistics (:func:`deepnmt_fairseq.scoring.bleu_from_stats`)."""
    from deepnmt_fairseq.scoring import bleu_from_stats as bleu

    return bleu(totals)


#: the seed-level test (evidence round 3): a hierarchical bootstrap, seeds then sentences
SEED_SAMPLES = 1000


def seed_bootstrap(a: Sequence[Sequence[Sequence[int]]], b: Sequence[Sequence[Sequence[int]]],
                   samples: int = SEED_SAMPLES, seed: int = BOOTSTRAP_SEED,
                   scores: Optional[Tuple[Sequence[float], Sequence[float]]] = None) -> Optional[dict]:
    """The seed-level test of a call (evidence round 3): a hierarchical bootstrap that resamples the
    seeds of each system (with replacement, as many as it has), then the test sentences (the same
    draws for both systems, as :func:`paired_bootstrap`), and takes the difference of the two
    resampled seed means.  ``p`` is the share of resamples whose difference does not have the
    observed sign (plus one, over samples plus one).  A difference that one seed carries (an
    outlier) changes sign whenever that seed is not drawn; one that every seed shows does not.

    Without sentence statistics (``a`` or ``b`` None or incomplete), ``scores`` (each seed's BLEU of
    both systems) are resampled over seeds alone.  None when neither is available or a system has
    fewer than 2 seeds.  With 3 seeds a system has 10 distinct resampled seed sets and the bootstrap
    underestimates the variance over seeds by a factor (n - 1) / n: it is a necessary condition, not
    a sufficient one, and the report's rule adds the spreads and the narrow label."""
    import numpy as np

    rng = np.random.default_rng(seed)
    have_stats = (a and b and not any(s is None for s in (*a, *b))
                  and len({len(s) for s in (*a, *b)}) == 1 and len(a[0]) > 0)
    if have_stats:
        n = len(a[0])
        counts = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(samples)]).astype(np.float64)
        obs = [[_bleu_rows(np.asarray(s, dtype=np.float64).sum(0, keepdims=True))[0] for s in side] for side in (a, b)]
        # res[side]: seeds x samples, each seed's BLEU on each resample of the sentences
        res = [np.stack([_bleu_rows(counts @ np.asarray(s, dtype=np.float64)) for s in side]) for side in (a, b)]
    elif scores is not None and all(len(s) > 0 for s in scores):
        obs = [list(map(float, s)) for s in scores]
        res = [np.repeat(np.asarray(s, dtype=np.float64)[:, None], samples, axis=1) for s in obs]
        n = None
    else:
        return None
    if min(len(obs[0]), len(obs[1])) < 2:
        return None
    means = []
    for side in res:
        k = side.shape[0]
        pick = rng.integers(0, k, (samples, k))  # the seeds drawn in each resample
        means.append(np.take_along_axis(side.T, pick, axis=1).mean(1))
    diffs = means[0] - means[1]
    delta = float(np.mean(obs[0]) - np.mean(obs[1]))
    against = np.sum(diffs <= 0) if delta > 0 else np.sum(diffs >= 0)
    return {"delta": round(delta, 2), "p": round(float((against + 1) / (samples + 1)), 4),
            "low": round(float(np.percentile(diffs, 2.5)), 2), "high": round(float(np.percentile(diffs, 97.5)), 2),
            "samples": samples, "sentences": n, "seeds": (len(obs[0]), len(obs[1]))}
