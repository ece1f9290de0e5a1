"""The one decode-and-score path (issue 80, item 1): the scorer (:mod:`deepnmt_fairseq.scoring`)
gives sacreBLEU's own numbers and signature."""

from __future__ import annotations

import pytest

from deepnmt_fairseq import scoring

HYPS = ["The cat sat on the mat.", "A dog barked at the postman, twice.", "It is raining today in Berlin."]
REFS = ["The cat sat on a mat.", "The dog barked at the postman twice.", "Today it is raining in Berlin."]


def test_the_scorer_is_sacrebleus_corpus_bleu_with_its_signature():
    import sacrebleu

    bleu = scoring.corpus_bleu(HYPS, REFS)
    expected = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert bleu.score == expected.score and bleu.counts == expected.counts and str(bleu) == str(expected)
    metric = sacrebleu.BLEU()
    metric.corpus_score(HYPS, [REFS])
    assert bleu.signature == str(metric.get_signature())
    assert bleu.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    # the options reach sacreBLEU (and its signature)
    lc = scoring.corpus_bleu(HYPS, REFS, tokenize="none", lowercase=True, force=True)
    assert lc.score == sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="none", lowercase=True, force=True).score
    assert "case:lc" in lc.signature and "tok:none" in lc.signature
    assert scoring.tokenized_bleu(HYPS, REFS).signature.split("|")[:5] == \
        ["nrefs:1", "case:mixed", "eff:no", "tok:none", "smooth:none"]


def test_sentence_statistics_sum_to_the_corpus_bleu():
    import sacrebleu

    stats = scoring.sentence_stats(HYPS, REFS)
    assert len(stats) == 3 and all(len(row) == 10 for row in stats)
    totals = [sum(col) for col in zip(*stats)]
    assert scoring.bleu_from_stats(totals) == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score, abs=1e-12)


def test_detokenization_joins_aggressive_hyphens_only_when_asked():
    """deepnmt-repro's detokenizer joins ``@,@`` (aggressive-hyphen splitting); the quickstart's and
    the study's leave the tokens as they are (their corpora are tokenized without it)."""
    tok = ["1 @,@ 000 Euro ."]
    assert scoring.detokenize(tok, "de") == ["1,000 Euro."]
    assert scoring.detokenize(tok, "de", join_at=False) == ["1 @,@ 000 Euro."]
