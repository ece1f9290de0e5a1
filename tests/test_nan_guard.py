"""A NaN/Inf stops training with the offending layer named (fairseq's NanDetector)."""

import pytest
import torch

from fairseq_helpers import tiny_model_flags, train

pytestmark = pytest.mark.slow


def test_nan_in_a_layer_stops_training_and_names_it(data_bin, tmp_path):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    flags = [*tiny_model_flags(), "--share-all-embeddings", "--deep-memory", "msc", "--msc-block-layers", "2",
             "--decoder-layers", "2"]
    train(data_bin, tmp_path / "ok", "deepnmt_transformer", flags, max_update=1)
    state = load_checkpoint(str(tmp_path / "ok" / "checkpoint_last.pt"))
    state["model"]["encoder.layers.2.fc1.weight"][0, 0] = float("nan")
    bad = tmp_path / "nan.pt"
    torch.save(state, bad)
    with pytest.raises(AssertionError) as err:
        train(data_bin, tmp_path / "run", "deepnmt_transformer",
              [*flags, "--restore-file", str(bad), "--reset-optimizer"], max_update=3)
    text = str(err.value)
    assert "FloatingPointError" in text
    assert "NaN detected in output of encoder.layers.2.fc1" in text
