"""--tensorboard-logdir out of the box: fairseq writes event files (tensorboardX is a dependency)
and the deep_translation diagnostics are in them, at the updates they belong to.

The event files are read back with deepnmt_fairseq.analysis.tensorboard_events (TFRecord
framing + tensorboardX's Event protobuf; no `tensorboard` package needed)."""

import json
import re
import struct

import pytest

from deepnmt_fairseq.analysis import tensorboard_events as tbe
from fairseq_helpers import tiny_model_flags, train


def test_tensorboardx_is_installed_where_fairseq_looks_for_it():
    """fairseq's progress_bar takes torch.utils.tensorboard (needs `tensorboard`) or else
    tensorboardX; without either it only warns 'tensorboard not found' and writes nothing."""
    from fairseq.logging import progress_bar

    assert progress_bar.SummaryWriter is not None


def test_reader_round_trip_and_damaged_files(tmp_path):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "run" / "train_inner"))
    for step, v in ((1, 0.5), (2, 0.25), (4, 0.125)):
        w.add_scalar("loss", v, step)
    w.add_scalar("grad_ratio", 3.0, 2)
    w.add_text("sys.argv", "fairseq-train ...")  # not a scalar: skipped
    w.close()
    scalars = tbe.read_scalars(str(tmp_path / "run"))
    assert scalars == {"train_inner": {"loss": [(1, 0.5), (2, 0.25), (4, 0.125)], "grad_ratio": [(2, 3.0)]}}

    (path,) = tbe.event_files(str(tmp_path / "run"))
    blob = bytearray(open(path, "rb").read())
    # a record cut short (a writer still running) ends the file quietly
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "events.out.tfevents.1").write_bytes(bytes(blob[:-3]))
    cut = tbe.read_scalars(str(tmp_path / "cut"))["."]
    assert cut["loss"][:2] == [(1, 0.5), (2, 0.25)]
    # a flipped byte in a record's data fails its checksum
    (length,) = struct.unpack("<Q", bytes(blob[:8]))
    blob[12 + length + 4 + 12 + 2] ^= 0xFF  # inside the second record's data
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "events.out.tfevents.1").write_bytes(bytes(blob))
    with pytest.raises(tbe.EventFileError, match="checksum"):
        tbe.read_scalars(str(tmp_path / "bad"))


def _json_lines(text, tag):
    out = []
    for line in text.splitlines():
        m = re.search(r"\|\s*" + tag + r"\s*\|\s*(\{.*\})\s*$", line)
        if m:
            out.append(json.loads(m.group(1)))
    return out


@pytest.mark.slow
def test_deep_translation_diagnostics_reach_tensorboard(data_bin, tmp_path):
    tb = tmp_path / "tb"
    res = train(data_bin, tmp_path / "ck", "deepnmt_transformer",
                [*tiny_model_flags(), "--share-all-embeddings", "--encoder-layers", "2", "--decoder-layers", "2",
                 "--task", "deep_translation", "--log-grad-norms-every", "2", "--log-grad-ratio",
                 "--log-format", "json", "--tensorboard-logdir", tb, "--no-save"], max_update=4)
    out = res.stdout + res.stderr
    assert "tensorboard not found" not in out

    scalars = tbe.read_scalars(str(tb))
    assert {"train_inner", "train", "valid"} <= set(scalars)
    inner = scalars["train_inner"]
    # fairseq's own statistics: one point per update (--log-interval 1)
    assert [s for s, _ in inner["loss"]] == [1, 2, 3, 4]
    # the diagnostics: update 1 and every 2nd update, at the update they belong to
    diag_keys = {"enc_gnorm_1", "enc_gnorm_2", "dec_gnorm_1", "dec_gnorm_2", "grad_ratio", "grad_norm_h1",
                 "grad_norm_hN", "diag_update"}
    assert diag_keys <= set(inner), sorted(inner)
    for key in diag_keys:
        assert [s for s, _ in inner[key]] == [1, 2, 4], key
    assert [v for _, v in inner["diag_update"]] == [1.0, 2.0, 4.0]
    assert all(v > 0 for _, v in inner["grad_ratio"])

    # the same numbers as the console's JSON lines
    lines = {int(d["num_updates"]): d for d in _json_lines(res.stdout, "train_inner")}
    for step, value in inner["grad_ratio"]:
        assert value == pytest.approx(float(lines[step]["grad_ratio"]), rel=1e-4)
    for step, value in inner["loss"]:
        assert value == pytest.approx(float(lines[step]["loss"]), rel=1e-3)
    # the validation loss is there too, once per epoch
    assert len(scalars["valid"]["loss"]) >= 1
