"""Exactness: incremental decoding, batch invariance, exact resume, student round trips.

* Incremental decoding equals the full forward pass (<= 1e-5, float32) for every model
  combination of the configuration matrix (tests/test_matrix.py) plus the extra mixes
  below; tests/test_deep_transformer.py covers the basic ones.
* Beam search gives a sentence the same hypothesis and score alone and inside a batch of
  other lengths (left padding), in float64 (so that a tie cannot be decided by rounding).
* Training N updates in one go and N/2 + resume from checkpoint_last.pt give the same
  per-update losses and bitwise-identical weights (CPU, one thread, same seed): fairseq
  re-seeds torch's RNG with --seed + num_updates before every update (Trainer._set_seed),
  restores the data iterator's position, Adam's moments and the LR schedule, and every
  stochastic choice of the plugin (SSL, GP, CAD, LayerDrop, ALD's UNK positions, dropout)
  draws from torch's RNG.
* An extracted student decodes identically before and after a save/load round trip
  through fairseq's own checkpoint loader (weights-only).
"""

from __future__ import annotations

import copy
import json
import re
from types import SimpleNamespace

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_helpers import USER_DIR, build_model, incremental_decode, random_batch, run_cli, TINY_DROPOUT as TINY


# every feature alone, plus mixes the configuration matrix (tests/test_matrix.py) does not train
EXTRA = {
    "prenorm": ["--encoder-layers", "3", "--decoder-layers", "2"],
    "postnorm": ["--post-norm", "--encoder-layers", "3", "--decoder-layers", "2"],
    "msc-gate": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2"],
    "msc-add": ["--deep-memory", "msc", "--msc-block-layers", "1,2", "--decoder-layers", "2", "--msc-fusion", "add"],
    "msc-ffn-cell": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                     "--msc-context-cell", "ffn"],
    "msc-no-ctx": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                   "--msc-context-cell", "none"],
    "msc-no-encoder-context": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                               "--msc-no-encoder-context"],
    "transparent": ["--deep-memory", "transparent", "--encoder-layers", "3", "--decoder-layers", "2"],
    "cad-half": ["--encoder-layers", "2", "--decoder-layers", "3", "--cad-drop-depth", "2", "--cad-drop-ratio", "0.5"],
    "cad-literal-full-depth": ["--encoder-layers", "2", "--decoder-layers", "3", "--cad-drop-depth", "3",
                               "--cad-drop-ratio", "0.25", "--cad-reading", "literal"],
    "ssl-sublayer": ["--encoder-layers", "4", "--decoder-layers", "2", "--ssl-rate", "0.4", "--ssl-decoder"],
    "ssl-layer": ["--encoder-layers", "3", "--decoder-layers", "3", "--ssl-rate", "0.5", "--ssl-mode", "layer",
                  "--ssl-decoder"],
    "ssl-stage-one": ["--encoder-layers", "2", "--decoder-layers", "2", "--ssl-rate", "0.4", "--ssl-start-update",
                      "100"],
    "gp": ["--encoder-layers", "4", "--decoder-layers", "2", "--gp-group-size", "2", "--gp-decoder-group-size", "2"],
    "rpr": ["--encoder-layers", "2", "--decoder-layers", "2", "--rpr-max-relative-position", "2"],
    "layerdrop": ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-layerdrop", "0.3",
                  "--decoder-layerdrop", "0.3"],
    "rpr-values-postnorm": ["--encoder-layers", "2", "--decoder-layers", "2", "--rpr-max-relative-position", "2",
                            "--rpr-values", "--post-norm"],
    "rpr-transparent": ["--deep-memory", "transparent", "--encoder-layers", "3", "--decoder-layers", "2",
                        "--rpr-max-relative-position", "3"],
    "msc-ffn-rpr": ["--deep-memory", "msc", "--msc-block-layers", "1,2", "--decoder-layers", "2",
                    "--msc-context-cell", "ffn", "--rpr-max-relative-position", "2"],
    "msc-no-enc-ctx-rpr-values": ["--deep-memory", "msc", "--msc-block-layers", "1,2", "--decoder-layers", "2",
                                  "--msc-no-encoder-context", "--rpr-max-relative-position", "2", "--rpr-values"],
    "msc-add-no-enc-ctx-cad": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "3",
                               "--msc-fusion", "add", "--msc-no-encoder-context", "--cad-drop-depth", "2",
                               "--cad-drop-ratio", "0.5"],
    "msc-no-ctx-layerdrop": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                             "--msc-context-cell", "none", "--encoder-layerdrop", "0.3", "--decoder-layerdrop", "0.3"],
    "transparent-ssl-gp": ["--deep-memory", "transparent", "--encoder-layers", "4", "--decoder-layers", "2",
                           "--ssl-rate", "0.4", "--ssl-decoder", "--gp-group-size", "2",
                           "--gp-decoder-group-size", "2"],
    "cad-full-rpr": ["--encoder-layers", "2", "--decoder-layers", "3", "--cad-drop-depth", "3",
                     "--cad-drop-ratio", "1.0", "--rpr-max-relative-position", "2"],
    "desdar-like": ["--encoder-layers", "6", "--decoder-layers", "1", "--rpr-max-relative-position", "2"],
    "dlcl": ["--deep-memory", "dlcl", "--encoder-layers", "4", "--decoder-layers", "2"],
    "dlcl-gp-ssl-rpr-layerdrop": ["--deep-memory", "dlcl", "--encoder-layers", "4", "--decoder-layers", "2",
                                  "--gp-group-size", "2", "--ssl-rate", "0.4", "--rpr-max-relative-position", "2",
                                  "--encoder-layerdrop", "0.2"],
    "deepnorm": ["--deepnorm", "--encoder-layers", "3", "--decoder-layers", "2"],
    "admin": ["--admin", "--encoder-layers", "3", "--decoder-layers", "2"],
    "deepnorm-rpr-values-ssl-gp": ["--deepnorm", "--encoder-layers", "4", "--decoder-layers", "2",
                                   "--rpr-max-relative-position", "2", "--rpr-values", "--ssl-rate", "0.4",
                                   "--ssl-decoder", "--gp-group-size", "2"],
    "admin-msc-cad": ["--admin", "--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "3",
                      "--cad-drop-depth", "2", "--cad-drop-ratio", "0.5"],
    "admin-cad-full": ["--admin", "--encoder-layers", "2", "--decoder-layers", "3", "--cad-drop-depth", "2",
                       "--cad-drop-ratio", "1.0"],
    "checkpoint-activations-msc": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                                   "--checkpoint-activations"],
}


def _matrix_combos():
    from test_matrix import COMBOS

    out = {}
    for name, (arch, flags, _crit) in COMBOS.items():
        out[f"matrix:{name}"] = (arch, flags)
    for name, flags in EXTRA.items():
        out[name] = ("deepnmt_transformer", flags)
    return out


ALL = _matrix_combos()
# HIERTRANS on the dummy dictionary of build_model: w1 / w2 / w3 end sentences (random sources get several)
ALL["hiertrans-sentences"] = ("hiertrans", ["--encoder-layers", "2", "--document-layers", "2", "--decoder-layers",
                                            "2", "--sentence-end-symbols", "w1 w2 w3"])


def _model(name, seed=0):
    arch, flags = ALL[name]
    return build_model(arch, TINY + list(flags), seed=seed)


def _perturb_trained_state(model):
    """A trained model has non-trivial mixes and shortcut weights: perturb the ones a fresh
    model initialises to a constant (transparent mixes; Admin's omega, 1 before profiling)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "layer_mix" in n:
                p.normal_()
            elif "omega_delta" in n:
                p.normal_(0.0, 0.3)
        for n, b in model.named_buffers():
            if n.endswith("omega_init"):
                b.uniform_(1.0, 3.0)


# ---------------------------------------------------------------- incremental == full
@pytest.mark.parametrize("name", sorted(ALL))
def test_incremental_decoding_equals_full_forward(name):
    model = _model(name).eval()
    _perturb_trained_state(model)
    src, lens, tgt = random_batch(model, bsz=3, src_len=7, tgt_len=9)  # longer than RPR's clip
    with torch.no_grad():
        full, _ = model(src, lens, tgt)
        inc = incremental_decode(model, src, lens, tgt)
    assert (full - inc).abs().max().item() <= 1e-5


# ---------------------------------------------------------------- batch invariance

def padded_sources(d, lengths=(9, 5, 7, 3), seed=5):
    """A left-padded batch of random sources of ``lengths`` (as fairseq's translation task pads),
    each ending in EOS: ``(src_tokens, src_lengths)``; the beam batch-invariance check's input."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    src = torch.full((len(lengths), width), d.pad())
    for i, n in enumerate(lengths):
        src[i, width - n:] = torch.randint(d.nspecial, len(d), (n,), generator=g)
        src[i, -1] = d.eos()
    return src, torch.tensor(list(lengths))


def _beam(model, src, lens, beam=4):
    gen = SequenceGenerator([model], model.decoder.dictionary, beam_size=beam, max_len_b=10)
    with torch.no_grad():
        hyps = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lens}})
    return [(h[0]["tokens"].tolist(), float(h[0]["score"])) for h in hyps]


BATCH_INVARIANCE = ["dlcl", "dlcl-gp-ssl-rpr-layerdrop", "rpr", "rpr-transparent", "msc-gate", "msc-ffn-cell", "msc-no-ctx", "transparent", "cad-half",
                    "cad-full-rpr", "matrix:transparent-postnorm-cad-ddr", "ssl-sublayer", "gp",
                    "matrix:msc-gate-everything", "postnorm", "msc-add-no-enc-ctx-cad", "desdar-like",
                    "matrix:prenorm-rpr-layerdrop", "deepnorm", "admin-msc-cad", "deepnorm-rpr-values-ssl-gp",
                    "matrix:cad-literal-ddr", "cad-literal-full-depth", "matrix:hiertrans", "hiertrans-sentences"]


@pytest.mark.parametrize("name", BATCH_INVARIANCE)
def test_beam_search_alone_equals_in_padded_batch(name):
    model = _model(name, seed=3).eval().double()
    _perturb_trained_state(model)
    src, lens = padded_sources(model.encoder.dictionary)
    lengths = lens.tolist()
    batch = _beam(model, src, lens)
    for i, n in enumerate(lengths):
        (alone,) = _beam(model, src[i: i + 1, 9 - n:], lens[i: i + 1])
        assert alone[0] == batch[i][0], f"sentence {i}: {alone[0]} vs {batch[i][0]}"
        # fairseq's SequenceGenerator accumulates scores in float32 whatever the model's dtype,
        # so the float64 model's (equal to ~1e-15) log-probs may round to neighbouring floats
        assert abs(alone[1] - batch[i][1]) <= 8 * torch.finfo(torch.float32).eps * max(1.0, abs(batch[i][1]))


# ---------------------------------------------------------------- RNG contract of fairseq
def test_fairseq_reseeds_torch_rng_from_seed_plus_num_updates():
    """The contract exact resume relies on (fairseq.trainer.Trainer._set_seed, called at the
    start of every train_step)."""
    import inspect

    from fairseq.trainer import Trainer

    fake = SimpleNamespace(cfg=SimpleNamespace(common=SimpleNamespace(seed=11)), get_num_updates=lambda: 7)
    Trainer._set_seed(fake)
    assert torch.initial_seed() == 18
    a = torch.rand(3)
    Trainer._set_seed(fake)
    assert torch.equal(torch.rand(3), a)
    assert "self._set_seed()" in inspect.getsource(Trainer.train_step)


# ---------------------------------------------------------------- exact resume (CLI)
RESUME = {
    # MSC + RPR + SSL (sub-layers, decoder too; second stage from update 3, after the split) +
    # GP + CAD + LayerDrop, trained with DDR and ALD's UNK sampling: every stochastic choice
    "stochastic": (["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                    "--gp-group-size", "2", "--rpr-max-relative-position", "2", "--ssl-rate", "0.4",
                    "--ssl-decoder", "--ssl-start-update", "3", "--cad-drop-depth", "1", "--cad-drop-ratio", "0.5",
                    "--encoder-layerdrop", "0.2"],
                   ["--criterion", "collapse_reducing", "--ddr-alpha", "1.0", "--ald-alpha", "0.5"]),
    # Admin: profiled on the first batch of the first run only; the resumed run reads the profile
    # (omega_init buffers and the admin_profiled flag) from checkpoint_last.pt and must not redo it
    "admin-gp-ssl": (["--admin", "--encoder-layers", "4", "--decoder-layers", "2", "--gp-group-size", "2",
                      "--ssl-rate", "0.4"], ["--criterion", "label_smoothed_cross_entropy"]),
}
N_UPDATES, SPLIT = 5, 2  # 3 batches per epoch: the split is mid-epoch, the rest crosses into epoch 2


def _train(data_bin, save, flags, crit, max_update, seed=1, extra=()):
    return run_cli(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--task", "translation", "--arch", "deepnmt_transformer",
        *TINY, *flags, *crit, "--label-smoothing", "0.1", "--optimizer", "adam", "--lr", "0.002",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4", "--batch-size", "40", "--max-tokens", "4000",
        "--required-batch-size-multiple", "1", "--max-update", max_update, "--save-dir", save, "--seed", seed,
        "--no-progress-bar", "--log-format", "json", "--log-interval", "1", "--cpu", "--num-workers", "0",
        "--no-epoch-checkpoints", *extra,
    )


def _per_update(res):
    """{num_updates: logged stats} from json train_inner lines."""
    out = {}
    for m in re.findall(r"train_inner\W+(\{.*\})", res.stdout + res.stderr):
        d = json.loads(m)
        out[int(d["num_updates"])] = {k: v for k, v in d.items()
                                      if k.endswith("loss") or k in ("gnorm", "lr", "wpb", "bsz", "epoch")}
    return out


def _weights(path):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    state = load_checkpoint(str(path))
    return state["model"], state["optimizer_history"][-1]["num_updates"], state["last_optimizer_state"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RESUME))
def test_resume_gives_the_same_losses_and_weights(data_bin, tmp_path, name):
    flags, crit = RESUME[name]
    straight = _per_update(_train(data_bin, tmp_path / "straight", flags, crit, N_UPDATES))
    first_run = _train(data_bin, tmp_path / "split", flags, crit, SPLIT)
    first = _per_update(first_run)
    resumed = _train(data_bin, tmp_path / "split", flags, crit, N_UPDATES)
    if "--admin" in flags:  # profiled once, by the first run; the resumed run reads it from the checkpoint
        assert (first_run.stdout + first_run.stderr).count("Admin profile") == 1
        assert "Admin profile" not in resumed.stdout + resumed.stderr
    assert f"@ {SPLIT} updates)" in resumed.stdout + resumed.stderr  # "Loaded checkpoint ... (epoch 1 @ 2 updates)"
    second = _per_update(resumed)
    assert sorted(straight) == list(range(1, N_UPDATES + 1))
    assert sorted(first) == list(range(1, SPLIT + 1)) and sorted(second) == list(range(SPLIT + 1, N_UPDATES + 1))
    assert {**first, **second} == straight  # every logged loss term, gnorm, lr and batch size
    assert straight[SPLIT]["epoch"] == straight[SPLIT + 1]["epoch"] == 1 and straight[N_UPDATES]["epoch"] == 2
    if name == "stochastic":
        assert "ald_loss" in straight[1] and "ddr_loss" in straight[1]
    a, na, opt_a = _weights(tmp_path / "straight" / "checkpoint_last.pt")
    b, nb, opt_b = _weights(tmp_path / "split" / "checkpoint_last.pt")
    assert na == nb == N_UPDATES
    assert a.keys() == b.keys()
    for k in a:  # bitwise: same ops, same order, same RNG draws, one thread
        assert torch.equal(a[k], b[k]), k
    for k, v in opt_a["state"].items():
        for s in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(v[s], opt_b["state"][k][s]), (k, s)


def test_stochastic_features_draw_from_torch_rng():
    """Sensitivity of the resume test: with the resume test's 'stochastic' configuration the
    training loss depends on torch's seed (SSL, GP, CAD, LayerDrop, dropout, ALD's UNKs), and
    is reproduced exactly by the same seed."""
    from deepnmt_fairseq.criterions.collapse_reducing import CollapseReducingCriterion

    model = build_model("deepnmt_transformer", TINY + RESUME["stochastic"][0], seed=0).train()
    d = model.encoder.dictionary
    task = SimpleNamespace(source_dictionary=d, target_dictionary=d)
    crit = CollapseReducingCriterion(task, False, 0.1, ddr_alpha=1.0, ald_alpha=0.5)
    src, lens, tgt = random_batch(model, bsz=3, src_len=8, tgt_len=6)
    target = torch.cat([tgt[:, 1:], torch.full((3, 1), d.eos())], 1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lens, "prev_output_tokens": tgt},
              "target": target, "ntokens": int(target.ne(d.pad()).sum())}

    def loss(seed):
        torch.manual_seed(seed)
        return crit(model, sample)[0].item()

    assert loss(1) == loss(1)
    assert len({loss(s) for s in range(1, 6)}) == 5


# ---------------------------------------------------------------- extracted students
def _fairseq_checkpoint(data_bin, flags, path, seed=1):
    """A teacher checkpoint as fairseq-train writes it (config + weights), built in-process."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data_bin), "--user-dir", USER_DIR, "--task", "translation",
                                                "--arch", "deepnmt_transformer", *TINY, *flags])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    with torch.no_grad():  # a trained-looking model: no zero-initialised mixes, varied weights
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    state = {"args": None, "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
             "model": model.state_dict(), "extra_state": {},
             "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "Adam",
                                    "lr_scheduler_state": {"best": None}, "num_updates": 0}]}
    torch.save(state, path)
    return task


def _decode_split(task, model, split="test", beam=4):
    dataset = task.dataset(split)
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=12)
    out = {}
    for start in range(0, len(dataset), 4):
        sample = dataset.collater([dataset[i] for i in range(start, min(start + 4, len(dataset)))])
        with torch.no_grad():
            hyps = gen.generate([model], sample)
        for sid, h in zip(sample["id"].tolist(), hyps):
            out[sid] = (h[0]["tokens"].tolist(), float(h[0]["score"]))
    return out


STUDENTS = {
    "transparent-cad-rpr": (["--deep-memory", "transparent", "--encoder-layers", "4", "--decoder-layers", "4",
                             "--cad-drop-depth", "2", "--cad-drop-ratio", "0.5", "--rpr-max-relative-position", "2"],
                            2, 2),
    "msc-ssl": (["--deep-memory", "msc", "--msc-block-layers", "2,4", "--decoder-layers", "2", "--ssl-rate", "0.4"],
                2, 1),
    "deepnorm-gp": (["--deepnorm", "--encoder-layers", "4", "--decoder-layers", "2", "--gp-group-size", "2"], 2, 1),
    "admin-gp-ssl": (["--admin", "--encoder-layers", "4", "--decoder-layers", "2", "--gp-group-size", "2",
                      "--ssl-rate", "0.4"], 2, 2),
    "gp-desdar": (["--encoder-layers", "6", "--decoder-layers", "2", "--gp-group-size", "3",
                   "--gp-decoder-group-size", "2", "--rpr-max-relative-position", "2", "--rpr-values"], 3, 2),
}


@pytest.mark.parametrize("name", sorted(STUDENTS))
def test_extracted_student_decodes_identically_after_save_and_load(data_bin, tmp_path, name):
    from fairseq import checkpoint_utils

    from deepnmt_fairseq.checkpoint_safety import load_checkpoint
    from deepnmt_fairseq.checkpoint_averaging import save_atomic
    from deepnmt_fairseq.modules.student_extraction import extract

    flags, enc_h, dec_h = STUDENTS[name]
    task = _fairseq_checkpoint(data_bin, flags, tmp_path / "teacher.pt")
    task.load_dataset("test")
    # weight remapping only (not every teacher here is GP-trained with h; the refusal: test_gpkd_procedure.py)
    student_state = extract(load_checkpoint(str(tmp_path / "teacher.pt")), enc_h, dec_h, "random", seed=3,
                            allow_group_size_mismatch=True)
    # in memory: build from the student's config, load the extracted weights
    in_memory = task.build_model(copy.deepcopy(student_state["cfg"]["model"]))
    in_memory.load_state_dict(copy.deepcopy(student_state["model"]), strict=True)
    before = _decode_split(task, in_memory.eval())
    # round trip: written like the CLI writes it, read by fairseq's loader (weights-only)
    save_atomic(student_state, str(tmp_path / "student.pt"), False)
    (loaded,), _cfg = checkpoint_utils.load_model_ensemble([str(tmp_path / "student.pt")], task=task)
    after = _decode_split(task, loaded.eval())
    assert len(before) == len(task.dataset("test"))
    assert before == after  # tokens and scores, bitwise
    teacher_layers = load_checkpoint(str(tmp_path / "teacher.pt"))["cfg"]["model"].encoder_layers
    assert len(loaded.encoder.layers) == len(in_memory.encoder.layers) == teacher_layers // enc_h
    for (k, v), (k2, v2) in zip(in_memory.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    if "--deepnorm" in flags:  # alpha is recomputed for the student's own depths (docs/mechanisms.md)
        from deepnmt_fairseq.modules.residual_scaling import deepnorm_constants

        c = deepnorm_constants(len(loaded.encoder.layers), len(loaded.decoder.layers))
        assert loaded.encoder.layers[0].residual_weight.alpha == pytest.approx(c.encoder_alpha)
        assert loaded.decoder.layers[0].residual_weight.alpha == pytest.approx(c.decoder_alpha)
        assert c.encoder_alpha != pytest.approx(deepnorm_constants(teacher_layers, 2).encoder_alpha)
    if "--admin" in flags:  # the omegas (and whether they were profiled) come with the kept layers
        teacher_model = load_checkpoint(str(tmp_path / "teacher.pt"))["model"]
        assert "admin_profiled" in teacher_model
        assert bool(loaded.admin_profiled) == bool(teacher_model["admin_profiled"])
