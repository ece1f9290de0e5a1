"""GPKD tools end to end: student extraction and SKD data through the CLIs."""

import pytest

from fairseq_helpers import USER_DIR, generate, hypotheses, run_cli, tiny_model_flags, train

pytestmark = pytest.mark.slow

TEACHER = [*tiny_model_flags(), "--share-all-embeddings", "--encoder-layers", "8", "--decoder-layers", "2",
           "--gp-group-size", "2", "--gp-decoder-group-size", "2", "--rpr-max-relative-position", "4",
           "--ssl-rate", "0.4"]


@pytest.fixture(scope="module")
def teacher(data_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("teacher")
    train(data_bin, save, "deepnmt_transformer", TEACHER, max_update=3)
    return save / "checkpoint_last.pt"


def test_progressive_extraction_loads_in_generate_and_trains(teacher, data_bin, tmp_path):
    """h = 2 applied three times: 8 -> 4 -> 2 -> 1 encoder layers; decoder 2 -> 1.  The
    intermediate students are extracted again without being GP-trained (the procedure trains each
    with --gp-group-size 2 first: tests/test_gpkd_procedure.py), hence the explicit override."""
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    current = teacher
    for step in range(3):
        out = tmp_path / f"student{step}.pt"
        args = ["--teacher", current, "--encoder-group-size", "2", "--output", out, "--seed", str(step)]
        if step == 0:
            args += ["--decoder-group-size", "2"]
        else:
            args += ["--allow-group-size-mismatch"]
        run_cli("deepnmt-extract-student", *args)
        info = load_checkpoint(str(out))["extra_state"]["gpkd_student"]
        assert ("group_size_override" in info) == (step > 0)
        cfg = load_checkpoint(str(out))["cfg"]["model"]
        assert cfg.encoder_layers == 8 // 2 ** (step + 1) and cfg.decoder_layers == 1
        assert cfg.gp_group_size == 1
        res = generate(data_bin, out, beam=2)
        assert len(hypotheses(res.stdout)) == 10
        current = out
    # the 1-layer student trains from the extracted weights (--finetune-from-model) ...
    save = tmp_path / "ft"
    train(data_bin, save, "deepnmt_transformer",
          [*tiny_model_flags(), "--share-all-embeddings", "--encoder-layers", "1", "--decoder-layers", "1",
           "--rpr-max-relative-position", "4", "--finetune-from-model", current], max_update=2)
    assert (save / "checkpoint_last.pt").exists()
    # ... or as --restore-file with the optimizer and data state reset
    save2 = tmp_path / "restore"
    res = train(data_bin, save2, "deepnmt_transformer",
                [*tiny_model_flags(), "--share-all-embeddings", "--encoder-layers", "1", "--decoder-layers", "1",
                 "--rpr-max-relative-position", "4", "--restore-file", current, "--reset-optimizer",
                 "--reset-lr-scheduler", "--reset-meters", "--reset-dataloader"], max_update=2)
    assert f"loaded checkpoint {current}" in (res.stdout + res.stderr).lower().replace(str(current).lower(), str(current))


def test_extraction_refuses_bad_group_size(teacher, tmp_path):
    res = run_cli("deepnmt-extract-student", "--teacher", teacher, "--encoder-group-size", "3",
                  "--output", tmp_path / "x.pt", check=False)
    assert res.returncode != 0 and "does not divide" in res.stderr
    assert not (tmp_path / "x.pt").exists()


def test_skd_data_is_complete_ordered_and_resumable(teacher, data_bin, tmp_path):
    out = tmp_path / "skd-bin"
    args = ["--data", data_bin, "--teacher", teacher, "--output", out, "--shards", "2", "--beam", "2",
            "--batch-size", "7", "--cpu", "--max-len-b", "3"]
    first = run_cli("deepnmt-skd", *args, "--jobs", "2")  # both shards at once; the redo below runs alone
    assert (out / ".done").exists() and "2 shard(s), 2 at a time" in first.stderr
    assert "progress: 120/120" in first.stderr and first.stderr.count("translated in") == 2
    work = tmp_path / "skd-bin.work"
    src = (work / "text" / "train.src").read_text().splitlines()
    # sources in the original order: compare with the binarized training data
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(data_bin / "dict.src.txt"))
    ds = data_utils.load_indexed_dataset(str(data_bin / "train.src-tgt.src"), d)
    assert len(src) == len(ds) == 120
    assert all(src[i] == d.string(ds[i]) for i in range(len(ds)))
    tgt = (work / "text" / "train.tgt").read_text().splitlines()
    assert len(tgt) == 120
    # the student trains on it (valid/test kept)
    assert (out / "valid.src-tgt.src.bin").exists()
    # resumable: a finished run does nothing; a missing shard is redone alone
    again = run_cli("deepnmt-skd", *args)
    assert "nothing to do" in again.stderr
    import shutil

    shutil.rmtree(out)
    shard1 = sorted(work.glob("shard*.txt"))[1]
    shard1.unlink()
    third = run_cli("deepnmt-skd", *args)
    assert third.stderr.count("done earlier") == 1 and third.stderr.count("translated in") == 1
    assert (work / "text" / "train.tgt").read_text().splitlines() == tgt
    # a failing shard: a clear error and exit 1, the other shards still run and are kept
    bad = ["--data", data_bin, "--teacher", tmp_path / "missing.pt", "--output", tmp_path / "bad-bin",
           "--shards", "2", "--jobs", "2", "--cpu", "--batch-size", "7"]
    res = run_cli("deepnmt-skd", *bad, check=False)
    assert res.returncode == 1 and "error: fairseq-generate failed on shard 0" in res.stderr
    assert "failed on shard 1" in res.stderr and not (tmp_path / "bad-bin" / ".done").exists()


def test_skd_jobs_split_the_cores_or_the_gpus(monkeypatch):
    """--jobs: each concurrent fairseq-generate gets its share of the CPU threads (unless the
    caller fixed OMP_NUM_THREADS, as the study does with --threads), or its own GPU."""
    from deepnmt_fairseq.distill.skd import job_envs

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    envs = job_envs(3, cpu=True, env={})
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["2"] * 3 and envs[0]["MKL_NUM_THREADS"] == "2"
    assert [e["OMP_NUM_THREADS"] for e in job_envs(2, cpu=True, env={"OMP_NUM_THREADS": "1"})] == ["1", "1"]
    assert "OMP_NUM_THREADS" not in job_envs(1, cpu=True, env={})[0]  # one job: as fairseq-generate alone
    gpus = job_envs(3, cpu=False, env={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in gpus] == ["4", "5", "4"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in job_envs(2, cpu=False, env={"CUDA_VISIBLE_DEVICES": "3"})] == ["3", "3"]
    assert all("PYTHONWARNINGS" in e for e in gpus)  # still the project's child environment


# the one-command pipeline (scripts/gpkd_pipeline.py): tests/test_gpkd_procedure.py
