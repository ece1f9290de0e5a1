"""MSC Appendix A (Table 6): CNN/DailyMail preparation, ROUGE, and the whole experiment on a tiny fixture.

prepare (scripts/prepare_data.py cnndm --from-dir) -> train (deepnmt-repro train msc-cnndm-36L, tiny
overrides) -> generate with trigram blocking and the maximum length tuned on valid -> ROUGE
(deepnmt-repro evaluate).
"""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from cnndm_fixture import make_cnndm_archives
from fairseq_helpers import REPO, run_cli

from deepnmt_data import cnndm
from deepnmt_fairseq.repro.summarization import rouge, rouge_settings


# ------------------------------------------------------------------ See et al.'s processing
def test_story_parsing_and_see_et_al_processing():
    story = "First line of the article\n\nSecond one.\n\n@highlight\n\nA point\n\n@highlight\n\nAnother one!\n"
    article, highlights = cnndm.parse_story(story)
    assert article == ["First line of the article", "Second one."]
    assert highlights == ["A point", "Another one!"]
    art, summ = cnndm.make_pair(article, highlights, tokenize=lambda s: s.replace(".", " .").replace("!", " !"))
    assert art == "first line of the article . second one ."  # lowercased, missing period added
    assert summ == "a point . <q> another one !"
    assert cnndm.fix_missing_period("ends with a quote \u201d") == "ends with a quote \u201d"
    assert cnndm.url_hash("http://a.b/c\n") == hashlib.sha1(b"http://a.b/c").hexdigest()
    assert cnndm.truncate("a b c d", 3) == "a b c"


# ------------------------------------------------------------------ ROUGE
def test_rouge_f1_by_hand():
    # unigrams: 2 of 3 match both ways -> F1 2/3; bigrams: (a b) of {(a b), (b c)} / {(a b), (b d)} -> 1/2
    s = rouge(["a b c"], ["a b d"])
    assert s["rouge1"] == pytest.approx(66.67) and s["rouge2"] == pytest.approx(50.0)
    assert rouge(["x y <q> z w"], ["x y <q> z w"])["rougeL"] == 100.0
    # summary-level ROUGE-L: sentence order does not matter, the LCS of the joined text does
    swapped = rouge(["z w <q> x y"], ["x y <q> z w"])
    assert swapped["rougeL"] == 100.0 and swapped["rougeL_sentence_level"] == 50.0
    assert rouge_settings()["use_stemmer"] is True and rouge_settings()["package"].startswith("rouge-score")
    with pytest.raises(ValueError, match="2 summaries but 1 references"):
        rouge(["a", "b"], ["a"])


# ------------------------------------------------------------------ trigram blocking
def _always_one_token(token=7):
    """A tiny model that predicts ``token`` at every step, whatever the input."""
    from fairseq_helpers import TINY, build_model

    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "1", "--decoder-layers", "1"]).eval()
    with torch.no_grad():
        norm = model.decoder.layer_norm
        norm.weight.zero_()
        norm.bias.copy_(torch.linspace(-1, 1, norm.bias.numel()))
        model.decoder.output_projection.weight[token] = 20 * norm.bias
    return model


def _generate(model, no_repeat):
    from fairseq.sequence_generator import SequenceGenerator

    d = model.decoder.dictionary
    src = torch.tensor([[10, 11, 12, d.eos()]])
    gen = SequenceGenerator([model], d, beam_size=2, max_len_a=0, max_len_b=12, min_len=12,
                            no_repeat_ngram_size=no_repeat)
    with torch.no_grad():
        hyp = gen.forward({"net_input": {"src_tokens": src, "src_lengths": torch.tensor([4])}})[0][0]
    return hyp["tokens"][:-1].tolist()  # without the final eos


def _has_repeated_trigram(tokens):
    tri = [tuple(tokens[i:i + 3]) for i in range(len(tokens) - 2)]
    return len(tri) != len(set(tri))


def test_trigram_blocking_works_on_the_cpu(monkeypatch):
    """fairseq-generate --no-repeat-ngram-size 3 (MSC Appendix A: 'We remove duplicated trigrams in beam
    search') on the CPU; fairseq 0.12's own CPU blocker bans nothing (deepnmt_fairseq/fairseq_fixes.py)."""
    from fairseq.ngram_repeat_block import NGramRepeatBlock

    from deepnmt_fairseq import fairseq_fixes as ff

    model = _always_one_token()
    assert _generate(model, 0) == [7] * 12
    blocked = _generate(model, 3)
    assert len(blocked) == 12 and not _has_repeated_trigram(blocked) and blocked[:2] == [7, 7]
    if "cpu_ngram_blocking" in {f.name for f in ff.active()}:  # fairseq's original repeats the trigram
        monkeypatch.setattr(NGramRepeatBlock, "_no_repeat_ngram", ff.original("cpu_ngram_blocking"))
        assert _has_repeated_trigram(_generate(model, 3))


# ------------------------------------------------------------------ the experiment
def _prepare(tmp_path, max_doc_tokens=40):
    arch = make_cnndm_archives(tmp_path / "archives")
    data = tmp_path / "data"
    run_cli("python", str(REPO / "scripts" / "prepare_data.py"), "cnndm", "--from-dir", arch,
            "--data-root", data, "--workers", "1", "--bpe-merges", "300", "--max-doc-tokens", max_doc_tokens,
            "--ignore-checksums")
    return data / "cnndm"


def _trigrams(line):
    t = line.split()
    return [tuple(t[i:i + 3]) for i in range(len(t) - 2)]


@pytest.mark.slow
def test_prepare_train_generate_with_trigram_blocking_rouge(tmp_path):
    ds = _prepare(tmp_path)
    stats = json.loads((ds / "STATS.json").read_text())
    assert stats["sizes"] == {"train": 59, "valid": 8, "test": 8}  # one empty article dropped (See et al.)
    assert stats["steps"]["tok"]["train_dropped"] == {"empty article": 1}
    assert stats["steps"]["bpe"]["train_truncated"] > 0
    # splits follow the URL lists, whatever the archive order
    urls = (tmp_path / "archives" / "all_test.txt").read_text().split()
    raw_ids = [json.loads(x)["id"] for x in (ds / "raw" / "test.jsonl").read_text().splitlines()]
    assert raw_ids == [cnndm.url_hash(u) for u in urls]
    assert all(len(x.split()) <= 40 for x in (ds / "bpe" / "train.article").read_text().splitlines())
    assert " <q> " in (ds / "tok" / "test.summary").read_text()

    save = tmp_path / "exp"
    tiny = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
            "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
            "--decoder-layers", "2", "--msc-block-layers", "1", "--encoder-layers", "2",
            "--max-epoch", "3", "--max-tokens", "2000", "--lr", "0.003", "--warmup-updates", "5",
            "--num-workers", "0", "--no-progress-bar"]
    run_cli("deepnmt-repro", "train", "msc-cnndm-36L", "--data-root", tmp_path / "data", "--save-dir", save,
            "--cpu", "--", *tiny)
    assert (save / "checkpoint_last.pt").exists()
    run_cli("deepnmt-repro", "evaluate", "msc-cnndm-36L", "--data-root", tmp_path / "data", "--save-dir", save,
            "--checkpoint-dir", save, "--cpu", "--max-len-b", "20,60")
    res = json.loads((save / "results.json").read_text())
    assert res["generation"]["no_repeat_ngram_size"] == 3 and res["generation"]["beam"] == 5
    tuning = res["max_len_tuning"]
    assert set(tuning["scores"]) == {"20", "60"} and tuning["chosen"] == res["generation"]["max_len_b"]
    best = max(tuning["scores"].values(), key=lambda s: s["rouge1"] + s["rouge2"] + s["rougeL"])
    assert tuning["scores"][str(tuning["chosen"])] == best
    for k in ("rouge1", "rouge2", "rougeL", "rougeL_sentence_level"):
        assert 0.0 <= res[k] <= 100.0
    assert res["rouge1"] > 0  # the fixture's summaries restate the article's lead
    assert res["rouge_settings"] == rouge_settings()
    gen = Path(res["generate_output"]).read_text()
    assert "'no_repeat_ngram_size': 3" in gen  # fairseq-generate's echoed configuration
    hyps = [line.split("\t")[2] for line in gen.splitlines() if line.startswith("H-")]
    assert len(hyps) == 8
    for h in hyps:  # trigram blocking: no trigram twice in a summary (BPE merges cover every word here)
        tri = _trigrams(h)
        assert len(tri) == len(set(tri)), h


@pytest.mark.slow
def test_hiertrans_trains_and_decodes_on_the_fixture_like_msc(tmp_path):
    """MSC Table 6's HIERTRANS row (msc-cnndm-hiertrans-36L) through deepnmt-repro: the fixture's articles
    have several sentences (See et al.'s processing ends each line with a period), the hierarchical
    encoder splits them, trains, and the evaluation decodes with trigram blocking and scores ROUGE."""
    ds = _prepare(tmp_path)
    from fairseq.data import Dictionary

    from deepnmt_fairseq.models.hiertrans import segment

    d = Dictionary.load(str(next((ds / "bin").glob("dict.*.txt"))))
    ends = torch.tensor(sorted({d.index(x) for x in ". ! ?".split()} - {d.unk()} | {d.eos()}))
    doc = torch.tensor([d.encode_line(x, add_if_not_exist=False).tolist()
                        for x in (ds / "bpe" / "train.article").read_text().splitlines()[:1]])
    assert int(segment(doc, d.pad(), ends)[1].sum()) >= 2  # more than one sentence in a fixture article

    save = tmp_path / "exp"
    tiny = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
            "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
            "--encoder-layers", "1", "--document-layers", "1", "--decoder-layers", "1",
            "--max-epoch", "3", "--max-tokens", "2000", "--lr", "0.003", "--warmup-updates", "5",
            "--num-workers", "0", "--no-progress-bar"]
    train = run_cli("deepnmt-repro", "train", "msc-cnndm-hiertrans-36L", "--data-root", tmp_path / "data",
                    "--save-dir", save, "--cpu", "--", *tiny)
    assert "HierTransEncoder" in train.stdout + train.stderr  # fairseq prints the model
    assert (save / "checkpoint_last.pt").exists()
    run_cli("deepnmt-repro", "evaluate", "msc-cnndm-hiertrans-36L", "--data-root", tmp_path / "data",
            "--save-dir", save, "--checkpoint-dir", save, "--cpu", "--max-len-b", "20,60")
    res = json.loads((save / "results.json").read_text())
    assert res["generation"]["no_repeat_ngram_size"] == 3 and res["generation"]["beam"] == 5
    for k in ("rouge1", "rouge2", "rougeL"):
        assert 0.0 <= res[k] <= 100.0
    hyps = [line for line in Path(res["generate_output"]).read_text().splitlines() if line.startswith("H-")]
    assert len(hyps) == 8


def test_a_story_missing_from_the_archives_stops_with_a_clear_error(tmp_path):
    arch = make_cnndm_archives(tmp_path / "archives", sizes=(("train", 4), ("valid", 2), ("test", 2)))
    with open(arch / "all_test.txt", "a") as f:
        f.write("http://www.cnn.example/not/in/any/archive.html\n")
    res = run_cli("python", str(REPO / "scripts" / "prepare_data.py"), "cnndm", "--from-dir", arch,
                  "--data-root", tmp_path / "data", "--workers", "1", "--ignore-checksums", check=False)
    assert res.returncode == 2
    missing = cnndm.url_hash("http://www.cnn.example/not/in/any/archive.html")
    assert f"1 stories of the URL lists are in none of the archives (e.g. {missing}.story)" in res.stderr
    assert not (tmp_path / "data" / "cnndm" / ".done").exists()
