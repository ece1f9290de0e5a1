"""Abstractive summarization (MSC Appendix A, Table 6): ROUGE scoring and the evaluation recipe.

MSC Appendix A: "During decoding, we use beam search with beam size of 5 ... We remove duplicated
trigrams in beam search, and tweak the maximum summary length on the development set (Paulus et
al., 2018; Edunov et al., 2019). We use the F1 version of ROUGE (Lin, 2004)."

* **trigram blocking** = fairseq-generate ``--no-repeat-ngram-size 3`` (no trigram twice in a
  hypothesis, Paulus et al. 2018).
* **maximum summary length**: fairseq-generate ``--max-len-a 0 --max-len-b L`` (subword tokens);
  every L of :attr:`EvalSpec.max_len_b` is decoded on the validation set and the L with the best
  mean of ROUGE-1/2/L F1 is used on the test set (the paper does not say which score it tuned; the
  mean weighs the three reported numbers alike).  The tuning scores are kept in results.json.
* **ROUGE**: Google's ``rouge-score`` package (a reimplementation of ROUGE-1.5.5), F1, Porter
  stemming (ROUGE-1.5.5 ``-m``, as See et al.'s pyrouge evaluation), its default tokenizer
  (lowercase, non-alphanumeric characters as separators).  ROUGE-L is the *summary-level* LCS
  (``rougeLsum``: summaries split into sentences at ``<q>``, what ROUGE-1.5.5 computes on
  sentence-per-line files); the sentence-level ``rougeL`` of the joined text is reported beside
  it.  Scores are the mean over documents, in percent.  The settings are written next to every
  score (:func:`rouge_settings`).
* **references**: ``tok/<subset>.summary`` of ``scripts/prepare_data.py cnndm`` (See et al.'s
  processing: tokenized, lowercased, sentences joined with ``<q>``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Dict, List, Sequence

from deepnmt_data.cnndm import SENT_SEP, summary_sentences

#: rouge-score keys -> results.json keys (the Table 6 columns R-1, R-2, R-L)
ROUGE_KEYS = (("rouge1", "rouge1"), ("rouge2", "rouge2"), ("rougeLsum", "rougeL"), ("rougeL", "rougeL_sentence_level"))


def rouge_settings() -> Dict[str, object]:
    """How the ROUGE numbers were computed (written beside every score)."""
    from importlib.metadata import version

    return {
        "package": f"rouge-score {version('rouge-score')}",
        "statistic": "F1 (fmeasure), mean over documents, percent",
        "use_stemmer": True,
        "tokenizer": "rouge-score default: lowercase, [^a-z0-9]+ as separators",
        "rougeL": f"rougeLsum: summary-level LCS over sentences split at {SENT_SEP!r} (ROUGE-1.5.5 on "
                  "sentence-per-line files); rougeL_sentence_level = rouge-score 'rougeL' on the joined text",
        "rouge1/rouge2": f"n-gram overlap of the whole summary ({SENT_SEP!r} removed)",
        "bootstrap": "none (ROUGE-1.5.5's -r 1000 resampling changes the interval, not the mean)",
    }


def rouge(hyps: Sequence[str], refs: Sequence[str]) -> Dict[str, float]:
    """Mean ROUGE F1 (percent, 2 decimals) of BPE-free summaries against their references."""
    from rouge_score import rouge_scorer

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} summaries but {len(refs)} references")
    if not refs:
        raise ValueError("no summaries to score")
    scorer = rouge_scorer.RougeScorer([k for k, _ in ROUGE_KEYS], use_stemmer=True)
    sums = {k: 0.0 for k, _ in ROUGE_KEYS}
    for h, r in zip(hyps, refs):
        hs, rs = summary_sentences(h), summary_sentences(r)
        flat = scorer.score(" ".join(rs), " ".join(hs))  # score(target, prediction)
        lsum = scorer.score("\n".join(rs), "\n".join(hs))
        for k, _ in ROUGE_KEYS:
            sums[k] += (lsum if k == "rougeLsum" else flat)[k].fmeasure
    return {out: round(100 * sums[k] / len(refs), 2) for k, out in ROUGE_KEYS}


def _mean3(s: Dict[str, float]) -> float:
    return (s["rouge1"] + s["rouge2"] + s["rougeL"]) / 3


def _evaluator_base():
    from .evaluate import Evaluator

    return Evaluator


class SummarizationEvaluator(_evaluator_base()):
    """``deepnmt-repro evaluate`` for experiments whose primary metric is ROUGE (MSC Table 6)."""

    max_len_b = None  # the L of the current decode

    def generate_argv(self, model):
        argv = super().generate_argv(model)
        ev = self.exp.eval
        if ev.no_repeat_ngram_size:
            argv += ["--no-repeat-ngram-size", str(ev.no_repeat_ngram_size)]
        if self.max_len_b is not None:
            argv += ["--max-len-a", "0", "--max-len-b", str(self.max_len_b)]
        return argv

    def score(self, gen) -> Dict[str, object]:
        from ..generate_output import parse_generate
        from .. import scoring

        parsed = parse_generate(gen.read_text(encoding="utf-8", errors="replace"))
        refs, _, info = self.references(parsed["refs"])
        hyps, missing = scoring.ordered(parsed["hyps"], len(refs))
        if missing:
            from .evaluate import ReproError

            raise ReproError(f"{gen}: no summary for ids {missing[:10]} of {len(refs)} references")
        res: Dict[str, object] = {"sentences": len(refs), **info, **rouge(hyps, refs)}
        res["rouge_settings"] = rouge_settings()
        for key in ("tokens_per_s", "sentences_per_s", "decode_seconds"):
            if key in parsed:
                res[key] = parsed[key]
        res["generate_output"] = str(gen)
        return res

    def _decode_scored(self, model, subset: str, max_len):
        self.opts = replace(self.opts, subset=subset)
        self.max_len_b = max_len
        self.tag = f"{subset}-maxlen{max_len}" if max_len is not None else (subset if subset != "test" else None)
        gen = self.decode(model)
        return None if self.opts.dry_run else self.score(gen)

    def run(self) -> Dict[str, object]:
        ev = self.exp.eval
        test_subset, tag = self.opts.subset, self.tag
        self.check_finished()
        models = self.models()
        if len(models) != 1:
            from .evaluate import ReproError

            raise ReproError(f"{self.exp.name}: summarization evaluates one (averaged) model, got {len(models)}")
        model = models[0]
        tuning: Dict[str, Dict[str, float]] = {}
        best = None
        candidates: List = list(self.opts.max_len_b or ev.max_len_b) or [None]
        if len(candidates) > 1:
            for L in candidates:
                s = self._decode_scored(model, "valid", L)
                if s is not None:
                    tuning[str(L)] = {k: s[k] for _, k in ROUGE_KEYS}
                    if best is None or _mean3(s) > _mean3(tuning[str(best)]):
                        best = L
        else:
            best = candidates[0]
        if self.opts.dry_run:
            best = candidates[-1] if best is None else best
        res_test = self._decode_scored(model, test_subset, best)
        self.opts, self.tag = replace(self.opts, subset=test_subset), tag
        if self.opts.dry_run:
            for argv in self.commands:
                print(" ".join(argv))
            return {}
        res: Dict[str, object] = {
            "experiment": self.exp.name, "title": self.exp.title, "paper": self.exp.paper,
            "dataset": self.exp.dataset, "subset": test_subset, "stage": self.stage.name,
            "checkpoint_dir": str(self.ckdir), "models": [str(model)],
            "generation": {"beam": self.beam, "lenpen": self.lenpen, "batch_size": self.batch,
                           "no_repeat_ngram_size": ev.no_repeat_ngram_size, "max_len_a": 0 if best else None,
                           "max_len_b": best, "remove_bpe": self.remove_bpe, "extra": self.opts.extra},
            "max_len_tuning": {"subset": "valid", "criterion": "mean of ROUGE-1/2/L F1", "scores": tuning,
                               "chosen": best},
            "primary_metric": ev.primary,
            **res_test,
        }
        res["bleu"] = None  # no BLEU for summaries; Table 6 compares rouge1/rouge2/rougeL
        res.update(self.train_stats())
        res["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
        self.write(res)
        return res
