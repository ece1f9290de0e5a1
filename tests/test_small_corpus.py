"""deepnmt_data.small_corpus: the one data preparation of the quickstart, the study and
scripts/gpkd_pipeline.py (issue 68), without fairseq: the binarization is a callable."""

from __future__ import annotations

import gzip

from deepnmt_data import small_corpus


def _corpus(root, n=12):
    root.mkdir()
    for split in small_corpus.SPLITS:
        for lang, word in (("en", "house"), ("de", "Haus")):
            with gzip.open(root / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(f"The {word}s, number {i}!\n" for i in range(n)))
    return root


def test_prepare_tokenizes_bpe_and_binarizes_once(tmp_path):
    data = _corpus(tmp_path / "corpus")
    calls, lines = [], []
    out = small_corpus.prepare(tmp_path / "w", 20, data, train_pairs=5, log=lines.append, binarize=calls.append)
    tok = tmp_path / "w" / "tok"
    assert out == tmp_path / "w" / "data-bin" and (out / ".done").exists()
    assert len((tok / "train.raw.en").read_text().splitlines()) == 5  # train_pairs
    assert len((tok / "test.raw.de").read_text().splitlines()) == 12  # held-out splits whole
    assert (tok / "valid.tok.en").read_text().splitlines()[0] == "The houses , number 0 !"
    assert (tok / "bpe.codes").exists() and (tok / "train.bpe.de").exists()
    (argv,) = calls
    assert argv[argv.index("--destdir") + 1] == str(out) and "--joined-dictionary" in argv
    assert argv[argv.index("--trainpref") + 1] == str(tok / "train.bpe")
    assert "tokenized train.en: 5 lines" in lines
    again = []
    assert small_corpus.prepare(tmp_path / "w", 20, data, log=again.append, binarize=calls.append) == out
    assert len(calls) == 1 and again == [f"data ready: {out}"]


def test_the_quickstart_prepares_its_corpus_with_it(tmp_path, monkeypatch):
    """The quickstart's preparation is this one: the same tokenized and BPE files, the same
    fairseq-preprocess arguments (the study's: tests/test_fidelity_report.py, --prepare-only)."""
    from deepnmt_fairseq import quickstart

    data = _corpus(tmp_path / "corpus")
    ran = []
    monkeypatch.setattr(small_corpus, "fairseq_preprocess",
                        lambda argv, **kw: ran.append(["fairseq-preprocess", *(str(c) for c in argv)]))
    monkeypatch.setattr(quickstart, "log", lambda msg: None)
    out = quickstart.prepare(tmp_path / "qs", 20, 5, data)
    ours = []
    expected = small_corpus.prepare(tmp_path / "one", 20, data, 5, quickstart.SRC, quickstart.TGT,
                                    log=lambda msg: None, binarize=ours.append)
    assert quickstart.DATA == small_corpus.EMBEDDED
    assert out == tmp_path / "qs" / "data-bin" and (out / ".done").exists()
    files = sorted(f.name for f in (tmp_path / "one" / "tok").iterdir())
    assert "bpe.codes" in files and "train.bpe.de" in files
    assert sorted(f.name for f in (tmp_path / "qs" / "tok").iterdir()) == files
    for name in files:
        assert (tmp_path / "qs" / "tok" / name).read_bytes() == (tmp_path / "one" / "tok" / name).read_bytes(), name
    (argv,) = ours
    assert ran == [["fairseq-preprocess", *(a.replace(str(expected.parent), str(out.parent)) for a in argv)]]


def test_the_quickstart_takes_another_corpus_and_ties_the_work_dir_to_it(tmp_path):
    """--corpus DIR (the installed package has no embedded corpus): that corpus is prepared, and a
    work directory made from one corpus refuses another."""
    import json
    import unittest.mock as mock

    import pytest

    from deepnmt_fairseq import quickstart

    data = _corpus(tmp_path / "corpus")
    work = tmp_path / "qs"
    seen = []

    def stop(*args):
        seen.append(args)
        raise RuntimeError("prepared")

    with mock.patch.object(quickstart, "prepare", side_effect=stop):
        with pytest.raises(RuntimeError, match="prepared"):
            quickstart.main(["--work-dir", str(work), "--corpus", str(data)])
    assert seen[0][3] == data
    assert json.loads((work / "settings.json").read_text())["corpus"] == str(data)
    with pytest.raises(SystemExit, match="other settings.*corpus"):
        quickstart.main(["--work-dir", str(work)])
