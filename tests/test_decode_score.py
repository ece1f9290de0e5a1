"""The one decode-and-score path (issue 80, item 1): the scorer (:mod:`deepnmt_fairseq.scoring`)
gives sacreBLEU's own numbers and signature."""

from __future__ import annotations

import os

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


# ------------------------------------------------------------------------------ decoding
def test_named_search_settings_reach_the_fairseq_generate_command():
    from deepnmt_fairseq.jobs.decode import Search, generate_command
    from deepnmt_fairseq.jobs.fairseq_argv import user_dir

    search = Search(beam=4, lenpen=0.6, batch_size=64, max_len_a=1.2, max_len_b=10, remove_bpe="sentencepiece",
                    nbest=1)
    argv = generate_command("DATA", "ckpt.pt", search, "valid", task=["--task", "translation"], shard=(2, 5),
                            cpu=True, fp16=True, extra=["--no-repeat-ngram-size", 3])
    assert argv == ["fairseq-generate", "DATA", "--user-dir", user_dir(), "--path", "ckpt.pt", "--task", "translation",
                    "--gen-subset", "valid", "--beam", "4", "--lenpen", "0.6", "--batch-size", "64",
                    "--max-len-a", "1.2", "--max-len-b", "10", "--required-batch-size-multiple", "1",
                    "--remove-bpe", "sentencepiece", "--nbest", "1", "--distributed-world-size", "5",
                    "--distributed-rank", "2", "--cpu", "--fp16", "--no-repeat-ngram-size", "3"]
    # unset settings are fairseq's defaults (no flag); a bare --remove-bpe; every sentence is the default
    assert Search(remove_bpe=True, max_tokens=4096).flags() == [
        "--max-tokens", "4096", "--required-batch-size-multiple", "1", "--remove-bpe"]
    assert Search(beam=5, every_sentence=False).flags() == ["--beam", "5"]


FAKE_GENERATE = """#!{python}
import os, sys, time
print("H-0\\t-0.1\\thallo welt", flush=True)
print("fake log line", file=sys.stderr, flush=True)
open(os.environ["FAKE_PID"], "w").write(str(os.getpid()))
mode = os.environ["FAKE_MODE"]
if mode == "fail":
    sys.exit(3)
if mode == "hang":
    time.sleep(120)
print("Translated 1 sentences (3 tokens) in 0.1s (10.00 sentences/s, 30.00 tokens/s)", flush=True)
"""


def _fake(tmp_path, mode):
    import sys

    script = tmp_path / "fake-generate"
    script.write_text(FAKE_GENERATE.format(python=sys.executable))
    script.chmod(0o755)
    env = dict(os.environ, FAKE_MODE=mode, FAKE_PID=str(tmp_path / "pid"))
    return [str(script), "DATA", "--path", "m.pt"], env


def test_the_output_appears_only_when_generation_completes(tmp_path):
    from deepnmt_fairseq.jobs.decode import generate, partial_path

    argv, env = _fake(tmp_path, "ok")
    out = tmp_path / "generate-test.txt"
    assert generate(argv, out, env=env) == out
    text = out.read_text()
    assert "H-0\thallo welt" in text.replace("\t-0.1", "") and "fake log line" in text  # stderr merged
    assert not partial_path(out).exists()
    # stderr into a file of its own
    out2 = tmp_path / "g2.txt"
    generate(argv, out2, stderr=tmp_path / "g2.log", env=env)
    assert "fake log line" not in out2.read_text() and "fake log line" in (tmp_path / "g2.log").read_text()


def test_a_failed_generation_leaves_no_output_and_says_where_its_output_is(tmp_path):
    from deepnmt_fairseq.jobs.decode import GenerateError, generate, partial_path
    from deepnmt_fairseq.jobs.stage import JobError

    argv, env = _fake(tmp_path, "fail")
    out = tmp_path / "generate-test.txt"
    with pytest.raises(GenerateError) as e:
        generate(argv, out, env=env)
    assert isinstance(e.value, JobError) and e.value.returncode == 3
    assert not out.exists() and partial_path(out).exists()
    assert f"fake-generate failed (exit 3); its output is in {partial_path(out)}" in str(e.value)
    assert "hallo welt" in str(e.value)
    # a rerun that succeeds replaces the partial output
    argv, env = _fake(tmp_path, "ok")
    generate(argv, out, env=env)
    assert out.exists() and not partial_path(out).exists()


def test_a_generation_killed_midway_leaves_no_output(tmp_path):
    import signal
    import threading
    import time

    from deepnmt_fairseq.jobs.decode import GenerateError, generate, partial_path

    argv, env = _fake(tmp_path, "hang")
    out = tmp_path / "generate-test.txt"
    errors = []

    def run():
        try:
            generate(argv, out, env=env)
        except GenerateError as err:
            errors.append(err)

    t = threading.Thread(target=run)
    t.start()
    pid_file = tmp_path / "pid"
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text() and "hallo" in partial_path(out).read_text()):
        assert time.time() < deadline, "the fake fairseq-generate did not start"
        time.sleep(0.05)
    assert not out.exists()  # half-way: only the partial file
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    t.join(60)
    assert errors and errors[0].returncode == -signal.SIGKILL
    assert not out.exists() and "hallo welt" in partial_path(out).read_text()


def test_complete_or_nothing_for_a_directory(tmp_path):
    """fairseq-preprocess's --destdir (deepnmt-skd): the directory appears whole or not at all; an
    empty directory in its place is replaced; a failed body leaves it untouched."""
    from deepnmt_fairseq.jobs.decode import complete_or_nothing, partial_path

    out = tmp_path / "skd-data"
    out.mkdir()
    with pytest.raises(RuntimeError):
        with complete_or_nothing(out) as tmp:
            tmp.mkdir()
            (tmp / "train.bin").write_text("half")
            raise RuntimeError("fairseq-preprocess failed")
    assert out.is_dir() and not any(out.iterdir()) and (partial_path(out) / "train.bin").exists()
    with complete_or_nothing(out) as tmp:
        assert not tmp.exists()  # the earlier try's partial directory is gone
        tmp.mkdir()
        (tmp / "train.bin").write_text("whole")
    assert (out / "train.bin").read_text() == "whole" and not partial_path(out).exists()


def test_the_one_fairseq_preprocess_command_keeps_each_callers_arguments():
    """deepnmt_data.preprocess.preprocess_argv: the small corpora's / deepnmt-prepare-data's joined
    dictionary, deepnmt-skd's teacher dictionaries, deep_stability's vocabulary size."""
    from deepnmt_data.preprocess import preprocess_argv

    assert preprocess_argv("en", "de", "bin", trainpref="t/train.bpe", validpref="t/valid.bpe", testpref="t/test.bpe",
                           joined=True, workers=2) == [
        "--source-lang", "en", "--target-lang", "de", "--trainpref", "t/train.bpe", "--validpref", "t/valid.bpe",
        "--testpref", "t/test.bpe", "--destdir", "bin", "--joined-dictionary", "--workers", "2"]
    assert preprocess_argv("en", "de", "out.partial", trainpref="text/train", srcdict="d/dict.en.txt",
                           tgtdict="d/dict.de.txt", workers=3) == [
        "--source-lang", "en", "--target-lang", "de", "--trainpref", "text/train", "--destdir", "out.partial",
        "--srcdict", "d/dict.en.txt", "--tgtdict", "d/dict.de.txt", "--workers", "3"]
    assert preprocess_argv("en", "de", "o", trainpref="r/train", nwords=4000)[-6:] == [
        "--nwordssrc", "4000", "--nwordstgt", "4000", "--workers", "1"]
