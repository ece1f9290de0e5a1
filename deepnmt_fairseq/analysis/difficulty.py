"""Difficulty-split test sets (MSC, Wei et al. 2020, Sec. 4.3, Eq. 14-15, Fig. 3): the fairseq-free part.

    s(x, y) = E[-log P(y|x; Theta)] + Std[-log P(y|x; Theta)]                 (Eq. 14)
    E[...] ~ 1/K sum_k -log P(y|x; Theta^(k))   over the last K checkpoints   (Eq. 15)

-log P(y|x) is the sentence negative log-likelihood, *summed* over the target
tokens (the end-of-sentence token included), in nats, teacher-forced, without
label smoothing.  The paper does not say which standard deviation: we use the
population one (ddof = 0), defined for K = 1 (then s is the plain NLL).

The test set is ordered by s (ties by sentence id) and cut into four equal parts,
"Simple", "Ordinary", "Difficult", "Challenging"; sizes differ by at most one
(the first parts take the extra sentences).
"""

from __future__ import annotations

import math
import re
from typing import Dict, List, Optional, Sequence

PARTS = ("simple", "ordinary", "difficult", "challenging")
PART_TITLES = {"simple": "Simple", "ordinary": "Ordinary", "difficult": "Difficult", "challenging": "Challenging"}


def difficulty_scores(nll: Sequence[Sequence[float]]) -> List[Dict[str, float]]:
    """``nll[k][i]`` = -log P(y_i|x_i; Theta^(k)) -> per sentence {mean, std, score} (Eq. 14-15)."""
    if not nll:
        raise ValueError("no checkpoints scored")
    n = len(nll[0])
    if any(len(row) != n for row in nll):
        raise ValueError("every checkpoint must score the same sentences")
    k = len(nll)
    out = []
    for i in range(n):
        vals = [float(row[i]) for row in nll]
        mean = sum(vals) / k
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / k)
        out.append({"mean": mean, "std": std, "score": mean + std})
    return out


def split_by_score(scores: Sequence[float], parts: int = len(PARTS)) -> List[List[int]]:
    """Sentence ids ordered by score (ties: id), cut into ``parts`` parts whose sizes differ by <= 1."""
    n = len(scores)
    if n < parts:
        raise ValueError(f"cannot split {n} sentences into {parts} parts")
    order = sorted(range(n), key=lambda i: (scores[i], i))
    base, extra = divmod(n, parts)
    out, start = [], 0
    for p in range(parts):
        size = base + (1 if p < extra else 0)
        out.append(order[start:start + size])
        start += size
    return out


def read_hypotheses(path: str, n: Optional[int] = None) -> List[str]:
    """Hypotheses in test order from a fairseq-generate output (``D-``/``H-`` lines; the detokenized
    ``D-`` line is preferred, the first hypothesis per id) or a plain file with one line per sentence."""
    with open(path, encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f]
    tagged = re.compile(r"^([DH])-(\d+)\t")
    d: Dict[int, str] = {}
    h: Dict[int, str] = {}
    for line in lines:
        m = tagged.match(line)
        if m:
            parts = line.split("\t")
            text = parts[2] if len(parts) > 2 else ""
            target = d if m.group(1) == "D" else h
            target.setdefault(int(m.group(2)), text)
    if d or h:
        got = {**h, **d}  # per sentence: the D- line where present
        size = n if n is not None else (max(got) + 1)
        missing = [i for i in range(size) if i not in got]
        if missing:
            raise ValueError(f"{path}: fairseq-generate output lacks {len(missing)} of {size} sentences "
                             f"(e.g. id {missing[0]}); generate with --required-batch-size-multiple 1 and "
                             f"no --max-len/size filtering")
        return [got[i] for i in range(size)]
    if n is not None and len(lines) != n:
        raise ValueError(f"{path}: {len(lines)} lines but the test set has {n} sentences")
    return lines


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a") -> float:
    """sacreBLEU of ``hyps`` (the one scorer, :func:`deepnmt_fairseq.scoring.corpus_bleu`)."""
    from ..scoring import corpus_bleu as sacrebleu

    return float(sacrebleu(hyps, refs, tokenize=tokenize).score)


def bleu_by_part(hyps: Sequence[str], refs: Sequence[str], parts: Dict[str, Sequence[int]],
                 tokenize: str = "13a") -> Dict[str, float]:
    """sacreBLEU of each part (and of the whole set under "all")."""
    out = {name: corpus_bleu([hyps[i] for i in ids], [refs[i] for i in ids], tokenize)
           for name, ids in parts.items()}
    out["all"] = corpus_bleu(hyps, refs, tokenize)
    return out
