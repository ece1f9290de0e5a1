"""Analysis tools: the deep_translation task's diagnostics and the plot/difficulty/attention CLIs.

In-process tests compare what the task logs with a direct torch.autograd computation on the same
batch; the slow tests train tiny models with fairseq-train and run every command on them.
"""

import csv
import json
import math

import pytest
import torch
from fairseq.logging import metrics

from deepnmt_fairseq.memories.transparent import WEIGHT_KEY

from fairseq_helpers import USER_DIR, build_model, random_batch, run_cli, tiny_model_flags, train

NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]


# ------------------------------------------------------------------ helpers
def make_task(model, **flags):
    from deepnmt_fairseq.tasks.deep_translation import DeepTranslationConfig, DeepTranslationTask

    d = model.encoder.dictionary
    return DeepTranslationTask(DeepTranslationConfig(**flags), d, d)


def make_criterion(task):
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)


def make_sample(model, seed, bsz=3):
    src, lengths, prev = random_batch(model, bsz=bsz, src_len=7, tgt_len=6, seed=seed)
    target = torch.cat([prev[:, 1:], torch.full((bsz, 1), model.decoder.dictionary.eos())], 1)
    return {"id": torch.arange(bsz), "nsentences": bsz, "ntokens": int(target.numel()), "target": target,
            "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}}


class Optimizer:
    """What fairseq's task.train_step needs of an optimizer; ``scale`` mimics fp16 loss scaling."""

    def __init__(self, scale=None):
        self.scaler = None if scale is None else type("S", (), {"loss_scale": scale})()

    def backward(self, loss):
        (loss * (self.scaler.loss_scale if self.scaler else 1.0)).backward()


def run_update(task, model, criterion, samples, update_num, optimizer=None):
    """One fairseq update (micro-batches share update_num); returns the logged values."""
    model.zero_grad(set_to_none=True)  # what Trainer.train_step does first
    with metrics.aggregate(new_root=True) as agg:
        for s in samples:
            task.train_step(s, model, criterion, optimizer or Optimizer(), update_num)
        return dict(agg.get_smoothed_values())


def direct_gradients(model, criterion, samples):
    """Per-layer parameter gradient norms / sample size and ||dL/dh_1||, ||dL/dh_N|| by autograd,
    with h from the encoder's own return_all_hiddens (not the task's hooks)."""
    model.train()
    total, size, hs1, hsn = 0.0, 0, [], []
    for s in samples:
        ni = s["net_input"]
        enc = model.encoder(ni["src_tokens"], src_lengths=ni["src_lengths"], return_all_hiddens=True)
        states = enc["encoder_states"]
        hs1.append(states[1])
        hsn.append(states[-1])
        net_output = model.decoder(ni["prev_output_tokens"], encoder_out=enc)
        loss, _ = criterion.compute_loss(model, net_output, s, reduce=True)
        total = total + loss
        size += s["ntokens"]
    layers = list(model.encoder.layers) + list(model.decoder.layers)
    params = [list(l.parameters()) for l in layers]
    flat = [p for ps in params for p in ps]
    for h in hs1 + hsn:
        h.retain_grad()
    model.zero_grad(set_to_none=True)
    total.backward()  # (torch.autograd.grad is refused under --checkpoint-activations)
    g_params, g_h = [p.grad for p in flat], [h.grad for h in hs1 + hsn]
    norms, k = [], 0
    for ps in params:
        sq = sum(float(g.pow(2).sum()) for g in g_params[k:k + len(ps)] if g is not None)
        norms.append(math.sqrt(sq) / size)
        k += len(ps)
    h1 = math.sqrt(sum(float(g.pow(2).sum()) for g in g_h[: len(hs1)]))
    hn = math.sqrt(sum(float(g.pow(2).sum()) for g in g_h[len(hs1):]))
    n_enc = len(model.encoder.layers)
    return norms[:n_enc], norms[n_enc:], h1, hn


# ------------------------------------------------------------------ the task, in-process
@pytest.mark.parametrize("memory", ["top", "transparent", "msc", "top+checkpoint-activations"])
def test_logged_grad_norms_and_ratio_equal_autograd(memory):
    memory, _, ckpt = memory.partition("+")
    extra = ["--encoder-layers", 4, "--decoder-layers", 2, "--deep-memory", memory, *tiny_model_flags(), *NO_DROPOUT,
             "--transparent-dropout", "0"] + (["--checkpoint-activations"] if ckpt else [])
    model = build_model(extra=extra, seed=3)
    task = make_task(model, log_grad_norms_every=1, log_grad_ratio=True)
    crit = make_criterion(task)
    samples = [make_sample(model, 11), make_sample(model, 12)]  # --update-freq 2: two micro-batches
    logged = run_update(task, model, crit, samples, update_num=4)
    enc, dec, h1, hn = direct_gradients(model, crit, samples)
    assert logged["diag_update"] == 5
    for i, v in enumerate(enc):
        assert logged[f"enc_gnorm_{i + 1}"] == pytest.approx(v, rel=1e-4)
    for j, v in enumerate(dec):
        assert logged[f"dec_gnorm_{j + 1}"] == pytest.approx(v, rel=1e-4)
    assert min(enc) > 0
    assert logged["grad_norm_h1"] == pytest.approx(h1, rel=1e-4)
    assert logged["grad_norm_hN"] == pytest.approx(hn, rel=1e-4)
    assert logged["grad_ratio"] == pytest.approx(h1 / hn, rel=1e-4)
    # no hook is left behind
    assert not model.encoder._forward_hooks and not model.encoder._forward_pre_hooks
    assert all(not l._forward_hooks for l in model.encoder.layers)


def test_grad_norm_divides_out_loss_scale_and_a_new_update_starts_afresh():
    model = build_model(extra=["--encoder-layers", 2, "--decoder-layers", 1, *tiny_model_flags(), *NO_DROPOUT], seed=4)
    task = make_task(model, log_grad_norms_every=1)
    crit = make_criterion(task)
    s = make_sample(model, 5)
    plain = run_update(task, model, crit, [s], update_num=0)
    scaled = run_update(task, model, crit, [s], update_num=0, optimizer=Optimizer(scale=128.0))  # fp16 retry
    for k in ("enc_gnorm_1", "enc_gnorm_2", "dec_gnorm_1"):
        assert scaled[k] == pytest.approx(plain[k], rel=1e-4)
    enc, dec, _, _ = direct_gradients(model, crit, [s])
    assert plain["enc_gnorm_1"] == pytest.approx(enc[0], rel=1e-4)


def test_diagnostics_only_on_due_updates_and_nothing_when_off():
    model = build_model(extra=["--encoder-layers", 2, "--decoder-layers", 1, *tiny_model_flags()], seed=5)
    task = make_task(model, log_grad_norms_every=3)
    crit = make_criterion(task)
    s = make_sample(model, 6)
    assert "diag_update" in run_update(task, model, crit, [s], update_num=0)  # update 1
    assert not any(k.startswith(("diag", "enc_gnorm")) for k in run_update(task, model, crit, [s], update_num=1))
    assert run_update(task, model, crit, [s], update_num=2)["diag_update"] == 3
    off = make_task(model)
    assert not off.diagnostics_on
    logged = run_update(off, model, crit, [s], update_num=0)
    assert not any(k.startswith(("diag", "enc_", "dec_", "grad_", "mix_", "gate_")) for k in logged)


def test_lines_without_diagnostics_carry_no_stale_values():
    """After fairseq prints and resets train_inner, an update without diagnostics removes our keys."""
    model = build_model(extra=["--encoder-layers", 2, "--decoder-layers", 1, *tiny_model_flags()], seed=5)
    task = make_task(model, log_grad_norms_every=5)
    crit = make_criterion(task)
    s = make_sample(model, 6)
    with metrics.aggregate(new_root=True) as agg:
        model.zero_grad(set_to_none=True)
        task.train_step(s, model, crit, Optimizer(), 0)
        assert "enc_gnorm_1" in agg.get_smoothed_values()
        agg.reset()  # what fairseq does after printing a line
        model.zero_grad(set_to_none=True)
        task.train_step(s, model, crit, Optimizer(), 1)
        values = agg.get_smoothed_values()
        assert not any(k.startswith(("diag", "enc_gnorm", "dec_gnorm")) for k in values)
        assert all(k in [t[2] for t in agg.priorities] for k in agg)  # the aggregator stays consistent
        model.zero_grad(set_to_none=True)
        task.train_step(s, model, crit, Optimizer(), 4)
        assert agg.get_smoothed_values()["diag_update"] == 5


def test_mixing_weights_logged_equal_the_models():
    model = build_model(extra=["--encoder-layers", 3, "--decoder-layers", 2, "--deep-memory", "transparent",
                               "--transparent-dropout", "0.5", *tiny_model_flags()], seed=6)
    with torch.no_grad():
        model.encoder.memory.layer_mix.weight.normal_(0, 1)
    task = make_task(model, log_diagnostics_every=2, log_mixing_weights=True)
    crit = make_criterion(task)
    logged = run_update(task, model, crit, [make_sample(model, 7)], update_num=1)
    expected = torch.softmax(model.encoder.memory.layer_mix.weight.detach(), dim=0)  # eval: no dropout on W
    assert model.encoder.memory.layer_mix.training  # left in training mode
    for i in range(4):
        for j in range(2):
            assert logged[f"mix_{i}_{j + 1}"] == pytest.approx(float(expected[i, j]), rel=1e-5)
    assert not any(k.startswith("enc_gnorm") for k in logged)  # grad norms were not asked for


def test_gate_stats_equal_the_gates_of_the_forward_pass():
    model = build_model(extra=["--encoder-layers", 4, "--decoder-layers", 2, "--deep-memory", "msc",
                               *tiny_model_flags(), *NO_DROPOUT], seed=7)
    from deepnmt_fairseq.tasks.deep_translation import gated_fusions

    fusions = gated_fusions(model)
    assert sorted(fusions) == ["gate_dec_1", "gate_dec_2"] + [f"gate_enc_{i}" for i in range(1, 5)]
    seen = {}

    def hook(key):
        def fn(module, inputs, _out):  # recompute g from the fusion's inputs (Eq. 12-13)
            seen[key] = float(module.gate(*inputs).detach().mean())
        return fn

    handles = [f.register_forward_hook(hook(k)) for k, f in fusions.items()]
    task = make_task(model, log_diagnostics_every=1, log_gate_stats=True)
    logged = run_update(task, model, make_criterion(task), [make_sample(model, 8)], update_num=0)
    for h in handles:
        h.remove()
    assert set(seen) == set(fusions)
    for k, v in seen.items():
        assert logged[k] == pytest.approx(v, rel=1e-5)
        assert 0 < logged[k] < 1
    assert not any(f.record_gate for f in fusions.values())


def _direct_changes(model, ref_params, probe, ref_outputs):
    """||W - W_0||/||W_0|| per layer and ||h_i - h_i^0||/||h_i^0|| over non-pad positions, computed here
    from the encoder's own return_all_hiddens in eval mode (not the task's hooks)."""
    def vec(layer):
        return torch.cat([p.detach().reshape(-1) for p in layer.parameters()])

    dw = {}
    for side, key in (("encoder", "enc"), ("decoder", "dec")):
        for i, (layer, w0) in enumerate(zip(getattr(model, side).layers, ref_params[side])):
            dw[f"{key}_dW_{i + 1}"] = float((vec(layer) - w0).norm() / w0.norm())
    outs = _hiddens(model, probe)
    df = {f"enc_dF_{i + 1}": float((h - h0).norm() / h0.norm()) for i, (h, h0) in enumerate(zip(outs, ref_outputs))}
    return dw, df


def _hiddens(model, probe):
    was = model.training
    model.eval()
    with torch.no_grad():
        ni = probe["net_input"]
        states = model.encoder(ni["src_tokens"], src_lengths=ni["src_lengths"], return_all_hiddens=True)
        keep = ni["src_tokens"].ne(model.encoder.dictionary.pad()).t().unsqueeze(-1).float()
        outs = [h * keep for h in states["encoder_states"][1:]]
    model.train(was)
    return outs


def test_change_norms_equal_a_direct_computation_after_real_optimizer_steps():
    """--log-change-norms (DeepNet Sec. 3, Admin Sec. 4): the reference is taken on the first diagnostic
    update, the probe batch stays fixed, and the logged changes after optimizer steps equal ||W - W_0|| /
    ||W_0|| and the encoder layers' output change on the probe, computed independently; no random number
    is drawn by the probe (training under the flag equals training without it)."""
    extra = ["--encoder-layers", 3, "--decoder-layers", 2, *tiny_model_flags()]
    samples = [make_sample(build_model(extra=extra, seed=9), 20 + k, bsz=2 + k % 2) for k in range(4)]
    assert samples[0]["net_input"]["src_tokens"].eq(1).any()  # a left-padded probe sentence: masking matters

    def train(flags, n=4):
        model = build_model(extra=extra, seed=9)  # dropout on: the probe must not consume its random numbers
        task = make_task(model, **flags)
        crit = make_criterion(task)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        ref_params = {side: [torch.cat([p.detach().reshape(-1) for p in l.parameters()]).clone()
                             for l in getattr(model, side).layers] for side in ("encoder", "decoder")}
        ref_outputs = _hiddens(model, samples[0])
        logs = []
        torch.manual_seed(3)
        for u in range(n):
            logs.append(run_update(task, model, crit, [samples[u]], update_num=u))
            opt.step()
        return model, logs, ref_params, ref_outputs

    model, logs, ref_params, ref_outputs = train({"log_diagnostics_every": 2, "log_change_norms": True})
    assert logs[0]["delta_ref"] == 0 and logs[0]["delta_update"] == 0
    assert all(logs[0][f"enc_dW_{i}"] == 0 and logs[0][f"enc_dF_{i}"] == 0 for i in (1, 2, 3))
    assert not any(k.startswith("enc_dW") for k in logs[2])  # update 3 is not due (every 2: 1, 2, 4)
    # the values logged at update 4 (after 3 steps) against a direct computation after 3 steps
    replay, _, _, _ = train({}, n=3)  # the model after 3 steps, trained again without the flag
    dw, df = _direct_changes(replay, ref_params, samples[0], ref_outputs)
    assert logs[3]["delta_update"] == 3
    for k, v in {**dw, **df}.items():
        assert v > 1e-4, k  # the steps moved every layer
        assert logs[3][k] == pytest.approx(v, rel=1e-4), k
    assert set(k for k in logs[3] if k.startswith("dec_dW_")) == {"dec_dW_1", "dec_dW_2"}
    assert model.training and all(m.training for m in model.modules())  # train mode restored
    # the flag changes nothing in training itself (same parameters after the same updates)
    plain, _, _, _ = train({})
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.equal(a, b)


def test_diagnostics_that_do_not_apply_fail_clearly():
    top = build_model(extra=["--encoder-layers", 2, "--decoder-layers", 1, *tiny_model_flags()])
    with pytest.raises(ValueError, match=r"--log-mixing-weights.*--deep-memory top"):
        make_task(top, log_grad_norms_every=1, log_mixing_weights=True).check_diagnostics(top)
    with pytest.raises(ValueError, match=r"--log-gate-stats.*--deep-memory top"):
        make_task(top, log_grad_norms_every=1, log_gate_stats=True).check_diagnostics(top)
    add = build_model(extra=["--encoder-layers", 2, "--decoder-layers", 1, "--deep-memory", "msc", "--msc-fusion",
                             "add", *tiny_model_flags()])
    with pytest.raises(ValueError, match=r"--msc-fusion add"):
        make_task(add, log_grad_norms_every=1, log_gate_stats=True).check_diagnostics(add)
    with pytest.raises(ValueError, match=r"--log-grad-ratio needs an interval"):
        make_task(top, log_grad_ratio=True)
    with pytest.raises(ValueError, match=r">= 0"):
        make_task(top, log_grad_norms_every=-1)
    with pytest.raises(ValueError, match=r"--log-change-norms needs an interval"):
        make_task(top, log_change_norms=True)


# ------------------------------------------------------------------ fairseq-free helpers
def test_difficulty_split_is_four_equal_parts_ordered_by_score():
    import random

    from deepnmt_fairseq.analysis.difficulty import difficulty_scores, split_by_score

    rng = random.Random(0)
    for n in (4, 10, 13, 103):
        nll = [[rng.uniform(0, 50) for _ in range(n)] for _ in range(3)]
        stats = difficulty_scores(nll)
        for i in (0, n - 1):
            vals = [row[i] for row in nll]
            mean = sum(vals) / 3
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 3)
            assert stats[i]["score"] == pytest.approx(mean + std)
        scores = [s["score"] for s in stats]
        parts = split_by_score(scores)
        sizes = [len(p) for p in parts]
        assert len(parts) == 4 and max(sizes) - min(sizes) <= 1
        assert sorted(i for p in parts for i in p) == list(range(n))
        for a, b in zip(parts, parts[1:]):
            assert max(scores[i] for i in a) <= min(scores[i] for i in b)
    with pytest.raises(ValueError):
        split_by_score([1.0, 2.0, 3.0])


def test_log_parsing_reads_fairseq_json_lines(tmp_path):
    from deepnmt_fairseq.analysis.logs import diagnostics, parse_json_lines

    lines = [
        "2026-01-01 00:00:00 | INFO | fairseq_cli.train | not json",
        '2026-01-01 00:00:01 | INFO | train_inner | {"epoch": 1, "num_updates": "2", "diag_update": "1", '
        '"enc_gnorm_1": "0.5", "enc_gnorm_10": "0.25", "enc_gnorm_2": "0.125"}',
        '2026-01-01 00:00:02 | INFO | train_inner | {"epoch": 1, "num_updates": "4", "loss": "3.2"}',
        '{"epoch": 1, "num_updates": "6", "diag_update": "6", "enc_gnorm_1": "0.75", "enc_gnorm_2": null}',
        '2026-01-01 00:00:03 | INFO | train | {"epoch": 1, "train_enc_gnorm_1": "9"}',
        '2026-01-01 00:00:04 | INFO | valid | {"epoch": 1, "valid_loss": "3.0"}',
    ]
    recs = parse_json_lines(lines)
    assert [r["tag"] for r in recs] == ["train_inner", "train_inner", "train_inner", "train", "valid"]
    xs, vals = diagnostics(recs, r"enc_gnorm_\d+")
    assert xs == [1.0, 6.0]  # diag_update, not the printing update
    assert list(vals) == ["enc_gnorm_1", "enc_gnorm_2", "enc_gnorm_10"]  # natural order
    assert vals["enc_gnorm_1"] == [0.5, 0.75]
    assert vals["enc_gnorm_10"][0] == 0.25 and math.isnan(vals["enc_gnorm_10"][1])


def test_a_series_of_the_logged_intervals_keeps_the_last_value_of_an_update_logged_twice():
    """The evidence study's training curves (study/run.py): train loss by update
    from the train_inner lines only; a resumed run logs some updates again, the last one counts."""
    from deepnmt_fairseq.analysis.logs import parse_json_lines, series

    lines = [
        '2026-01-01 00:00:01 | INFO | train_inner | {"epoch": 1, "loss": "9.5", "num_updates": "10"}',
        '2026-01-01 00:00:02 | INFO | train_inner | {"epoch": 1, "loss": "8.25", "num_updates": "20"}',
        '2026-01-01 00:00:03 | INFO | train | {"epoch": 1, "train_loss": "8.0", "train_num_updates": "20"}',
        '2026-01-01 00:00:04 | INFO | valid | {"epoch": 1, "valid_loss": "7.0", "valid_num_updates": "20"}',
        '2026-01-01 00:00:05 | INFO | train_inner | {"epoch": 1, "loss": "8.5", "num_updates": "20"}',  # resumed
        '2026-01-01 00:00:06 | INFO | train_inner | {"epoch": 1, "gnorm": "1.5", "num_updates": "25"}',
        '2026-01-01 00:00:07 | INFO | train_inner | {"epoch": 1, "loss": "7.75", "num_updates": "30"}',
    ]
    assert series(parse_json_lines(lines), "loss") == [(10, 9.5), (20, 8.5), (30, 7.75)]
    assert series(parse_json_lines(lines), "gnorm") == [(25, 1.5)]
    assert series(parse_json_lines(lines), "valid_loss", tag="valid") == []  # no num_updates key there
    assert series(parse_json_lines(lines), "valid_loss", tag="valid", updates="valid_num_updates") == [(20, 7.0)]


def test_hypotheses_from_generate_output_and_results_files(tmp_path):
    from deepnmt_fairseq.analysis.difficulty import read_hypotheses
    from deepnmt_fairseq.analysis.results import load_results

    gen = tmp_path / "gen.txt"
    gen.write_text("S-1\tb\nH-1\t-0.1\tB b\nD-1\t-0.1\tB B\nH-0\t-0.2\tA\nT-0\tx\n")
    hyps = read_hypotheses(str(gen), 2)
    assert hyps == ["A", "B B"]  # D- preferred where present, else H-
    with pytest.raises(ValueError, match="lacks 1 of 3"):
        read_hypotheses(str(gen), 3)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(json.dumps(
        [{"experiment": "msc_36l", "sacrebleu": 20, "params": 5, "encoder_layers": 36, "decoder_layers": 6}]))
    res = load_results([str(tmp_path / "r")])
    assert res[0]["bleu_value"] == 20 and res[0]["series_name"] == "msc_Nl" and res[0]["total_layers"] == 42
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"experiment": "x", "params": 1}))
    with pytest.raises(ValueError, match="missing encoder_layers, decoder_layers, bleu or sacrebleu"):
        load_results([str(bad)])


def test_every_command_has_help():
    from deepnmt_cli import attention, difficulty, plot

    for mod, subs in ((plot, ["grad-norms", "grad-ratio", "mixing", "gates", "degradation", "depth"]),
                      (difficulty, ["split", "evaluate"]), (attention, [None])):
        for sub in subs:
            with pytest.raises(SystemExit) as e:
                mod.main(([sub] if sub else []) + ["--help"])
            assert e.value.code == 0


# ------------------------------------------------------------------ end to end (slow)
DIAG = ["--task", "deep_translation", "--log-format", "json", "--log-grad-norms-every", "1", "--log-grad-ratio",
        "--save-interval-updates", "1", "--keep-interval-updates", "-1", "--update-freq", "2"]


def _train_logged(data_bin, save_dir, extra):
    res = train(data_bin, save_dir, "deepnmt_transformer",
                [*tiny_model_flags(), "--encoder-layers", "4", "--decoder-layers", "2", *DIAG, *extra], max_update=4)
    log = save_dir / "train.log"
    log.write_text(res.stdout + res.stderr)
    return log


def _json_lines(log):
    out = []
    for line in log.read_text().splitlines():
        if "| train_inner | {" in line:
            out.append(json.loads(line.split("| train_inner | ", 1)[1]))
    return out


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    """Two tiny runs (4+2 layers, 4 updates of 2 micro-batches): transparent and MSC."""
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path_factory.mktemp("analysis")

    def transparent():
        log = _train_logged(data_bin, root / "transparent",
                            ["--deep-memory", "transparent", "--transparent-dropout", "0.3", "--log-mixing-weights"])
        gen = run_cli("fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", log.parent / "checkpoint_last.pt",
                      "--gen-subset", "test", "--beam", "2", "--batch-size", "4", "--cpu",
                      "--required-batch-size-multiple", "1", "--max-len-b", "20")
        (root / "gen.txt").write_text(gen.stdout)
        return log

    with ThreadPoolExecutor(2) as pool:  # the fairseq processes of the two runs go side by side
        tr = pool.submit(transparent)
        msc = pool.submit(_train_logged, data_bin, root / "msc", ["--deep-memory", "msc", "--log-gate-stats"])
        return {"transparent": tr.result(), "msc": msc.result(), "gen": root / "gen.txt"}


@pytest.mark.slow
def test_training_logs_carry_the_diagnostics(runs):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    lines = _json_lines(runs["transparent"])
    assert [int(l["diag_update"]) for l in lines] == [1, 2, 3, 4]
    for l in lines:
        assert int(l["diag_update"]) == int(l["num_updates"])
        assert all(float(l[f"enc_gnorm_{i}"]) > 0 for i in range(1, 5))
        assert all(float(l[f"dec_gnorm_{j}"]) > 0 for j in (1, 2))
        assert float(l["grad_ratio"]) == pytest.approx(float(l["grad_norm_h1"]) / float(l["grad_norm_hN"]), rel=1e-4)
    # the mixing weights logged at update u are softmax(W) of the model after u - 1 updates
    # (fairseq writes checkpoint_E_U.pt after updates 1 and 3; 2 and 4 end an epoch)
    ckpt_dir = runs["transparent"].parent
    compared = 0
    for l in lines[1:]:
        u = int(l["diag_update"])
        found = list(ckpt_dir.glob(f"checkpoint_*_{u - 1}.pt"))
        if not found:
            continue
        compared += 1
        path = found[0]
        s = torch.softmax(load_checkpoint(str(path))["model"][WEIGHT_KEY].float(), 0)
        for i in range(5):
            for j in range(2):
                assert float(l[f"mix_{i}_{j + 1}"]) == pytest.approx(float(s[i, j]), rel=1e-4, abs=1e-6)
    assert compared == 2
    gates = _json_lines(runs["msc"])[-1]
    assert all(0 < float(gates[k]) < 1 for k in ("gate_enc_1", "gate_enc_4", "gate_dec_1", "gate_dec_2"))


def _updates_of(path):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    return int(load_checkpoint(path)["optimizer_history"][-1]["num_updates"])


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_plot_commands_write_png_and_the_logged_numbers(runs, tmp_path):
    from deepnmt_cli import plot

    tr, msc = str(runs["transparent"]), str(runs["msc"])
    lines = _json_lines(runs["transparent"])
    out = tmp_path / "plots"
    assert plot.main(["grad-norms", tr, "--out", str(out)]) == 0
    rows = _csv(out / "grad_norms.csv")
    assert [float(r["update"]) for r in rows] == [1, 2, 3, 4]
    assert float(rows[2]["enc_gnorm_3"]) == float(lines[2]["enc_gnorm_3"])
    assert plot.main(["grad-norms", tr, "--out", str(out)]) == 2  # never overwrites silently
    assert plot.main(["grad-ratio", tr, msc, "--labels", "T", "M", "--out", str(out)]) == 0
    rows = _csv(out / "grad_ratio.csv")
    assert {r["run"] for r in rows} == {"T", "M"} and len(rows) == 8
    assert float(rows[3]["r_t"]) == float(lines[3]["grad_ratio"])
    assert plot.main(["mixing", tr, "--decoder-layer", "1", "--out", str(out)]) == 0
    rows = _csv(out / "mixing.csv")
    last = [r for r in rows if float(r["update"]) == 4 and r["j"] == "1"]
    assert len(last) == 5 and sum(float(r["s"]) for r in last) == pytest.approx(1, abs=1e-4)
    ckpt = runs["transparent"].parent / "checkpoint_last.pt"
    assert plot.main(["mixing", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    s = torch.softmax(load_checkpoint(str(ckpt))["model"][WEIGHT_KEY].float(), 0)
    for r in _csv(out / "mixing_checkpoint.csv"):
        assert float(r["s"]) == pytest.approx(float(s[int(r["i"]), int(r["j"]) - 1]), rel=1e-6)
    assert plot.main(["gates", msc, "--out", str(out)]) == 0
    # a diagnostic that was not logged fails clearly
    assert plot.main(["mixing", msc, "--out", str(tmp_path / "x")]) == 2
    assert plot.main(["gates", tr, "--out", str(tmp_path / "x")]) == 2
    for name in ("grad_norms", "grad_ratio", "mixing_final", "mixing_evolution_j1", "mixing_checkpoint", "gates"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    # BLEU / parameters vs depth from results files and the plugin's architectures
    res = tmp_path / "res"
    res.mkdir()
    (res / "results.json").write_text(json.dumps([
        {"experiment": f"msc_{n}l", "bleu": 20 + n / 10, "params": n * 1e6, "encoder_layers": n, "decoder_layers": 6}
        for n in (6, 12)]))
    assert plot.main(["depth", "--results", str(res), "--arch", "deepnmt_transformer", "--vocab", "64",
                      "--out", str(out)]) == 0
    rows = _csv(out / "depth.csv")
    assert [r["experiment"] for r in rows] == ["msc_6l", "msc_12l", "deepnmt_transformer"]
    from deepnmt_fairseq.analysis.param_counts import build_model as build_arch, count_parameters

    assert float(rows[2]["params"]) == count_parameters(build_arch("deepnmt_transformer", 64))


@pytest.mark.slow
def test_difficulty_split_and_evaluation(runs, data_bin, tmp_path):
    from fairseq.data import data_utils

    from deepnmt_fairseq.analysis.difficulty import corpus_bleu
    from deepnmt_fairseq.analysis.models import load_model, load_split
    from deepnmt_cli import difficulty

    ckdir = runs["transparent"].parent
    split = tmp_path / "split"
    assert difficulty.main(["split", str(data_bin), "--checkpoint-dir", str(ckdir), "--last", "2",
                            "--out", str(split), "--cpu"]) == 0
    info = json.loads((split / "split.json").read_text())
    assert [_updates_of(p) for p in info["checkpoints"]] == [1, 3]  # the newest K = 2 checkpoint_E_U.pt
    with open(split / "scores.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    n = len(rows)
    assert n == 10
    sizes = [len(info["parts"][p]) for p in ("simple", "ordinary", "difficult", "challenging")]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n
    score = {int(r["id"]): float(r["score"]) for r in rows}
    parts = [info["parts"][p] for p in ("simple", "ordinary", "difficult", "challenging")]
    for a, b in zip(parts, parts[1:]):
        assert max(score[i] for i in a) <= min(score[i] for i in b)
    for r in rows:  # Eq. 14-15 from the per-checkpoint columns
        nll = [float(r[f"nll_ckpt{k}"]) for k in (1, 2)]
        mean = sum(nll) / 2
        assert float(r["score"]) == pytest.approx(mean + math.sqrt(sum((v - mean) ** 2 for v in nll) / 2), abs=2e-6)
        assert float(r["std_nll"]) > 0
    # the NLL of a checkpoint equals fairseq's own reference scorer (sum of positional log-probs)
    model, task, _ = load_model(info["checkpoints"][0], str(data_bin))
    ds = load_split(task, "test")
    scorer = task.build_generator([model], type("A", (), {"score_reference": True})())
    sample = ds.collater([ds[i] for i in range(n)])
    for sid, hypos in zip(sample["id"].tolist(), task.inference_step(scorer, [model], sample)):
        assert float(rows[sid]["nll_ckpt1"]) == pytest.approx(-float(hypos[0]["positional_scores"].sum()), rel=1e-4)
    # text and binarized parts
    refs = (split / "references.txt").read_text().splitlines()
    assert len(refs) == n
    for name, ids in info["parts"].items():
        assert (split / f"{name}.tgt").read_text().splitlines() == [refs[i] for i in ids]
        assert [int(x) for x in (split / f"{name}.ids").read_text().split()] == ids
        binned = data_utils.load_indexed_dataset(str(split / "bin" / f"{name}.src-tgt.tgt"), task.tgt_dict)
        assert [task.tgt_dict.string(binned[k]) for k in range(len(binned))] == [refs[i] for i in ids]
    assert (split / "scores.png").stat().st_size > 5000

    # evaluate: a fairseq-generate output and a perfect system against the generate baseline
    gen = runs["gen"]
    out = tmp_path / "eval"
    assert difficulty.main(["evaluate", "--split", str(split), "--system", f"base={gen}",
                            "--system", f"oracle={split / 'references.txt'}", "--baseline", "base",
                            "--out", str(out)]) == 0
    res = json.loads((out / "bleu.json").read_text())
    from deepnmt_fairseq.analysis.difficulty import read_hypotheses

    hyps = read_hypotheses(str(gen), n)
    for name, ids in info["parts"].items():
        base = corpus_bleu([hyps[i] for i in ids], [refs[i] for i in ids])
        assert res["bleu"]["base"][name] == pytest.approx(base)
        assert res["bleu"]["oracle"][name] == pytest.approx(100.0)
        assert res["gain"]["oracle"][name] == pytest.approx(100.0 - base)
    assert (out / "difficulty_bleu.png").stat().st_size > 5000
    assert difficulty.main(["evaluate", "--split", str(split), "--system", f"a={split / 'references.txt'}",
                            "--baseline", "zzz", "--out", str(tmp_path / "e2")]) == 2


@pytest.mark.slow
def test_attention_and_degradation(runs, data_bin, tmp_path, capsys):
    from deepnmt_cli import attention, plot

    msc_ckpt = runs["msc"].parent / "checkpoint_last.pt"
    tr_ckpt = runs["transparent"].parent / "checkpoint_last.pt"
    out = tmp_path / "att"
    sentence = "the big cat sees a dog"
    assert attention.main(["--path", str(msc_ckpt), "--data", str(data_bin), "--sentence", sentence,
                           "--beam", "2", "--out", str(out), "--cpu"]) == 0
    maps = json.loads((out / "attention.json").read_text())
    assert maps["source_tokens"] == sentence.split() + ["</s>"]
    assert maps["layer"] == 2 and maps["deep_memory"] == "msc"
    for kind in ("cross", "context"):
        m = maps[kind]
        assert len(m) == len(maps["target_tokens"]) and all(len(r) == len(maps["source_tokens"]) for r in m)
        assert all(sum(r) == pytest.approx(1, abs=1e-4) for r in m)
    assert maps["cross"] != maps["context"]
    # forced decoding, another layer, a transparent model; and the context map is refused for it
    assert attention.main(["--path", str(tr_ckpt), "--data", str(data_bin), "--sentence", sentence, "--target",
                           "DOG A SEES", "--layer", "1", "--out", str(out), "--prefix", "tr", "--cpu"]) == 0
    tr_maps = json.loads((out / "tr.json").read_text())
    assert tr_maps["target_tokens"] == ["DOG", "A", "SEES", "</s>"] and "context" not in tr_maps
    capsys.readouterr()
    assert attention.main(["--path", str(tr_ckpt), "--data", str(data_bin), "--sentence", sentence,
                           "--attention", "context", "--out", str(tmp_path / "no"), "--cpu"]) == 2
    assert "--deep-memory transparent" in capsys.readouterr().err

    deg = tmp_path / "deg"
    assert plot.main(["degradation", "--data", str(data_bin), "--model", f"transparent={tr_ckpt}",
                      "--model", f"msc={msc_ckpt}", "--train-sample", "16", "--beam", "1", "--out", str(deg),
                      "--cpu"]) == 0
    info = json.loads((deg / "degradation.json").read_text())
    assert len(info["train_sample_ids"]) == 16 and len(set(info["train_sample_ids"])) == 16
    assert [(m["family"], m["depth"]) for m in info["models"]] == [("transparent", 4), ("msc", 4)]
    assert all(0 <= m[k] <= 100 for m in info["models"] for k in ("train_bleu", "valid_bleu"))
    assert (deg / "degradation.png").stat().st_size > 5000


@pytest.mark.slow
def test_tensorboard_logs_are_read_when_available(data_bin, tmp_path):
    pytest.importorskip("tensorboard")
    from deepnmt_fairseq.analysis.logs import diagnostics, read_run
    from deepnmt_cli import plot

    tb = tmp_path / "tb"
    train(data_bin, tmp_path / "ck", "deepnmt_transformer",
          [*tiny_model_flags(), "--encoder-layers", "2", "--decoder-layers", "1", "--task", "deep_translation",
           "--log-grad-norms-every", "1", "--log-grad-ratio", "--tensorboard-logdir", tb, "--no-save"], max_update=3)
    xs, vals = diagnostics(read_run(str(tb)), r"enc_gnorm_\d+")
    assert xs == [1, 2, 3] and set(vals) == {"enc_gnorm_1", "enc_gnorm_2"}
    assert plot.main(["grad-ratio", str(tb), "--out", str(tmp_path / "p")]) == 0
