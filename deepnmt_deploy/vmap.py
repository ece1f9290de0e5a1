"""The vocabulary shortlist of an exported model: CTranslate2's vocabulary map (``vmap.txt``).

CTranslate2 reads a text file in the model directory whose lines are ``<source n-gram> TAB
<target candidates>`` (tokens separated by spaces; an empty n-gram lists the candidates that are
always allowed) and, with ``use_vmap=True`` at translation, computes the output layer only for the
union of the candidates of the batch's source tokens, plus ``<unk>``, ``<s>`` and ``</s>``.  The
output layer is most of a small student's decoding work (a 128-wide model with a 12.5K vocabulary),
so the shortlist is the cheapest speed-up that does not touch the model; it changes the search only
where the full model would have chosen a token outside the shortlist.

This module reads a map and measures that: :func:`lost_tokens` counts the tokens of given
hypotheses (e.g. the full model's translations of a test set) that the shortlist of their source
would not allow.  The map is built at export from the training data
(:mod:`deepnmt_fairseq.deploy.vmap`); torch-free, for the serving side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Set, Tuple

VMAP_FILE = "vmap.txt"  # the name CTranslate2 looks for (ModelSpec.register_vocabulary_mapping)
SPECIALS = ("<unk>", "<s>", "</s>")  # always candidates in CTranslate2's VocabularyMap
#: defaults of deepnmt-export-ct2's --vmap-per-token / --vmap-frequent / --vmap-max-pairs (a 12.5K-token
#: vocabulary: a 25-token sentence allows at most 25 x 50 + 300 ~ 1,550 candidates, an eighth of the
#: output layer); chosen by that arithmetic, not yet by the speed protocol (issue 78)
PER_TOKEN, FREQUENT, MAX_PAIRS = 50, 300, 200_000


@dataclass
class VocabularyMap:
    """The unigram rules of a ``vmap.txt`` and its always-allowed tokens (longer n-grams are kept
    as rules too but this project writes none)."""

    always: Set[str] = field(default_factory=set)
    rules: Dict[str, Set[str]] = field(default_factory=dict)

    @classmethod
    def read(cls, path) -> "VocabularyMap":
        vm = cls(always=set(SPECIALS))
        for no, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n"), 1):
            if not line:
                continue
            if "\t" not in line:
                raise ValueError(f"{path}, line {no}: no TAB between the source n-gram and its candidates")
            key, targets = line.split("\t", 1)
            cands = set(t for t in targets.split(" ") if t)
            if key == "":
                vm.always |= cands
            else:
                vm.rules.setdefault(key, set()).update(cands)
        return vm

    def candidates(self, source: Sequence[str]) -> Set[str]:
        """The target tokens allowed for one source sentence (subword tokens)."""
        out = set(self.always)
        for tok in source:
            out |= self.rules.get(tok, set())
        return out


def has_vmap(model_dir) -> bool:
    """Whether an export carries a vocabulary shortlist (deepnmt-export-ct2 --vmap), which
    deepnmt-translate then uses unless told not to."""
    return (Path(model_dir) / VMAP_FILE).is_file()


def lost_tokens(vmap: VocabularyMap, sources: Iterable[Sequence[str]],
                hypotheses: Iterable[Sequence[str]]) -> Tuple[int, int, List[int]]:
    """``(lost, total, lines)``: the hypothesis tokens that the shortlist of their own source does not
    allow, of all hypothesis tokens, and the 0-based indices of the lines that lose at least one.
    Per sentence, i.e. the strictest case (one sentence a request): CTranslate2 allows the union of
    the candidates of all sources of a batch, so batched translation loses at most this many.
    With the full model's hypotheses, a line that loses none is translated identically under the
    shortlist by greedy search (its argmax is always a candidate); beam search renormalizes over the
    candidates, so it can still differ there."""
    lost = total = 0
    lines: List[int] = []
    for i, (src, hyp) in enumerate(zip(sources, hypotheses)):
        allowed = vmap.candidates(src)
        miss = sum(1 for t in hyp if t not in allowed)
        lost += miss
        total += len(hyp)
        if miss:
            lines.append(i)
    return lost, total, lines
