"""Issue 81: the memory and time planner (deepnmt_fairseq/repro/plan.py, analysis/training_cost.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from deepnmt_fairseq.analysis import training_cost as tc
from deepnmt_fairseq.repro import plan as planner

REPO = Path(__file__).resolve().parents[1]

#: one registry row per family of the issue; deep rows are counted at a reduced encoder depth (the
#: fit's job, linearity in the batch shape, does not depend on the depth; the full-depth fits of the
#: headline rows carry their own held-out errors in benchmarks/results/plan-fits.json, checked below)
FAMILIES = {
    "plain": ("msc-iwslt14-ende-plain-36L", ["--encoder-layers", "6"]),
    "MSC": ("msc-iwslt14-ende-6L", []),
    "transparent": ("transparent-wmt14-ende-6L", []),
    "DLCL": ("msc-iwslt14-ende-wang-36L", ["--encoder-layers", "8"]),
    "DeepNorm": ("deepnet-wmt-ende-6L-6L", []),
    "DESDAR": ("gpkd-wmt14-ende-desdar-48-3", ["--encoder-layers", "8"]),
}


def _stage(name):
    from deepnmt_fairseq.repro.registry import EXPERIMENTS

    return EXPERIMENTS[name], EXPERIMENTS[name].train_stages[-1]


def _tiny(**kw):
    flags = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
             "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
             "--encoder-layers", "2", "--decoder-layers", "2", "--share-all-embeddings"]
    return tc.build_stage_model("deepnmt_transformer", flags, vocab=200, **kw)


@pytest.mark.parametrize("optimizer", ["adam", "radam"])
def test_state_bytes_equal_a_direct_count(optimizer):
    """Parameters, gradients and optimizer state of a real optimizer step, counted tensor by tensor."""
    model = _tiny()
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        # what the plugin's --optimizer radam builds (deepnmt_fairseq/optim/radam.py)
        opt = torch.optim.RAdam(model.parameters(), lr=1e-3, decoupled_weight_decay=True)
    src = torch.randint(4, 200, (2, 5))
    out, _ = model(src, torch.full((2,), 5), src)
    out.float().sum().backward()
    opt.step()
    n = tc.parameter_count(model)
    got = tc.state_bytes(n, "fp32", optimizer)
    assert got["parameters"] == sum(p.nbytes for p in model.parameters())
    assert got["gradients"] == sum(p.grad.nbytes for p in model.parameters())
    moments = sum(t.nbytes for st in opt.state.values() for k, t in st.items()
                  if torch.is_tensor(t) and t.dim() > 0 and k != "step")
    assert got["optimizer"] == moments
    # --bf16: the model's bf16 weights (counted) plus fp32 master weights (as the fp32 count)
    bf = model.to(torch.bfloat16)
    assert tc.state_bytes(n, "bf16", optimizer)["parameters"] == sum(p.nbytes for p in bf.parameters()) + got["parameters"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_activation_fit_predicts_held_out_shapes(family):
    """The fit of the saved-tensor count, applied at shapes not used in it, is within 5% of the count."""
    name, overrides = FAMILIES[family]
    _exp, stage = _stage(name)
    model = tc.build_stage_model(stage.arch, stage.model_flags, overrides=overrides).to(torch.bfloat16)
    f = tc.fit(model)
    assert not set(map(tuple, tc.HELD_OUT_SHAPES)) & set(map(tuple, tc.FIT_SHAPES))
    for shape, measured, predicted in f.held_out:
        assert measured > 0
        assert abs(predicted / measured - 1) < 0.05, (family, shape, measured, predicted)
    # and the count is real: a batch twice as large saves more (not a constant)
    assert tc.count_step(model, 4, 10, 10).saved > 1.5 * tc.count_step(model, 2, 10, 10).saved


def test_headline_fits_recorded_with_small_held_out_error():
    """benchmarks/results/plan-fits.json: every headline row's full-depth fit (bf16, with and without
    checkpointing) was checked on held-out shapes, each within 5%.  HIERTRANS is not exactly linear in
    the shape (its fit is anchored at its planning lengths, plan.ANCHOR_ABOVE): there the bound holds
    at the held-out shape of planning size, and the small shapes' error is reported, not bounded."""
    cache = json.loads(planner.FITS_FILE.read_text())
    for name in planner.HEADLINE:
        exp, stage = _stage(name)
        for ck in (False, True):
            entry = cache[planner.stage_key(stage, "bf16", ck)]
            assert entry["fit"]["held_out"], name
            anchored = len(entry["fit"]["held_out"]) > len(tc.HELD_OUT_SHAPES)
            for shape, measured, predicted in entry["fit"]["held_out"]:
                if anchored and tuple(shape) != planner.mid_shape(planner.planning_lengths(exp)):
                    continue
                assert abs(predicted / measured - 1) < 0.05, (name, ck, shape)
            assert anchored == ("hiertrans" in stage.arch), name  # only HIERTRANS needed anchoring


def test_checkpointing_saves_less_and_counts_layers():
    model = _tiny()
    ck = _tiny(checkpoint_activations=True)
    plain, with_ck = tc.count_step(model, 2, 6, 6), tc.count_step(ck, 2, 6, 6)
    assert with_ck.saved < plain.saved
    assert set(plain.by_layer) == {"encoder.0", "encoder.1", "decoder.0", "decoder.1"}
    assert plain.flops > 0


def test_max_tokens_is_the_largest_that_fits():
    exp, stage = _stage("msc-iwslt14-ende-72L-l2")
    for mem, ck in ((24, False), (40, True), (80, False)):
        p = planner.plan_stage(exp, stage, 8, mem, "bf16", ck)
        assert p.fits
        assert p.state_total + p.activation_bytes(p.max_tokens) <= p.usable_bytes
        assert p.state_total + p.activation_bytes(p.max_tokens + 64) > p.usable_bytes
        uf = p.update_freq
        assert uf * p.max_tokens * 8 >= p.tokens_per_update > (uf - 1) * p.max_tokens * 8
    # checkpointing fits more tokens; more memory fits more tokens
    a, b = (planner.plan_stage(exp, stage, 8, 40, "bf16", ck) for ck in (False, True))
    assert b.max_tokens > a.max_tokens
    assert planner.plan_stage(exp, stage, 8, 80, "bf16").max_tokens > a.max_tokens
    # FLOPs from the count: checkpointing adds one forward (4/3); the time halves on twice the GPUs
    assert b.flops_per_token == pytest.approx(4 / 3 * a.flops_per_token) and a.flops_per_token > 0
    two = planner.plan_stage(exp, stage, 16, 40, "bf16", False)
    assert two.seconds_per_update() == pytest.approx(a.seconds_per_update() / 2)


def test_parse_memory():
    assert planner.parse_memory("80G") == planner.parse_memory("80GiB") == planner.parse_memory("80") == 80
    assert planner.parse_memory("40960M") == 40
    with pytest.raises(planner.PlanError, match="--gpu-memory"):
        planner.parse_memory("lots")


def _repro(capsys, *argv):
    from deepnmt_cli.repro import main

    rc = main(list(argv))
    return rc, capsys.readouterr()


def test_dry_run_writes_the_planned_batch(capsys, tmp_path):
    exp, stage = _stage("deepnet-wmt-ende-100L-100L")
    p = planner.plan_stage(exp, stage, 8, 24, "bf16", False)
    rc, out = _repro(capsys, "train", exp.name, "--dry-run", "--gpus", "8", "--gpu-memory", "24G", "--bf16",
                     "--data-root", str(tmp_path), "--checkpoint-root", str(tmp_path))
    assert rc == 0, out.err
    from deepnmt_fairseq.repro.spec import batch_plan

    uf, mt, _ = batch_plan(p.tokens_per_update, p.max_tokens, 8)
    assert uf != batch_plan(p.tokens_per_update, stage.recipe.max_tokens, 8)[0]  # the plan changed the batch
    cmd = [ln for ln in out.out.splitlines() if "fairseq-train" in ln or "--max-tokens" in ln][-1]
    assert re.search(rf"--max-tokens {mt}\b", cmd) and re.search(rf"--update-freq {uf}\b", cmd), cmd


def test_dry_run_refuses_a_plan_that_cannot_fit(capsys, tmp_path):
    rc, out = _repro(capsys, "train", "deepnet-wmt-ende-100L-100L", "--dry-run", "--gpus", "8", "--gpu-memory", "8G",
                     "--bf16", "--data-root", str(tmp_path), "--checkpoint-root", str(tmp_path))
    assert rc != 0
    assert "--gpu-memory 8G" in out.err and "does not fit" in out.err and "cannot help" in out.err
    # the model state fits 3 GiB, one batch of the longest sentences does not: checkpointing is the way out
    rc, out = _repro(capsys, "train", "msc-iwslt14-ende-72L-l2", "--dry-run", "--gpus", "8", "--gpu-memory", "3G",
                     "--bf16", "--data-root", str(tmp_path), "--checkpoint-root", str(tmp_path))
    assert rc != 0 and "--gpu-memory 3G" in out.err and "add --checkpoint-activations" in out.err
    rc, out = _repro(capsys, "train", "msc-iwslt14-ende-72L-l2", "--dry-run", "--gpus", "8", "--gpu-memory", "3G",
                     "--bf16", "--checkpoint-activations", "--data-root", str(tmp_path), "--checkpoint-root",
                     str(tmp_path))
    assert rc == 0, out.err
    assert "--checkpoint-activations" in out.out


def test_plan_command_prints_units_and_estimate(capsys):
    rc, out = _repro(capsys, "plan", "msc-iwslt14-ende-72L-l2", "--gpu-memory", "40G", "--checkpoint-activations")
    assert rc == 0, out.err
    assert "GiB" in out.out and " GB" not in out.out and "ESTIMATE" in out.out and "held-out error" in out.out


def test_compare_with_cuda_on_cpu():
    """The GPU check's comparison, fed a CPU count as the 'measurement': the saved part is exact."""
    flags = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
             "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
             "--encoder-layers", "2", "--decoder-layers", "2"]
    model = tc.build_stage_model("deepnmt_transformer", flags, vocab=200).to(torch.bfloat16)
    measured = tc.count_step(model, 3, 11, 9).saved
    r = planner.compare_with_cuda(("deepnmt_transformer", flags), 3, 11, 9, measured, precision="bf16", vocab=200)
    assert abs(r["predicted_saved_bytes"] / measured - 1) < 0.01
    assert r["predicted_transient_bytes"] == 3 * 9 * 200 * 8
    assert r["predicted_gradient_bytes"] == 2 * tc.parameter_count(model)
    assert r["relative_error"] == pytest.approx(r["predicted_bytes"] / measured - 1)


def test_docs_table_is_generated_from_the_planner():
    text = (REPO / "docs" / "training.md").read_text()
    start, end = "<!-- plan-table: generated by deepnmt_fairseq.repro.plan.table_markdown -->", "<!-- /plan-table -->"
    assert start in text and end in text
    body = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert body == planner.table_markdown(), "docs/training.md's plan table drifted: python -m deepnmt_fairseq.repro.plan --docs"


def test_stochastic_depth_planned_with_every_layer_kept():
    """LayerDrop and cross-attention drop (CAD) rows are counted with every layer computed: the count
    does not depend on the random draw, and equals the same model without the stochastic options."""
    base = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
            "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
            "--encoder-layers", "4", "--decoder-layers", "4", "--share-all-embeddings"]
    stochastic = tc.build_stage_model("deepnmt_transformer", base + ["--encoder-layerdrop", "0.5", "--decoder-layerdrop",
                                                                     "0.5", "--cad-drop-depth", "4",
                                                                     "--cad-drop-ratio", "0.9"], vocab=200)
    plain = tc.build_stage_model("deepnmt_transformer", base, vocab=200)
    counts = set()
    for seed in range(4):
        torch.manual_seed(seed)
        counts.add(tc.count_step(stochastic, 2, 7, 9, flops=False).saved)
    assert counts == {tc.count_step(plain, 2, 7, 9, flops=False).saved}
