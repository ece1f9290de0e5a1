"""Build the vocabulary shortlist (CTranslate2's ``vmap.txt``) of an export from the training data.

``deepnmt-export-ct2 ... --vmap`` writes, next to the model, for every source subword token s of the
training data the ``per_token`` target tokens t with the highest Dice coefficient

    dice(s, t) = 2 c(s, t) / (c(s) + c(t))

where c(s, t) is the number of training pairs whose source holds s and whose target holds t and c(.)
the number of pairs holding the token; and, always allowed, the ``frequent`` most frequent target
tokens (by pairs).  Our choice: CTranslate2 reads any map of this format and the issue asks for one
"built from the training data"; the usual lexical shortlists (Marian's) take p(t|s) from a word
aligner, which this project does not ship.  Co-occurrence alone ranks the frequent target tokens
first for every s (they co-occur with everything); Dice ranks the tokens that occur *with* s, and the
frequent ones are covered by the always-allowed list.  The first ``max_pairs`` training pairs are
read (the counts are exact over them; a larger corpus gives the same map up to rare tokens).

Exactness: the export without ``--vmap`` is the model; with it, the shortlist is one more file and
``deepnmt-translate --no-vmap`` translates as without it.  What the shortlist costs is measured on
the full model's hypotheses (:func:`deepnmt_deploy.vmap.lost_tokens`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, List, Sequence, Tuple

import numpy as np

logger = logging.getLogger("deepnmt_fairseq.deploy")

from deepnmt_deploy.vmap import FREQUENT, MAX_PAIRS, PER_TOKEN


def _merge(codes: np.ndarray, counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sum the counts of equal codes (sorted unique codes, their totals)."""
    uniq, inverse = np.unique(codes, return_inverse=True)
    return uniq, np.bincount(inverse, weights=counts, minlength=uniq.size).astype(np.int64)


def cooccurrence(pairs: Iterable[Tuple[Sequence[int], Sequence[int]]], n_src: int, n_tgt: int,
                 block_size: int = 20_000_000):
    """``(codes, c(s,t), c(s), c(t), pairs read)`` over the token *types* of each pair: ``codes`` the
    sorted ``s * n_tgt + t`` that occur, ``c(s,t)`` their pair counts (vectorized, in blocks)."""
    src_df, tgt_df = np.zeros(n_src, dtype=np.int64), np.zeros(n_tgt, dtype=np.int64)
    codes, counts = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    block: List[np.ndarray] = []
    size = n = 0

    def flush():
        nonlocal codes, counts
        if block:
            new = np.concatenate(block)
            codes, counts = _merge(np.concatenate([codes, new]),
                                   np.concatenate([counts, np.ones(new.size, dtype=np.int64)]))
            block.clear()

    for src, tgt in pairs:
        s = np.unique(np.asarray(src, dtype=np.int64))
        t = np.unique(np.asarray(tgt, dtype=np.int64))
        src_df[s] += 1
        tgt_df[t] += 1
        block.append((s[:, None] * n_tgt + t[None, :]).reshape(-1))
        size += s.size * t.size
        n += 1
        if size > block_size:
            flush()
            size = 0
    flush()
    return codes, counts, src_df, tgt_df, n


def shortlist(pairs, src_words: Sequence[str], tgt_words: Sequence[str], skip_src: Sequence[int] = (),
              skip_tgt: Sequence[int] = (), per_token: int = PER_TOKEN, frequent: int = FREQUENT) -> List[str]:
    """The lines of a ``vmap.txt``: first the always-allowed (empty n-gram) line, then one line per
    source token seen in ``pairs`` (``(source ids, target ids)``), in the source vocabulary's order."""
    if per_token < 1 or frequent < 0:
        raise ValueError(f"--vmap-per-token must be >= 1 and --vmap-frequent >= 0 (got {per_token}, {frequent})")
    n_src, n_tgt = len(src_words), len(tgt_words)
    codes, counts, src_df, tgt_df, n = cooccurrence(pairs, n_src, n_tgt)
    if n == 0:
        raise ValueError("the training data holds no sentence pair: no vocabulary map can be built")
    tgt_df = tgt_df.copy()
    tgt_df[list(skip_tgt)] = 0  # specials and padding are never listed (CTranslate2 adds its own)
    order = np.argsort(-tgt_df, kind="stable")
    always = [tgt_words[t] for t in order[:frequent] if tgt_df[t] > 0]
    s, t = np.divmod(codes, n_tgt)
    keep = ~np.isin(t, list(skip_tgt)) & ~np.isin(s, list(skip_src))
    s, t, c = s[keep], t[keep], counts[keep]
    dice = 2.0 * c / (src_df[s] + tgt_df[t])
    by = np.lexsort((t, -dice, s))  # per source token: the highest Dice first, ties in vocabulary order
    s, t = s[by], t[by]
    first = np.r_[0, np.flatnonzero(np.diff(s)) + 1]  # where each source token's run starts
    rank = np.arange(s.size) - np.repeat(first, np.diff(np.r_[first, s.size]))
    s, t = s[rank < per_token], t[rank < per_token]
    lines = ["\t" + " ".join(always)]
    bounds = np.r_[np.flatnonzero(np.diff(s)) + 1, s.size]
    lo = 0
    for hi in bounds.tolist():
        if hi > lo:
            lines.append(f"{src_words[s[lo]]}\t" + " ".join(tgt_words[x] for x in t[lo:hi].tolist()))
        lo = hi
    logger.info("vocabulary map: %d source tokens x at most %d candidates, %d always allowed, from %d pairs",
                len(lines) - 1, per_token, len(always), n)
    return lines


def _specials(d) -> List[int]:
    return sorted({d.bos(), d.pad(), d.eos(), d.unk()} | set(range(d.nspecial)))


def build(task, out: Path, per_token: int = PER_TOKEN, frequent: int = FREQUENT, max_pairs: int = MAX_PAIRS,
          split: str = "train") -> dict:
    """Write ``out`` (a ``vmap.txt``) from the task's binarized ``split``; returns what the metadata
    records of it."""
    from fairseq.data import data_utils

    src, tgt = task.cfg.source_lang, task.cfg.target_lang
    data = str(task.cfg.data).split(":")[0]
    sd, td = task.src_dict, task.tgt_dict
    sets = []
    for lang, d in ((src, sd), (tgt, td)):
        prefix = None
        for a, b in ((src, tgt), (tgt, src)):
            cand = Path(data) / f"{split}.{a}-{b}.{lang}"
            if Path(f"{cand}.idx").exists():
                prefix = cand
                break
        ds = data_utils.load_indexed_dataset(str(prefix), d) if prefix is not None else None
        if ds is None:
            raise FileNotFoundError(f"--vmap: no binarized {split} data for {src}-{tgt} in {data} "
                                    f"(expected {split}.{src}-{tgt}.{lang}.bin); pass --data DATA_BIN")
        sets.append(ds)
    n = min(len(sets[0]), len(sets[1]), max_pairs)
    pairs = ((sets[0][i].tolist(), sets[1][i].tolist()) for i in range(n))
    lines = shortlist(pairs, sd.symbols, td.symbols, _specials(sd), _specials(td), per_token, frequent)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"built_from": f"{data}/{split}", "pairs": n, "per_token": per_token, "frequent": frequent,
            "source_tokens": len(lines) - 1}
