"""Weights-only checkpoint loading: fairseq's checkpoints load, code never runs."""

import argparse
import os
import pickle
import random

import numpy as np
import pytest
import torch

import deepnmt_fairseq  # noqa: F401  (installs the allow-list and the loader wrappers)
from deepnmt_fairseq.checkpoint_safety import (
    CorruptCheckpointError,
    UnsafeCheckpointError,
    load_checkpoint,
)
from fairseq import checkpoint_utils
from omegaconf import OmegaConf


class _Evil:
    """Pickles to a call of os.system when loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _fairseq_like_state(extra=None):
    state = {
        "args": argparse.Namespace(arch="transformer", seed=1),
        "cfg": None,
        "model": {"w": torch.ones(2, 2)},
        "optimizer_history": [{"criterion_name": "x", "optimizer_name": "adam", "lr_scheduler_state": {}, "num_updates": 3}],
        "extra_state": {"best": np.float64(1.5), "counts": np.array([1, 2, 3]), "n": np.int64(4)},
    }
    state.update(extra or {})
    return state


def test_plain_fairseq_checkpoint_loads_weights_only(tmp_path):
    path = tmp_path / "ok.pt"
    cfg = OmegaConf.create({"model": {"_name": "transformer"}, "common": {"seed": 1}})
    torch.save(_fairseq_like_state({"cfg": OmegaConf.to_container(cfg)}), path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert torch.equal(state["model"]["w"], torch.ones(2, 2))
    assert state["extra_state"]["best"] == 1.5
    assert list(state["extra_state"]["counts"]) == [1, 2, 3]
    # also with torch's own defaults (weights_only=True) and our loader
    assert load_checkpoint(str(path))["args"].seed == 1


def test_omegaconf_objects_in_checkpoint_load(tmp_path):
    """What rank 0 re-pickles for the other ranks on a distributed resume."""
    path = tmp_path / "dist.pt"
    cfg = OmegaConf.create({"a": {"b": [1, 2]}, "c": None})
    torch.save({"model": {}, "cfg": cfg}, path)
    state = load_checkpoint(str(path))
    assert state["cfg"].a.b[1] == 2


@pytest.mark.parametrize("force_env", [False, True])
def test_malicious_checkpoint_is_refused_and_nothing_runs(tmp_path, monkeypatch, force_env):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save(_fairseq_like_state({"extra_state": {"x": _Evil(marker)}}), path)
    if force_env:  # the user switched protection off globally: fairseq loads stay protected
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeCheckpointError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert str(path) in str(err.value)
    assert "posix.system" in str(err.value) or "system" in str(err.value)
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(str(path))
    assert not marker.exists(), "the pickled command ran"
    if force_env:
        assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"  # restored


def test_truncated_checkpoint_gives_clear_error(tmp_path):
    path = tmp_path / "cut.pt"
    torch.save(_fairseq_like_state(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpointError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert str(path) in str(err.value)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CorruptCheckpointError):
        load_checkpoint(str(empty))


def test_plain_pickle_global_outside_allowlist_refused(tmp_path):
    """Any class that is not in the allow-list (here a harmless one) is refused too."""
    path = tmp_path / "other.pt"
    torch.save({"model": {}, "x": pickle.PicklingError("not allowed")}, path)
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(str(path))


def test_ema_reader_refuses_code_and_loads_weights(tmp_path, monkeypatch):
    """fairseq's EMA reader (--ema-start-update with --restore-file) is protected like the main one,
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD included."""
    good = tmp_path / "ema.pt"
    torch.save(_fairseq_like_state({"extra_state": {"ema": {"w": torch.full((2, 2), 3.0)}}}), good)
    assert torch.equal(checkpoint_utils.load_ema_from_checkpoint(str(good))["model"]["w"], torch.full((2, 2), 3.0))
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil-ema.pt"
    torch.save(_fairseq_like_state({"extra_state": {"ema": {}, "x": _Evil(marker)}}), evil)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeCheckpointError, match=f"Refusing to load checkpoint {evil}"):
        checkpoint_utils.load_ema_from_checkpoint(str(evil))
    assert not marker.exists(), "the pickled command ran"


@pytest.mark.parametrize("content", [
    random.Random(0).randbytes(1000),  # torch: "Unsupported operand"
    random.Random(20).randbytes(1000),  # torch: KeyError
    random.Random(195).randbytes(1000),  # torch: UnicodeDecodeError
    b"cat sat on the\nmat\n",  # text starting with "c" (pickle's GLOBAL): torch says "Unsupported global"
    pickle.dumps({"model": {"w": [1.0]}}, protocol=4),  # a plain pickle, not torch.save's format
], ids=["random_operand", "random_keyerror", "random_unicode", "text_global", "plain_pickle"])
@pytest.mark.parametrize("loader", ["ours", "fairseq"])
def test_not_a_checkpoint_is_called_unreadable_not_unsafe(tmp_path, content, loader):
    """A file that is not a checkpoint at all is refused as not a readable checkpoint (naming the
    file and its first bytes), whatever torch's reader tripped on, and not as one that 'could run
    arbitrary code'."""
    path = tmp_path / "not-a-checkpoint.pt"
    path.write_bytes(content)
    load = load_checkpoint if loader == "ours" else checkpoint_utils.load_checkpoint_to_cpu
    with pytest.raises(CorruptCheckpointError) as err:
        load(str(path))
    msg = str(err.value)
    assert msg.startswith(f"Cannot read checkpoint {path}: it is not a readable checkpoint (it begins with "), msg
    assert "arbitrary code" not in msg and "Nothing from it was executed" in msg


def test_unsupported_pickle_protocol_is_unreadable_not_unsafe(tmp_path):
    """torch's legacy format with pickle protocol 4 (FRAME: an opcode the weights-only reader lacks)
    is a real torch file: not readable here, and not called unsafe."""
    path = tmp_path / "proto4.pt"
    torch.save({"model": {"w": torch.ones(2)}}, path, _use_new_zipfile_serialization=False, pickle_protocol=4)
    with pytest.raises(CorruptCheckpointError, match="Unsupported operand 149.*pickle_protocol") as err:
        load_checkpoint(str(path))
    assert "it begins with" not in str(err.value) and "arbitrary code" not in str(err.value)
    # the default protocol of the same format loads
    torch.save({"model": {"w": torch.ones(2)}}, path, _use_new_zipfile_serialization=False)
    assert torch.equal(load_checkpoint(str(path))["model"]["w"], torch.ones(2))
