"""Bad inputs and faults: clear errors, nothing silently dropped, nothing lost.

What fairseq 0.12.3 does by itself (measured) and what ``deepnmt_fairseq.behaviour_fixes``
changes is documented in docs/reliability.md.  Most scenarios run in one worker process
(tests/test_matrix.py's in-process runner, guards installed); the checkpoint-file faults
run the real console scripts, and the SIGTERM scenarios run fairseq-train's ``cli_main``
under a fault-injection hook.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fairseq_helpers import USER_DIR, run_cli
from test_matrix import _finish, _start_worker, generate_argv, train_argv

TRAIN_FLAGS = ["--encoder-layers", "2", "--decoder-layers", "2"]
LONG = " ".join(["cat"] * 40)
SPECIAL_TEST = [("the cat sees", "SEES CAT THE"), ("", "A"), ("zzz the qqq", "QQQ THE ZZZ"),
                (LONG, "CAT"), ("dog runs", "RUNS DOG")]  # empty line, unknown words, over-long source
INTERACTIVE = ["the cat sees", "", "zzz the qqq", " ".join(["cat"] * 1100), "dog runs"]  # > 1024 positions


# ---------------------------------------------------------------------------- data helpers
def _empty_split(data_bin: Path, dest: Path, split="train"):
    """A copy of data_bin whose ``split`` has no sentences, as fairseq-preprocess writes an empty file."""
    from fairseq.data import Dictionary, indexed_dataset

    shutil.copytree(data_bin, dest)
    for lang in ("src", "tgt"):
        prefix = dest / f"{split}.src-tgt.{lang}"
        d = Dictionary.load(str(dest / f"dict.{lang}.txt"))
        builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=len(d))
        builder.finalize(f"{prefix}.idx")
    assert os.path.getsize(dest / f"{split}.src-tgt.src.bin") == 0
    return dest


def _other_dictionary(data_bin: Path, dest: Path, extra=8):
    """A copy of data_bin whose dictionaries have ``extra`` more symbols (the splits stay valid)."""
    shutil.copytree(data_bin, dest)
    for lang in ("src", "tgt"):
        with open(dest / f"dict.{lang}.txt", "a") as f:
            f.writelines(f"extraword{i} 1\n" for i in range(extra))
    return dest


def _evil_checkpoint(path: Path, marker: Path):
    """A checkpoint whose unpickling would run ``touch marker``."""
    code = ("import os, torch\n"
            "class Evil:\n"
            f"    def __reduce__(self): return (os.system, ('touch {marker}',))\n"
            f"torch.save({{'model': {{}}, 'args': None, 'cfg': None, 'x': Evil()}}, {str(path)!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    return path


# ---------------------------------------------------------------------------- the batch
@pytest.fixture(scope="module")
def faults(data_bin, tmp_path_factory):
    """Every in-process scenario in one worker; {scenario: {step: result}}."""
    work = tmp_path_factory.mktemp("faults")
    raw = work / "raw"
    raw.mkdir()
    (raw / "test.src").write_text("".join(s + "\n" for s, _ in SPECIAL_TEST))
    (raw / "test.tgt").write_text("".join(t + "\n" for _, t in SPECIAL_TEST))
    (work / "interactive.txt").write_text("".join(s + "\n" for s in INTERACTIVE))
    special = work / "special-bin"
    _evil_checkpoint(work / "evil.pt", work / "pwned")
    empty = _empty_split(data_bin, work / "empty-bin")
    other = _other_dictionary(data_bin, work / "other-dict-bin")
    ckpt = work / "base" / "checkpoint_last.pt"
    inter = [str(data_bin), "--user-dir", USER_DIR, "--path", str(ckpt), "--source-lang", "src", "--target-lang",
             "tgt", "--beam", "2", "--max-len-b", "5", "--cpu", "--input", str(work / "interactive.txt")]
    combos = {
        "base": [("train", "train", train_argv(data_bin, work / "base", "deepnmt_transformer", TRAIN_FLAGS))],
        "special": [
            ("preprocess", "preprocess", ["--source-lang", "src", "--target-lang", "tgt", "--testpref",
                                          str(raw / "test"), "--destdir", str(special), "--srcdict",
                                          str(data_bin / "dict.src.txt"), "--tgtdict", str(data_bin / "dict.tgt.txt"),
                                          "--workers", "1"]),
            ("generate", "generate", generate_argv(special, ckpt, 2)),
            ("generate-limit", "generate", [*generate_argv(special, ckpt, 2), "--max-source-positions", "20"]),
            ("generate-limit-skip", "generate", [*generate_argv(special, ckpt, 2), "--max-source-positions", "20",
                                                 "--skip-invalid-size-inputs-valid-test"]),
        ],
        "interactive": [("default", "interactive", inter),
                        ("skip", "interactive", [*inter, "--skip-invalid-size-inputs-valid-test"]),
                        ("skip-buffered", "interactive", [*inter, "--skip-invalid-size-inputs-valid-test",
                                                          "--buffer-size", "5", "--batch-size", "5"])],
        "empty-train": [("train", "train", train_argv(empty, work / "empty", "deepnmt_transformer", TRAIN_FLAGS))],
        "filtered-train": [("train", "train", train_argv(data_bin, work / "filtered", "deepnmt_transformer",
                                                         TRAIN_FLAGS, extra=["--max-source-positions", "3",
                                                                             "--max-target-positions", "3"]))],
        "other-layers": [("train", "train", train_argv(data_bin, work / "other-layers", "deepnmt_transformer",
                                                       ["--encoder-layers", "3", "--decoder-layers", "2"],
                                                       extra=["--restore-file", str(ckpt)]))],
        "other-features": [("train", "train", train_argv(data_bin, work / "other-features", "deepnmt_transformer",
                                                         [*TRAIN_FLAGS, "--deep-memory", "transparent",
                                                          "--rpr-max-relative-position", "2"],
                                                         extra=["--finetune-from-model", str(ckpt)]))],
        "other-dictionary": [("generate", "generate", generate_argv(other, ckpt, 2))],
        "kill-setup": [("train", "train", train_argv(data_bin, work / "at2", "deepnmt_transformer", TRAIN_FLAGS,
                                                     max_update=2, extra=KILL_FLAGS))],
        "unsafe": [("train", "train", train_argv(data_bin, work / "unsafe", "deepnmt_transformer", TRAIN_FLAGS,
                                                 extra=["--restore-file", str(work / "evil.pt")]))],
        "truncated": [("cut", "truncate", [str(ckpt), str(work / "cut.pt")]),
                      ("generate", "generate", generate_argv(data_bin, work / "cut.pt", 2))],
    }
    proc, res = _start_worker(work, combos, "faults", continue_on_error=True)
    results = _finish(proc, res)
    results["_work"] = str(work)
    results["_installed_by_import"] = results.pop("_worker")["installed_by_import"]
    return results


def _out(result):
    return Path(result["out"]).read_text()


def _hyp_ids(text):
    return sorted(int(m) for m in re.findall(r"^H-(\d+)\t", text, flags=re.M))


def _ok(result):
    assert result["ok"], (result.get("error"), result.get("trace", "")[-2000:])


# ---------------------------------------------------------------------------- empty data
@pytest.mark.slow
def test_empty_training_split_gives_a_clear_error(faults):
    res = faults["empty-train"]["train"]
    assert not res["ok"]
    assert res["error"].startswith("EmptyDatasetError")
    assert "train.src-tgt.src.bin is empty" in res["error"] and "no sentences" in res["error"]
    assert "cannot mmap" not in res["error"]


@pytest.mark.slow
def test_training_split_filtered_out_by_length_gives_a_clear_error(faults):
    res = faults["filtered-train"]["train"]
    assert not res["ok"]
    assert res["error"].startswith("EmptyDatasetError"), res["error"]
    msg = res["error"]
    assert "all 120 sentence pairs of the training split 'train'" in msg
    assert "allowed maximum of (3, 3) (source, target) tokens" in msg and "--max-source-positions" in msg
    assert "the shortest pair has 4 source / 4 target tokens" in msg
    assert not (Path(faults["_work"]) / "filtered" / "checkpoint_last.pt").exists()


def test_batch_by_size_of_no_indices_is_no_batch():
    """fairseq raises IndexError (b[-1] of an empty list) when a filter left nothing."""
    from deepnmt_fairseq import fairseq_fixes
    from fairseq.data import data_utils

    fairseq_fixes.install()
    assert data_utils.batch_by_size(np.array([], dtype=np.int64), None, num_tokens_vec=np.array([], dtype=np.int64),
                                    max_tokens=10, required_batch_size_multiple=8) == []


# ---------------------------------------------------------------------------- generation
def test_generation_keeps_the_last_partial_batch():
    """fairseq 0.12 drops the last batch unless its size is a multiple of
    --required-batch-size-multiple (default 8): 10 sentences in batches of 4 -> 8 translated."""
    from deepnmt_fairseq import fairseq_fixes
    from fairseq.data import data_utils

    idx = np.arange(10, dtype=np.int64)
    sizes = np.full(10, 5, dtype=np.int64)

    def covered():
        batches = data_utils.batch_by_size(idx, None, num_tokens_vec=sizes, max_sentences=4,
                                           required_batch_size_multiple=8)
        return sorted(int(i) for b in batches for i in b), [len(b) for b in batches]

    fairseq_fixes.install()
    try:
        fairseq_fixes.uninstall(kinds=("behaviour",))
        stock, _ = covered()
        assert stock == list(range(8))  # what fairseq does on its own
        fairseq_fixes.install()
        kept, sizes_ = covered()
        assert kept == list(range(10)) and sizes_ == [4, 4, 2]
        # max-tokens batching: the same (the tail batch already respected --max-tokens)
        batches = data_utils.batch_by_size(idx, None, num_tokens_vec=sizes, max_tokens=23,
                                           required_batch_size_multiple=2)
        assert sorted(int(i) for b in batches for i in b) == list(range(10))
        assert all(len(b) * 5 <= 23 for b in batches)
    finally:
        fairseq_fixes.install()


@pytest.mark.slow
def test_generate_translates_empty_lines_and_unknown_words(faults):
    res = faults["special"]["generate"]
    _ok(res)
    text = _out(res)
    assert _hyp_ids(text) == [0, 1, 2, 3, 4]  # every sentence, none dropped
    assert re.search(r"^S-1\t$", text, flags=re.M)  # the empty line: a source of just </s>
    assert "S-2\t<unk> the <unk>" in text  # unknown words become <unk> (fairseq's dictionary)


@pytest.mark.slow
def test_generate_refuses_over_long_sentences_unless_told_to_skip_them(faults):
    err = faults["special"]["generate-limit"]
    assert not err["ok"]
    assert "Size of sample #3 is invalid" in err["error"] and "--skip-invalid-size-inputs-valid-test" in err["error"]
    skip = faults["special"]["generate-limit-skip"]
    _ok(skip)
    text = _out(skip)
    assert _hyp_ids(text) == [0, 1, 2, 4]
    # the skipped sentence is reported, not silently dropped: translated + skipped = all
    m = re.search(r"(\d+) samples have invalid sizes and will be skipped.*ids=\[(\d+)\]", text)
    assert m and int(m.group(1)) == 1 and m.group(2) == "3"
    assert len(_hyp_ids(text)) + int(m.group(1)) == len(SPECIAL_TEST)


@pytest.mark.slow
def test_interactive_handles_empty_unknown_and_over_long_lines(faults):
    default = faults["interactive"]["default"]
    assert not default["ok"]  # fairseq stops at the over-long line with a clear error ...
    assert "Size of sample #0 is invalid" in default["error"]
    assert "--skip-invalid-size-inputs-valid-test" in default["error"]
    text = _out(default)
    assert _hyp_ids(text) == [0, 1, 2]  # ... after translating the lines before it
    assert re.search(r"^S-1\t$", text, flags=re.M) and "S-2\t<unk> the <unk>" in text
    for name in ("skip", "skip-buffered"):
        res = faults["interactive"][name]
        _ok(res)
        text = _out(res)
        assert _hyp_ids(text) == [0, 1, 2, 4], name  # ids are input line numbers: the gap is visible
        assert "1 samples have invalid sizes and will be skipped" in text


# ---------------------------------------------------------------------------- checkpoints
@pytest.mark.slow
def test_restore_file_with_another_layer_count_names_the_mismatch(faults):
    res = faults["other-layers"]["train"]
    assert not res["ok"]
    assert res["error"].startswith("CheckpointMismatchError"), res["error"]
    ckpt = str(Path(faults["_work"]) / "base" / "checkpoint_last.pt")
    assert f"checkpoint {ckpt} has 2 encoder layers; this model has 3 encoder layers" in res["error"]
    assert "size mismatch" not in res["error"]


@pytest.mark.slow
def test_finetune_from_a_model_without_the_features_names_them(faults):
    res = faults["other-features"]["train"]
    assert not res["ok"]
    msg = res["error"]
    assert msg.startswith("CheckpointMismatchError"), msg
    assert "no transparent attention (--deep-memory transparent)" in msg
    assert "no relative positions (--rpr-max-relative-position)" in msg


@pytest.mark.slow
def test_generate_with_another_dictionary_names_the_sizes(faults, data_bin):
    res = faults["other-dictionary"]["generate"]
    assert not res["ok"]
    msg = res["error"]
    assert msg.startswith("CheckpointMismatchError"), msg
    n = sum(1 for _ in open(data_bin / "dict.src.txt")) + 4  # + bos, pad, eos, unk
    assert f"a source dictionary of {n} symbols" in msg and f"a source dictionary of {n + 8} symbols" in msg
    assert "dict.*.txt" in msg


def test_describe_mismatch_reports_dims_and_falls_back_to_keys():
    from deepnmt_fairseq.behaviour_fixes import describe_mismatch

    def state(layers, dim, vocab):
        out = {"encoder.embed_tokens.weight": torch.zeros(vocab, dim)}
        for i in range(layers):
            out[f"encoder.layers.{i}.fc1.weight"] = torch.zeros(2 * dim, dim)
        return out

    msg = describe_mismatch(state(2, 8, 30), state(2, 16, 30), "x.pt")
    assert msg == ("checkpoint x.pt has embedding dim 16, encoder FFN dim 32; this model has embedding dim 8, "
                   "encoder FFN dim 16. Give the same architecture flags as the checkpoint (fewer layers from a "
                   "deep model: deepnmt-extract-student).")
    odd = state(1, 8, 30)
    extra = dict(odd, **{"encoder.something.weight": torch.zeros(1)})
    assert "unexpected: encoder.something.weight" in describe_mismatch(odd, extra, "y.pt")
    assert describe_mismatch(odd, dict(odd)) is None
    # CAD with ratio 1.0 builds decoder layers without cross-attention: say so
    from fairseq_helpers import build_model, tiny_model_flags

    flags = [*map(str, tiny_model_flags()), "--encoder-layers", "1", "--decoder-layers", "3"]
    plain = build_model("deepnmt_transformer", flags).state_dict()
    cad = build_model("deepnmt_transformer", flags + ["--cad-drop-depth", "2", "--cad-drop-ratio", "1.0"]).state_dict()
    msg = describe_mismatch(cad, plain, "p.pt")
    assert msg.startswith("checkpoint p.pt has 3 decoder layers with cross-attention; this model has 1 decoder "
                          "layers with cross-attention."), msg


def _truncated_copy(src: Path, dest: Path):
    data = src.read_bytes()
    dest.write_bytes(data[: len(data) // 3])
    return dest


@pytest.fixture(scope="module")
def base_checkpoint(faults):
    return Path(faults["_work"]) / "base" / "checkpoint_last.pt"


@pytest.mark.slow
def test_truncated_checkpoint_through_the_clis(data_bin, tmp_path, faults, base_checkpoint):
    gen = faults["truncated"]["generate"]
    assert not gen["ok"]
    assert gen["error"].startswith(f"CorruptCheckpointError: Cannot read checkpoint {Path(faults['_work']) / 'cut.pt'}")
    cut = _truncated_copy(base_checkpoint, tmp_path / "cut.pt")
    res = run_cli("fairseq-train", *train_argv(data_bin, tmp_path / "save", "deepnmt_transformer", TRAIN_FLAGS,
                                               extra=["--restore-file", str(cut)]), check=False)
    assert res.returncode != 0
    assert f"CorruptCheckpointError: Cannot read checkpoint {cut}" in res.stderr
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


@pytest.mark.slow
def test_restore_file_that_pickles_code_is_refused_by_fairseq_train(faults):
    res = faults["unsafe"]["train"]
    work = Path(faults["_work"])
    assert not res["ok"]
    assert res["error"].startswith(f"UnsafeCheckpointError: Refusing to load checkpoint {work / 'evil.pt'}")
    assert not (work / "pwned").exists(), "the pickled command ran"
    assert not (work / "unsafe" / "checkpoint_last.pt").exists()


# ---------------------------------------------------------------------------- SIGTERM during a save
# Runs fairseq-train's cli_main with a fault-injection hook: the first time the process
# writes bytes meant for a file whose name contains "checkpoint_last.pt" (fairseq's
# torch.save into checkpoint_last.pt.tmp, or the shutil.copyfile of checkpoint_*.pt onto
# checkpoint_last.pt, or the guard's temporary copy), it writes half of them, flushes and
# SIGTERMs itself (default action: immediate death, no Python cleanup) -- what a cluster
# pre-emption does in the middle of a save.
KILL_LAUNCHER = r"""
import io, os, shutil, signal, sys, time, torch
import deepnmt_fairseq
from deepnmt_fairseq import fairseq_fixes
fairseq_fixes.install() if os.environ["DEEPNMT_TEST_GUARDS"] == "1" else fairseq_fixes.uninstall(kinds=("behaviour",))
TARGET = "checkpoint_last.pt"

def die_half_way(data, f):
    f.write(data[: len(data) // 2]); f.flush(); os.fsync(f.fileno())
    print("KILLING during write of", getattr(f, "name", "?"), file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)

_copyfile = shutil.copyfile
def copyfile(src, dst, *a, **k):
    if TARGET in os.path.basename(str(dst)):
        with open(src, "rb") as s, open(dst, "wb") as d:
            die_half_way(s.read(), d)
    return _copyfile(src, dst, *a, **k)
shutil.copyfile = copyfile

_save = torch.save
def save(obj, f, *a, **k):
    name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "")
    if TARGET in os.path.basename(str(name)):
        buf = io.BytesIO(); _save(obj, buf, *a, **k)
        die_half_way(buf.getvalue(), open(f, "wb") if isinstance(f, (str, os.PathLike)) else f)
    return _save(obj, f, *a, **k)
torch.save = save

from fairseq_cli.train import cli_main
sys.argv = ["fairseq-train"] + sys.argv[1:]
cli_main()
"""

KILL_FLAGS = ["--batch-size", "8", "--required-batch-size-multiple", "1", "--disable-validation"]


def _kill_run(data_bin, save, guards, extra, max_update=4):
    argv = train_argv(data_bin, save, "deepnmt_transformer", TRAIN_FLAGS, max_update=max_update,
                      extra=[*KILL_FLAGS, *extra])
    env = dict(os.environ, OMP_NUM_THREADS="1", DEEPNMT_TEST_GUARDS="1" if guards else "0")
    return subprocess.run([sys.executable, "-c", KILL_LAUNCHER, *argv], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture(scope="module")
def saved_at_2(faults):
    """A save directory whose checkpoint_last.pt is at update 2 (15 batches per epoch: all mid-epoch)."""
    assert faults["kill-setup"]["train"]["ok"], faults["kill-setup"]["train"].get("error")
    return Path(faults["_work"]) / "at2"


def _num_updates(path):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    return load_checkpoint(str(path))["optimizer_history"][-1]["num_updates"]


@pytest.mark.slow
@pytest.mark.parametrize("route", ["copy", "torch.save"])
def test_sigterm_during_a_save_keeps_the_previous_checkpoint_last(data_bin, tmp_path, saved_at_2, route):
    save = tmp_path / "save"
    shutil.copytree(saved_at_2, save)
    # copy: checkpoint_1_4.pt is written first, checkpoint_last.pt copied from it (fairseq's
    # non-atomic step); torch.save: checkpoint_last.pt is the first (fairseq's tmp + rename)
    extra = ["--save-interval-updates", "2"] if route == "copy" else []
    res = _kill_run(data_bin, save, guards=True, extra=extra)
    assert res.returncode == -15 and "KILLING during write of" in res.stderr, res.stderr[-3000:]
    assert _num_updates(save / "checkpoint_last.pt") == 2  # the previous one, intact
    if route == "copy":
        assert _num_updates(save / "checkpoint_1_4.pt") == 4  # written before the copy began
        assert [p.name for p in save.glob(".checkpoint_last.pt.*.tmp")]  # the half-written copy, aside


@pytest.mark.slow
def test_without_the_guard_the_same_sigterm_corrupts_checkpoint_last(data_bin, tmp_path, saved_at_2):
    """Control: fairseq 0.12 copies checkpoint_last.pt non-atomically (shows the test can fail)."""
    from deepnmt_fairseq.checkpoint_safety import CorruptCheckpointError

    save = tmp_path / "save"
    shutil.copytree(saved_at_2, save)
    res = _kill_run(data_bin, save, guards=False, extra=["--save-interval-updates", "2"])
    assert res.returncode == -15, res.stderr[-3000:]
    with pytest.raises(CorruptCheckpointError):
        _num_updates(save / "checkpoint_last.pt")


def test_atomic_copy_replaces_whole_files_only(tmp_path):
    from deepnmt_fairseq.behaviour_fixes import AtomicCopyPathManager, atomic_copy

    src, dst = tmp_path / "a.pt", tmp_path / "b.pt"
    src.write_bytes(b"new" * 1000)
    dst.write_bytes(b"old")
    assert AtomicCopyPathManager.copy(str(src), str(dst), overwrite=False) is False
    assert dst.read_bytes() == b"old"
    assert AtomicCopyPathManager.copy(str(src), str(dst), overwrite=True) is True
    assert dst.read_bytes() == src.read_bytes()
    assert oct(dst.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]  # no temporary left
    with pytest.raises(FileNotFoundError):
        atomic_copy(str(tmp_path / "missing.pt"), str(dst))
    assert dst.read_bytes() == src.read_bytes() and len(list(tmp_path.iterdir())) == 2


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_guards_install_and_uninstall_cleanly():
    from deepnmt_fairseq import behaviour_fixes, fairseq_fixes
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils
    from fairseq.models import distributed_fairseq_model

    fairseq_fixes.install()
    def current():
        return (checkpoint_utils.PathManager, data_utils.batch_by_size,
                distributed_fairseq_model.DistributedDataParallel)

    guarded = current()
    fairseq_fixes.install()  # idempotent
    assert current() == guarded
    fairseq_fixes.uninstall(kinds=("behaviour",))
    try:
        assert checkpoint_utils.PathManager is not behaviour_fixes.AtomicCopyPathManager
        assert distributed_fairseq_model.DistributedDataParallel is torch.nn.parallel.DistributedDataParallel
        assert not hasattr(data_utils.batch_by_size, "__wrapped__")
    finally:
        fairseq_fixes.install()
    assert checkpoint_utils.PathManager is behaviour_fixes.AtomicCopyPathManager


@pytest.mark.slow
def test_the_plugin_installs_the_guards(faults):
    """``import deepnmt_fairseq`` (what --user-dir does) turns the guards on (checked in the
    worker process, before it calls install() itself)."""
    assert faults["_installed_by_import"] is True
