"""The reproduction registry and scripts: deepnmt_fairseq.repro (deepnmt-repro), train.sh, evaluate.sh, configs/.

Fast tests: every experiment's commands parse with fairseq's own parser, the batch
arithmetic, the distributed flags, configs/ in sync with the registry and valid for
fairseq's config schema, and the BLEU helpers on hand-checkable examples.
Slow tests (``-m slow``): one tiny training + evaluation per family on the embedded
corpus, driven through train.sh / evaluate.sh, and fairseq-hydra-train on a generated config.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deepnmt_fairseq import scoring
from deepnmt_fairseq.repro import commands
from deepnmt_fairseq.repro import registry as experiments
from deepnmt_fairseq.repro.spec import DATASETS, ExtractStage, batch_plan, update_freq

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"

EXPS = experiments.EXPERIMENTS
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHON=sys.executable)


def _plan(name, gpus=8, **kw):
    exp = EXPS[name]
    paths = commands.Paths(Path("/data"), Path("/ckpt"))
    launch = commands.Launch(world_size=gpus, gpus_found=gpus)
    opts = commands.RunOptions(paths=paths, launch=launch, **kw)
    return commands.Planner(EXPS, exp, opts).plan()


def _flag(argv, flag):
    """Value of the last occurrence of ``flag`` (argparse semantics)."""
    idx = [i for i, a in enumerate(argv) if a == flag]
    return argv[idx[-1] + 1] if idx else None


# ------------------------------------------------------------------------------ registry
def test_registry_rows_and_experiments_are_consistent():
    names = set(EXPS)
    assert len(names) > 100
    referenced = {r.experiment for t in experiments.TABLES for r in t.rows if r.experiment}
    assert referenced <= names
    assert names <= referenced, f"experiments in no table: {sorted(names - referenced)}"
    keys = [t.key for t in experiments.TABLES]
    assert len(keys) == len(set(keys))
    # every table the task asks for is there
    for key in ("msc-t2", "msc-t3", "msc-t4", "msc-t5", "dd-t1-ende", "dd-t1-enfr", "dd-t2", "dd-t3", "dd-fig2",
                "dd-fig3", "dd-fig4", "bapna-t1", "bapna-t2", "gpkd-t1", "gpkd-t2", "gpkd-t3", "gpkd-t4", "gpkd-t5",
                "gpkd-t6"):
        assert key in keys
    for exp in EXPS.values():
        assert exp.dataset in DATASETS
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-A-Z]*", exp.name)
    # rows without a command say why
    for t in experiments.TABLES:
        for r in t.rows:
            if r.experiment is None:
                assert r.note, (t.key, r.label)
    # the brief's examples exist
    for name in ("msc-iwslt14-deen-72L", "msc-iwslt14-deen-72L-l2", "dd-wmt14-ende-base-27-27-cad-crt",
                 "gpkd-wmt14-ende-48L-teacher"):
        assert name in EXPS
    stage = EXPS["msc-iwslt14-deen-72L-l2"].stages[0]
    assert stage.criterion == "collapse_reducing"
    assert dict(zip(stage.criterion_flags[::2], stage.criterion_flags[1::2])) == {
        "--ddr-alpha": "0", "--ald-alpha": "0", "--encoder-l2": "1e-5"}


def test_cad_defaults_are_the_named_architectures():
    from deepnmt_fairseq.models import architectures

    assert experiments.cad_defaults is architectures.cad_defaults  # imported, not a copy


def test_update_freq_keeps_tokens_per_update():
    # Ott et al. 2018 / MSC: 65,536 tokens per update, 4,096 tokens per GPU and pass
    assert batch_plan(65536, 4096, 1) == (16, 4096, 65536)
    assert batch_plan(65536, 4096, 8) == (2, 4096, 65536)
    assert batch_plan(65536, 4096, 64) == (1, 1024, 65536)  # max tokens lowered instead of 4x the batch
    for T in (16384, 25000, 32768, 65536):
        for W in (1, 2, 3, 5, 8, 16, 64):
            uf, mt, eff = batch_plan(T, 4096, W)
            assert uf == update_freq(T, 4096, W) == max(1, math.ceil(T / (4096 * W)))
            assert mt <= 4096 and eff == uf * mt * W
            assert eff >= T or mt == 1024
            assert eff - T < W * uf or mt == 1024  # no more than one token per process over
    with pytest.raises(ValueError):
        update_freq(65536, 4096, 0)


def test_dry_run_update_freq_for_1_8_64_gpus():
    for gpus, uf, mt in ((1, 16, 4096), (8, 2, 4096), (64, 1, 1024)):
        (step,) = [s for s in _plan("msc-wmt14-ende-base-48L", gpus) if s.kind == "train"]
        assert _flag(step.argv, "--update-freq") == str(uf)
        assert _flag(step.argv, "--max-tokens") == str(mt)
        assert step.batch["effective_tokens_per_update"] == 65536
        ws = _flag(step.argv, "--distributed-world-size")
        assert ws == (str(gpus) if gpus > 1 else None)


def test_every_experiment_parses_with_fairseqs_parser():
    """Each train stage's command parses with fairseq's parser (plugin loaded through --user-dir),
    names a registered architecture and criterion, and passes the model's own checks of MSC
    blocks, CAD depth and GP group sizes; GPKD students match their teachers' extraction."""
    from fairseq import options
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY

    from deepnmt_fairseq.memories.msc import block_sizes
    from deepnmt_fairseq.models.options import DeepTransformerOptions
    from deepnmt_fairseq.modules.cross_attention_drop import drop_probabilities
    from deepnmt_fairseq.modules.group_permutation import check_group_size

    parsed = {}
    n = 0
    for name, exp in EXPS.items():
        steps = _plan(name)
        kinds = [s.kind for s in steps]
        assert kinds.count("train") == len(exp.train_stages)
        for step in steps:
            if step.kind != "train":
                continue
            n += 1
            argv = step.argv[1:]
            args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
            assert args.arch in ARCH_MODEL_REGISTRY and args.arch == _flag(argv, "--arch")
            assert args.criterion in CRITERION_REGISTRY
            assert args.user_dir.endswith("deepnmt_fairseq")
            assert (args.max_update > 0 or args.max_epoch > 0) and args.lr[0] > 0  # a budget: updates or epochs
            assert args.source_lang, args.target_lang == DATASETS[exp.dataset]
            opts = DeepTransformerOptions.from_args(args)
            if opts.deep_memory == "msc":
                assert sum(block_sizes(opts.msc_block_layers, args.encoder_layers, args.decoder_layers)) == args.encoder_layers
            drop_probabilities(args.decoder_layers, opts.cad_drop_depth, opts.cad_drop_ratio)
            check_group_size(args.encoder_layers, opts.gp_group_size)
            check_group_size(args.decoder_layers, opts.gp_decoder_group_size, "--gp-decoder-group-size")
            # stochastic structure and the multi-pass criterion train with legacy_ddp
            stochastic = (opts.ssl_rate > 0 or opts.gp_group_size > 1 or opts.gp_decoder_group_size > 1
                          or 0 < opts.cad_drop_ratio < 1 or getattr(args, "encoder_layerdrop", 0) > 0
                          or args.criterion == "collapse_reducing")
            assert args.ddp_backend == ("legacy_ddp" if stochastic else "c10d"), name
            parsed[(name, step.stage)] = args
    assert n >= len(EXPS)
    # GPKD: teacher layers / group size = the student architecture's layers
    for name, exp in EXPS.items():
        for i, stage in enumerate(exp.stages):
            if not isinstance(stage, ExtractStage):
                continue
            teacher = EXPS[stage.teacher.experiment] if stage.teacher.experiment else exp
            t = parsed[(teacher.name, stage.teacher.stage)]
            student = next(s for s in exp.stages[i + 1:] if s.kind == "train")
            s = parsed[(name, student.name)]
            assert t.encoder_layers // stage.encoder_group_size == s.encoder_layers, name
            assert t.decoder_layers // stage.decoder_group_size == s.decoder_layers, name
            assert (t.encoder_embed_dim, t.decoder_embed_dim) == (s.encoder_embed_dim, s.decoder_embed_dim)
            assert t.encoder_layers % stage.encoder_group_size == 0


def test_skd_and_extract_commands_use_existing_flags(capsys):
    from deepnmt_cli import average_checkpoints, extract_student, skd

    steps = _plan("gpkd-wmt14-ende-48L-teacher") + _plan("gpkd-wmt14-ende-24-1")
    by_kind = {s.kind: s for s in steps}
    assert set(by_kind) == {"train", "average", "skd", "extract"}
    for kind, cli, module in (("skd", "deepnmt-skd", skd), ("extract", "deepnmt-extract-student", extract_student),
                              ("average", "deepnmt-average-checkpoints", average_checkpoints)):
        assert Path(by_kind[kind].argv[0]).name == cli
        with pytest.raises(SystemExit):
            module.main(["--help"])
        help_text = capsys.readouterr().out
        for tok in by_kind[kind].argv[1:]:
            if tok.startswith("--"):
                assert tok in help_text, (cli, tok)
    # the student starts from the extracted layers of the teacher's averaged model, trains on its SKD data
    ext = by_kind["extract"]
    assert _flag(ext.argv, "--teacher").endswith("gpkd-wmt14-ende-48L-ssl-gp-e2-d6-teacher/train/checkpoint_avg5.pt")
    assert (_flag(ext.argv, "--encoder-group-size"), _flag(ext.argv, "--decoder-group-size")) == ("2", "6")
    student = [s for s in _plan("gpkd-wmt14-ende-24-1") if s.kind == "train"][0]
    assert student.argv[1].endswith("gpkd-wmt14-ende-48L-ssl-gp-e2-d6-teacher/skd/bin")
    assert _flag(student.argv, "--finetune-from-model") == _flag(ext.argv, "--output")
    # skipping sub-layer continues the early-stopped stage 1 from its averaged weights with its optimizer
    # state and update count (two-stage training)
    avg, ssl = _plan("gpkd-wmt14-ende-48L-ssl")
    assert avg.kind == "average" and "--keep-training-state" in avg.argv
    assert _flag(avg.argv, "--inputs").endswith("/gpkd-wmt14-ende-48L-converged")
    assert _flag(ssl.argv, "--continue-once") == _flag(avg.argv, "--output")
    assert _flag(ssl.argv, "--continue-once").endswith("gpkd-wmt14-ende-48L-converged/checkpoint_avg5.resume.pt")
    assert _flag(ssl.argv, "--ssl-rate") == "0.4" and _flag(ssl.argv, "--gp-group-size") is None


def test_launchers_give_fairseqs_distributed_flags():
    slurm = {"SLURM_NTASKS": "16", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "MASTER_ADDR": "node3",
             "MASTER_PORT": "23456", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    launch = commands.make_launch("slurm", env=slurm)
    assert (launch.world_size, launch.rank, launch.device_id) == (16, 9, 1)
    flags = launch.fairseq_flags()
    assert flags == ["--distributed-world-size", "16", "--distributed-rank", "9", "--distributed-init-method",
                     "tcp://node3:23456", "--distributed-no-spawn", "--device-id", "1"]
    bound = commands.make_launch("slurm", env={**slurm, "CUDA_VISIBLE_DEVICES": "5"})
    assert bound.device_id == 0  # a task bound to one GPU sees it as device 0
    tr = commands.make_launch("torchrun", env={"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "2",
                                               "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert tr.fairseq_flags()[:7] == ["--distributed-world-size", "4", "--distributed-rank", "2",
                                      "--distributed-init-method", "env://", "--distributed-no-spawn"]
    cpu = commands.make_launch("torchrun", env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
                                                "CUDA_VISIBLE_DEVICES": ""})
    assert cpu.cpu and "--distributed-backend" in cpu.fairseq_flags() and "gloo" in cpu.fairseq_flags()
    local = commands.make_launch("local", env={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    assert (local.world_size, local.rank, local.cpu) == (3, None, False)
    with pytest.raises(commands.ReproError, match="SLURM_PROCID"):
        commands.make_launch("slurm", env={"SLURM_NTASKS": "2", "MASTER_ADDR": "x"})
    with pytest.raises(commands.ReproError, match="MASTER_ADDR"):
        commands.make_launch("slurm", env={"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    # a CPU job with several processes must not use c10d (it asks for device_ids=[0])
    exp = EXPS["msc-iwslt14-ende-6L"]
    opts = commands.RunOptions(paths=commands.Paths(Path("/d"), Path("/c")), launch=cpu)
    argv, _ = commands.Planner(EXPS, exp, opts).train_argv(exp.stages[0])
    assert _flag(argv, "--ddp-backend") == "legacy_ddp" and "--cpu" in argv


def test_train_sh_dry_run_as_a_user_runs_it():
    env = {**ENV, "CUDA_VISIBLE_DEVICES": "0,1,2", "DEEPNMT_DATA": "/data/root", "DEEPNMT_CHECKPOINTS": "/ck"}
    res = subprocess.run(["bash", str(SCRIPTS / "train.sh"), "dd-wmt14-ende-base-27-27-cad-crt", "--dry-run",
                          "--fp16", "--", "--max-update", "7"], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    cmd = [ln for ln in res.stdout.splitlines() if "fairseq-train" in ln]
    assert len(cmd) == 1
    argv = shlex.split(cmd[0])
    assert argv[1] == "/data/root/wmt14-en-de-dd/bin"
    assert _flag(argv, "--arch") == "dd_base_27_27_cad" and _flag(argv, "--criterion") == "collapse_reducing"
    assert _flag(argv, "--update-freq") == str(math.ceil(32768 / (4096 * 3)))
    assert _flag(argv, "--distributed-world-size") == "3"
    assert _flag(argv, "--max-update") == "7"  # flags after -- win
    assert _flag(argv, "--save-dir") == "/ck/dd-wmt14-ende-base-27-27-cad-crt"
    assert "--fp16" in argv and _flag(argv, "--ddp-backend") == "legacy_ddp"
    bad = subprocess.run(["bash", str(SCRIPTS / "train.sh"), "msc-iwslt14-deen-72l-l2", "--dry-run"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "did you mean" in bad.stderr and "msc-iwslt14-deen-72L-l2" in bad.stderr
    ev = subprocess.run(["bash", str(SCRIPTS / "evaluate.sh"), "msc-iwslt14-deen-72L-l2", "--dry-run"],
                        capture_output=True, text=True, env=env)
    assert ev.returncode == 0, ev.stderr
    gen = shlex.split([ln for ln in ev.stdout.splitlines() if "fairseq-generate" in ln][0])
    assert (_flag(gen, "--beam"), _flag(gen, "--lenpen"), _flag(gen, "--required-batch-size-multiple")) == ("5", "1", "1")
    avg = shlex.split([ln for ln in ev.stdout.splitlines() if "deepnmt-average-checkpoints" in ln][0])
    assert _flag(avg, "--num-epoch-checkpoints") == "5"


def test_missing_input_of_another_experiment_is_a_clear_error(tmp_path):
    env = {**ENV, "DEEPNMT_DATA": str(tmp_path / "data"), "DEEPNMT_CHECKPOINTS": str(tmp_path / "ck")}
    res = subprocess.run(["bash", str(SCRIPTS / "train.sh"), "gpkd-wmt14-ende-48L-skd", "--gpus", "0"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 1
    assert "gpkd-wmt14-ende-48L/skd" in res.stderr and "run the experiment" in res.stderr
    assert not (tmp_path / "ck" / "gpkd-wmt14-ende-48L-skd").exists()


# ------------------------------------------------------------------------------ configs
@pytest.fixture(scope="module")
def generated_configs():
    from deepnmt_fairseq.repro import hydra_config

    return hydra_config.generate_all(EXPS)


def test_committed_configs_equal_the_registry(generated_configs):
    committed = {p.name: p.read_text(encoding="utf-8") for p in (REPO / "configs").glob("*.yaml")}
    assert set(committed) == set(generated_configs), (
        "configs/ and the registry differ: run deepnmt-repro write-configs")
    drift = [n for n in committed if committed[n] != generated_configs[n]]
    assert not drift, f"stale configs (run deepnmt-repro write-configs): {drift[:5]}"
    n_train = sum(len(e.train_stages) for e in EXPS.values())
    assert len(committed) == n_train


def test_configs_validate_against_fairseqs_schema(generated_configs, tmp_path):
    from omegaconf import OmegaConf

    from deepnmt_fairseq.repro import hydra_config

    import yaml

    # The schema check looks at keys and value types only: validate one file per distinct
    # (group, key, type) structure, and check every file's architecture and model keys.
    from fairseq.models import ARCH_MODEL_REGISTRY

    seen = {}
    for name, text in sorted(generated_configs.items()):
        body = yaml.safe_load(text)
        assert body["model"]["_name"] in ARCH_MODEL_REGISTRY
        assert set(body["model"]) - {"_name"} <= hydra_config.model_dests(body["model"]["_name"])
        assert body["hydra"] == {"run": {"dir": "${checkpoint.save_dir}"}, "job": {"chdir": False}}
        sig = tuple(sorted((g, k, type(v).__name__) for g, sec in body.items() if g != "hydra" for k, v in sec.items()
                           if k != "_name") + [(g, sec.get("_name")) for g, sec in body.items() if g != "model"
                                                                              and isinstance(sec, dict)])
        seen.setdefault(sig, name)
    assert len(seen) >= 10
    for name in seen.values():
        hydra_config.validate(REPO / "configs" / name)
    cfg = OmegaConf.load(REPO / "configs" / "msc-iwslt14-ende-72L-l2.yaml")
    assert cfg.model._name == "msc_iwslt_72l" and cfg.criterion.encoder_l2 == 1e-5
    assert list(cfg.optimization.update_freq) == [1] and cfg.optimization.max_update == 15000
    # a wrong key is caught
    bad = OmegaConf.to_container(cfg)
    bad["model"]["msc_fusoin"] = "add"
    OmegaConf.save(OmegaConf.create(bad), tmp_path / "bad.yaml")
    with pytest.raises(ValueError, match="msc_fusoin"):
        hydra_config.validate(tmp_path / "bad.yaml")
    bad = OmegaConf.to_container(cfg)
    bad["optimization"]["max_updates"] = 3
    OmegaConf.save(OmegaConf.create(bad), tmp_path / "bad2.yaml")
    with pytest.raises(Exception, match="max_updates"):
        hydra_config.validate(tmp_path / "bad2.yaml")


def test_docs_and_results_table(tmp_path):
    from deepnmt_fairseq.repro import tables as results_table

    doc = (REPO / "docs" / "reproduction.md").read_text(encoding="utf-8")
    assert doc == results_table.render_docs(), "docs/reproduction.md is stale: deepnmt-repro table --docs"
    for name in EXPS:  # every experiment has its command in the doc
        assert f"scripts/train.sh {name} && scripts/evaluate.sh {name}" in doc
    # measured numbers appear next to the paper's once a results.json exists
    ck = tmp_path / "ck"
    for name, bleu, tps in (("gpkd-wmt14-ende-desdar-48-1", 28.0, 300.0), ("gpkd-wmt14-ende-base-6L", 27.0, 150.0),
                            ("gpkd-wmt14-ende-48L", 29.5, 100.0)):
        (ck / name).mkdir(parents=True)
        (ck / name / "results.json").write_text(json.dumps({"bleu": bleu, "tokens_per_s": tps}))
    text = results_table.render(ck, "gpkd-t2")
    row = next(ln for ln in text.splitlines() if ln.startswith("| DESDAR 48-1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # BLEU paper | ours | speedup vs Base paper | ours | speedup vs Deep paper | ours
    assert cells[1:7] == ["28.31", "28.00", "1.97", "2.00", "2.17", "3.00"]
    assert ("`deepnmt-repro train gpkd-wmt14-ende-desdar-48-1 && deepnmt-repro evaluate gpkd-wmt14-ende-desdar-48-1`"
            in row)
    missing = next(ln for ln in text.splitlines() if ln.startswith("| DESDAR 48-3 |"))
    assert "| 29.82 | — |" in missing


# ------------------------------------------------------------------------------ scoring
def test_tokenized_bleu_on_a_hand_checked_example():
    hyp, ref = "the cat sat on the mat", "the cat sat on a mat"
    # clipped matches / hypothesis n-grams: 1-grams 5/6, 2-grams 3/5, 3-grams 2/4, 4-grams 1/3; equal lengths: BP 1
    expected = 100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    assert scoring.multi_bleu([hyp], [ref]) == pytest.approx(expected, abs=1e-9)
    score = scoring.tokenized_bleu([hyp], [ref])
    assert score.counts == [5, 3, 2, 1] and score.totals == [6, 5, 4, 3]
    assert score.score == pytest.approx(expected, abs=1e-9)
    # brevity penalty: a 3-word hypothesis of a 6-word reference
    assert scoring.multi_bleu(["the cat sat"], ["the cat sat on the mat"]) == 0.0  # no 4-gram at all: BLEU 0
    two = scoring.multi_bleu(["the cat sat on"], ["the cat sat on the mat"])
    assert two == pytest.approx(100 * math.exp(1 - 6 / 4), abs=1e-9)
    # case: multi-bleu -lc lowercases both sides
    assert scoring.multi_bleu(["The Cat sat on"], ["the cat sat on"]) == 0.0
    assert scoring.multi_bleu(["The Cat sat on"], ["the cat sat on"], lowercase=True) == pytest.approx(100.0)
    assert scoring.tokenized_bleu(["The Cat sat on"], ["the cat sat on"], lowercase=True).score == pytest.approx(100.0)


def test_sacrebleu_none_tokenized_equals_multi_bleu():
    rng = random.Random(3)
    vocab = "a b c d e f g h , . Der die das Haus-Tür ist".split()
    for trial in range(30):
        n = rng.randint(1, 12)
        refs = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 15))) for _ in range(n)]
        hyps = []
        for r in refs:
            toks = r.split()
            if rng.random() < 0.5:
                toks = [t if rng.random() < 0.7 else rng.choice(vocab) for t in toks]
            if rng.random() < 0.3:
                toks = toks[: max(1, len(toks) - rng.randint(0, 3))]
            hyps.append(" ".join(toks).upper() if rng.random() < 0.1 else " ".join(toks))
        for lc in (False, True):
            ours = scoring.multi_bleu(hyps, refs, lowercase=lc)
            sb = scoring.tokenized_bleu(hyps, refs, lowercase=lc).score
            assert sb == pytest.approx(ours, abs=1e-9), (trial, lc)
            assert round(sb, 2) == round(ours, 2)  # multi-bleu.perl prints %.2f


def test_compound_splitting():
    assert scoring.compound_split("ein Computer-Tisch") == "ein Computer ##AT##-##AT## Tisch"
    # aggressive-dash tokens (Moses -a) are split the same way on both sides
    assert scoring.compound_split("Computer @-@ Tisch") == "Computer @ ##AT##-##AT## @ Tisch"
    # perl's s///g matches left to right without overlap
    assert scoring.compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    assert scoring.compound_split("- a -") == "- a -"
    hyp, ref = ["ein Computer-Tisch"], ["ein Computer-Schrank"]
    plain = scoring.tokenized_bleu(hyp, ref)
    split = scoring.tokenized_bleu([scoring.compound_split(h) for h in hyp], [scoring.compound_split(r) for r in ref])
    assert plain.counts[0] == 1 and plain.totals[0] == 2
    assert split.counts[0] == 3 and split.totals[0] == 4  # partial credit for the shared part


def test_detokenized_sacrebleu():
    hyps = ["Hello , world !", "das ist ein Computer @-@ Tisch ."]
    refs = ["Hello, world!", "das ist ein Computer-Tisch."]
    score, sig, detok = scoring.detok_sacrebleu(hyps, refs, "de")
    assert detok == refs
    assert score.score == pytest.approx(100.0)
    assert "tok:13a" in sig and "case:mixed" in sig and "nrefs:1" in sig
    score_lc, sig_lc, _ = scoring.detok_sacrebleu(["hello , world !"], ["Hello, world!"], "en", lowercase=True)
    assert score_lc.score == pytest.approx(100.0) and "case:lc" in sig_lc


def test_parsers_of_fairseq_output():
    from deepnmt_fairseq.analysis.logs import parse_train_log
    from deepnmt_fairseq.generate_output import parse_generate

    text = "\n".join([
        "S-1\tb a", "T-1\tB A", "H-1\t-0.5\tB A", "D-1\t-0.5\tB A", "P-1\t-0.1 -0.2",
        "S-0\ta", "T-0\tA", "H-0\t-0.25\tA", "H-0\t-0.9\tX",
        "2024-01-01 | INFO | fairseq_cli.generate | Translated 2 sentences (5 tokens) in 0.5s (4.00 sentences/s, "
        "10.00 tokens/s)",
        "Generate test with beam=5: BLEU4 = 12.34, 50.0/20.0/10.0/5.0 (BP=1.000, ratio=1.000, syslen=3, reflen=3)",
    ])
    out = parse_generate(text)
    assert out["hyps"] == {0: "A", 1: "B A"} and out["refs"] == {0: "A", 1: "B A"}
    assert out["tokens_per_s"] == 10.0 and out["sentences"] == 2 and out["decode_seconds"] == 0.5
    assert out["fairseq_bleu"] == "BLEU4 = 12.34"
    log = "\n".join([
        "INFO | fairseq_cli.train | num. shared model params: 1,234,567 (num. trained: 1,234,567)",
        "epoch 001 | valid on 'valid' subset | loss 6.7 | nll_loss 6.1 | ppl 68.5 | wps 0",
        "epoch 002 | valid on 'valid' subset | loss 5.7 | nll_loss 5.1 | ppl 34.25 | wps 0",
        "INFO | fairseq_cli.train | done training in 3600.0 seconds",
    ])
    st = parse_train_log(log)
    assert st == {"params": 1234567, "params_m": 1.23, "train_seconds": 3600.0, "valid_ppl": 34.25}


def test_evaluate_mean_over_checkpoints_and_results_file(tmp_path):
    """Bapna et al.'s score (mean over the last K checkpoints), from decodings already on disk
    (evaluate.sh reuses a decoding newer than its checkpoint), and results.json handling."""
    import time

    from deepnmt_fairseq.repro.evaluate import EvalOptions, Evaluator

    name = "transparent-wmt14-ende-6L"
    data, ck = tmp_path / "data", tmp_path / "ck"
    refs = ["ein Haus-Boot .", "das ist gut .", "ja"]
    for sub in ("tok", "raw"):
        (data / "wmt14-en-de" / sub).mkdir(parents=True)
    (data / "wmt14-en-de" / "tok" / "test.de").write_text("\n".join(refs) + "\n")
    (data / "wmt14-en-de" / "raw" / "test.de").write_text("ein Haus-Boot.\ndas ist gut.\nja\n")
    hyps = {1: ["ein Haus-Boot .", "das ist nicht gut .", "ja"], 2: ["ein Boot .", "das ist gut .", "nein"],
            3: ["ein Haus-Boot .", "das ist gut .", "ja"]}
    (ck / name).mkdir(parents=True)
    for u, hs in hyps.items():
        (ck / name / f"checkpoint_1_{u}.pt").write_bytes(b"x")
    (ck / name / ".done").write_text("")  # training finished (issue 82: evaluation requires it)
    time.sleep(0.05)
    for u, hs in hyps.items():
        lines = [f"H-{i}\t-0.1\t{h}" for i, h in reversed(list(enumerate(hs)))]
        lines.append(f"Translated 3 sentences (12 tokens) in 0.1s (30.00 sentences/s, {100 * u}.00 tokens/s)")
        (ck / name / f"generate-test-checkpoint_1_{u}.txt").write_text("\n".join(lines) + "\n")
    opts = EvalOptions(paths=commands.Paths(data, ck), average=2, cpu=True)
    res = Evaluator(EXPS[name], EXPS, opts).run()
    per = [scoring.multi_bleu(hyps[u], refs) for u in (2, 3)]  # the last two checkpoints
    assert [p["tok_bleu"] for p in res["per_checkpoint"]] == [round(x, 2) for x in per]
    assert res["tok_bleu"] == round((round(per[0], 2) + round(per[1], 2)) / 2, 2)
    assert res["bleu"] == res["tok_bleu"] and res["mode"] == "mean" and res["tokens_per_s"] == 250.0
    assert res["models"] == [str(ck / name / "checkpoint_1_2.pt"), str(ck / name / "checkpoint_1_3.pt")]
    saved = json.loads((ck / name / "results.json").read_text())
    assert saved["tok_bleu"] == res["tok_bleu"] and "sacrebleu_signature" in saved
    # a new result never silently replaces the old file
    Evaluator(EXPS[name], EXPS, EvalOptions(paths=commands.Paths(data, ck), average=3, cpu=True)).run()
    assert json.loads((ck / name / "results.old-1.json").read_text())["tok_bleu"] == res["tok_bleu"]
    # too few checkpoints for the paper's window: a clear error
    with pytest.raises(commands.ReproError, match="mean over 21 checkpoints"):
        Evaluator(EXPS[name], EXPS, EvalOptions(paths=commands.Paths(data, ck), cpu=True)).run()


# ------------------------------------------------------------------------------ end to end (slow)
TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--max-update", "2", "--update-freq", "1", "--log-interval", "1", "--disable-validation"]
FAST_DECODE = ["--max-len-a", "0", "--max-len-b", "2"]


SUBSET = {"train": 3000, "valid": 200, "test": 300}  # first lines of the embedded corpus (speed)


@pytest.fixture(scope="module")
def corpus_env(tmp_path_factory):
    """The embedded LibreOffice-help corpus, its first lines (SUBSET), prepared by
    quickstart.prepare (sacremoses, 1000 joint BPE merges, fairseq-preprocess) and laid out as
    $DEEPNMT_DATA/<dataset>/{bin,tok,raw} for the En->De datasets the families use."""
    import gzip

    from deepnmt_fairseq import quickstart

    root = tmp_path_factory.mktemp("repro")
    small = root / "corpus"
    small.mkdir()
    for split, n in SUBSET.items():
        for lang in ("en", "de"):
            with gzip.open(quickstart.DATA / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            with gzip.open(small / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.writelines(lines)
    work = root / "qs"
    work.mkdir()
    bin_dir = quickstart.prepare(work, 1000, data=small)
    data = root / "data"
    for ds in ("iwslt14-en-de", "wmt14-en-de", "wmt14-en-de-dd", "wmt14-en-de-gpkd"):
        d = data / ds
        (d / "tok").mkdir(parents=True)
        (d / "raw").mkdir()
        (d / "bin").symlink_to(bin_dir)
        for lang in ("en", "de"):
            (d / "tok" / f"test.{lang}").symlink_to(work / "tok" / f"test.tok.{lang}")
            (d / "raw" / f"test.{lang}").symlink_to(work / "tok" / f"test.raw.{lang}")
    env = {**ENV, "DEEPNMT_DATA": str(data), "DEEPNMT_CHECKPOINTS": str(root / "ck")}
    return {"root": root, "env": env, "work": work, "data": data}


def _sh(script, *args, env):
    res = subprocess.run(["bash", str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=900)
    assert res.returncode == 0, f"{script} {args} failed:\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}"
    return res


def _check_results(path: Path, corpus_env, exp_name):
    from deepnmt_fairseq.generate_output import parse_generate

    res = json.loads(path.read_text(encoding="utf-8"))
    exp = EXPS[exp_name]
    for key in ("tok_bleu", "tok_bleu_lc", "tok_bleu_compound_split", "sacrebleu", "sacrebleu_signature",
                "tokens_per_s", "bleu", "primary_metric", "sentences", "params", "params_m", "generation"):
        assert key in res, key
    assert res["sentences"] == SUBSET["test"] and res["primary_metric"] == exp.eval.primary
    assert res["bleu"] == res[exp.eval.primary]
    assert res["generation"]["beam"] == exp.eval.beam and res["generation"]["lenpen"] == exp.eval.lenpen
    assert "tok:13a" in res["sacrebleu_signature"]
    assert res["params"] > 0 and res["tokens_per_s"] > 0
    # the reported BLEU is multi-bleu.perl's on the decoded test set against the tokenized reference
    refs = (corpus_env["work"] / "tok" / "test.tok.de").read_text(encoding="utf-8").splitlines()
    gen = Path(res["generate_output"]).read_text(encoding="utf-8")
    hyps, missing = scoring.ordered(parse_generate(gen)["hyps"], len(refs))
    assert not missing
    assert res["tok_bleu"] == round(scoring.multi_bleu(hyps, refs), 2)
    assert res["tok_bleu_lc"] == round(scoring.multi_bleu(hyps, refs, lowercase=True), 2)
    return res


@pytest.mark.slow
def test_msc_family_end_to_end(corpus_env):
    """MSC Table 2 row 6 (72 layers + encoder L2) at toy size: train.sh, then evaluate.sh."""
    env, name = corpus_env["env"], "msc-iwslt14-ende-72L-l2"
    _sh("train.sh", name, "--max-tokens", "1024", "--", *TINY, "--encoder-layers", "4", "--decoder-layers", "2",
        "--msc-block-layers", "2", env=env)
    save = corpus_env["root"] / "ck" / name
    assert (save / ".done").exists() and (save / "checkpoint_last.pt").exists()
    log = (save / "train.log").read_text()
    assert "encoder_l2" in log  # the L2 term of row 6 was trained
    cmd = json.loads((save / "commands.jsonl").read_text().splitlines()[-1])["argv"]
    assert _flag(cmd, "--encoder-l2") == "1e-5" and _flag(cmd, "--arch") == "msc_iwslt_72l"
    again = _sh("train.sh", name, "--max-tokens", "1024", "--", *TINY, "--encoder-layers", "4", "--decoder-layers",
                "2", "--msc-block-layers", "2", env=env)
    assert "done earlier" in again.stderr  # a finished stage is not redone
    _sh("evaluate.sh", name, "--average", "1", "--", *FAST_DECODE, env=env)
    res = _check_results(save / "results.json", corpus_env, name)
    assert res["primary_metric"] == "tok_bleu_lc" and res["generation"]["batch_size"] == 32


@pytest.mark.slow
def test_transparent_family_end_to_end(corpus_env):
    """Bapna et al.: transparent attention, interval checkpoints (the mean over the last K
    checkpoints is tested without decoding in test_evaluate_mean_over_checkpoints...)."""
    env, name = corpus_env["env"], "transparent-wmt14-ende-16L"
    _sh("train.sh", name, "--max-tokens", "1024", "--", *TINY, "--encoder-layers", "3", "--decoder-layers", "1",
        "--save-interval-updates", "1", env=env)
    save = corpus_env["root"] / "ck" / name
    assert (save / "checkpoint_1_1.pt").exists() and (save / "checkpoint_1_2.pt").exists()
    cmd = json.loads((save / "commands.jsonl").read_text().splitlines()[-1])["argv"]
    assert _flag(cmd, "--arch") == "transparent_wmt_base_16l" and _flag(cmd, "--warmup-updates") == "40000"
    _sh("evaluate.sh", name, "--average", "1", "--", *FAST_DECODE, env=env)
    res = _check_results(save / "results.json", corpus_env, name)
    assert res["mode"] == "mean" and res["primary_metric"] == "tok_bleu"


@pytest.mark.slow
def test_deep_decoder_cad_crt_family_with_averaging(corpus_env):
    """Deep-decoder DEEP+CAD+CRT: collapse-reducing criterion, CAD, averaged interval checkpoints."""
    env, name = corpus_env["env"], "dd-wmt14-ende-base-27-27-cad-crt"
    _sh("train.sh", name, "--max-tokens", "1024", "--", *TINY, "--encoder-layers", "2", "--decoder-layers", "3",
        "--cad-drop-depth", "2", "--save-interval-updates", "1", env=env)
    save = corpus_env["root"] / "ck" / name
    log = (save / "train.log").read_text()
    assert "ddr_loss" in log and "ald_loss" in log  # CRT terms were trained
    _sh("evaluate.sh", name, "--average", "2", "--", *FAST_DECODE, env=env)
    assert (save / "checkpoint_avg2.pt").exists()
    res = _check_results(save / "results.json", corpus_env, name)
    assert res["primary_metric"] == "tok_bleu" and res["models"] == [str(save / "checkpoint_avg2.pt")]  # Sec. 4.1: multi-bleu.perl
    # evaluating again reuses the decoding and leaves results.json as it is
    before = (save / "results.json").read_text()
    _sh("evaluate.sh", name, "--average", "2", "--", *FAST_DECODE, env=env)
    assert json.loads((save / "results.json").read_text())["tok_bleu"] == json.loads(before)["tok_bleu"]
    assert not list(save.glob("results.old-*.json"))


@pytest.mark.slow
def test_gpkd_family_teacher_skd_extract_student(corpus_env):
    """GPKD: GP teacher -> SKD data -> one layer per group with the teacher's h -> student on the SKD
    data; and the skipping sub-layer's two stages: the early-stopped plain model, continued with
    skipping (--continue-once: weights, optimizer state, schedule and update count)."""
    env = corpus_env["env"]
    ck = corpus_env["root"] / "ck"
    teacher, student, ssl = "gpkd-wmt14-ende-48L-teacher", "gpkd-wmt14-ende-48L-gpkd", "gpkd-wmt14-ende-48L-ssl"
    stage1 = "gpkd-wmt14-ende-48L-converged"
    skd_args = "--shards 1 --max-len-a 0 --max-len-b 2 --batch-size 512"
    layers = ["--encoder-layers", "8", "--decoder-layers", "1"]  # GP groups: encoder h=8
    _sh("train.sh", teacher, "--max-tokens", "1024", "--average", "1", "--skd-args", skd_args, "--", *TINY, *layers,
        env=env)
    assert (ck / teacher / "train" / ".done").exists() and (ck / teacher / "skd" / "bin" / ".done").exists()
    tcmd = json.loads((ck / teacher / "train" / "commands.jsonl").read_text().splitlines()[-1])["argv"]
    assert (_flag(tcmd, "--gp-group-size"), _flag(tcmd, "--gp-decoder-group-size")) == ("8", None)
    assert _flag(tcmd, "--ddp-backend") == "legacy_ddp"
    from fairseq.data import data_utils

    skd = data_utils.load_indexed_dataset(str(ck / teacher / "skd" / "bin" / "train.en-de.de"), None)
    assert len(skd) == SUBSET["train"]  # every training sentence translated by the teacher
    _sh("train.sh", student, "--max-tokens", "1024", "--average", "1", "--", *TINY, "--encoder-layers", "1",
        "--decoder-layers", "1", env=env)
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    init = load_checkpoint(str(ck / student / "extract" / "student-init.pt"))
    assert (init["cfg"]["model"].encoder_layers, init["cfg"]["model"].decoder_layers) == (1, 1)
    assert init["extra_state"]["gpkd_student"]["teacher_gp_group_size"]["encoder"] == 8
    scmd = json.loads((ck / student / "student" / "commands.jsonl").read_text().splitlines()[-1])["argv"]
    assert scmd[1] == str(ck / teacher / "skd" / "bin")
    assert _flag(scmd, "--finetune-from-model") == str(ck / student / "extract" / "student-init.pt")
    slog = (ck / student / "student" / "train.log").read_text()
    assert "loading pretrained model from" in slog and "student-init.pt" in slog
    _sh("evaluate.sh", student, "--average", "1", "--", *FAST_DECODE, env=env)
    _check_results(ck / student / "results.json", corpus_env, student)
    # two-stage skipping sub-layer: stage 1 (plain, early stopping) for 2 updates, stage 2 goes on to 4
    _sh("train.sh", stage1, "--max-tokens", "1024", "--", *TINY, *layers, "--max-update", "2", env=env)
    c1 = json.loads((ck / stage1 / "commands.jsonl").read_text().splitlines()[-1])["argv"]
    assert _flag(c1, "--patience") == str(experiments.GPKD_PATIENCE) and _flag(c1, "--ssl-rate") is None
    _sh("train.sh", ssl, "--max-tokens", "1024", "--average", "1", "--", *TINY, *layers, "--max-update", "4", env=env)
    log = (ck / ssl / "train.log").read_text()
    assert f"{ck / stage1}/checkpoint_last.pt" in log and "@ 2 updates" in log  # restored stage 1 at update 2
    state = load_checkpoint(str(ck / ssl / "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 4
    assert bool(state["model"]["encoder.ssl_active"]) and state["cfg"]["model"].gp_group_size == 1


@pytest.mark.slow
def test_torchrun_example_trains_with_two_cpu_ranks(corpus_env, tmp_path):
    """scripts/torchrun_example.sh: torchrun's c10d rendezvous, two ranks, fairseq's own
    distributed engine (gloo on the CPU, legacy_ddp), --distributed-* flags from the environment."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    name = "msc-iwslt14-ende-6L"
    env = {**corpus_env["env"], "NPROC_PER_NODE": "2", "RDZV_PORT": str(port), "RDZV_ID": "test",
           "TORCHRUN": commands.exe("torchrun"), "CUDA_VISIBLE_DEVICES": ""}
    # --cpu: ranks without a GPU train on the CPU only when asked to (deepnmt_fairseq/jobs/cluster.py)
    res = subprocess.run(["bash", str(SCRIPTS / "torchrun_example.sh"), name, "--cpu", "--save-dir",
                          str(tmp_path / "ck"), "--max-tokens", "1024", "--", *TINY, "--encoder-layers", "2",
                          "--decoder-layers", "2"],
                         capture_output=True, text=True, env=env, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "initialized host" in out and "as rank 1" in out and "as rank 0" in out
    assert (tmp_path / "ck" / "checkpoint_last.pt").exists() and (tmp_path / "ck" / ".done").exists()
    argv = json.loads((tmp_path / "ck" / "commands.jsonl").read_text().splitlines()[-1])["argv"]
    assert (_flag(argv, "--distributed-world-size"), _flag(argv, "--distributed-rank")) == ("2", "0")
    assert _flag(argv, "--distributed-init-method") == "env://" and "--distributed-no-spawn" in argv
    assert _flag(argv, "--ddp-backend") == "legacy_ddp" and _flag(argv, "--distributed-backend") == "gloo"


@pytest.mark.slow
def test_fairseq_hydra_train_runs_a_generated_config(corpus_env, tmp_path):
    """configs/<name>.yaml is a working fairseq-hydra-train config (1 update on the small corpus,
    found through $DEEPNMT_DATA as the config's interpolation says)."""
    name = "dd-wmt14-ende-base-15-15-cad-crt"
    overrides = [f"checkpoint.save_dir={tmp_path / 'ck'}", "optimization.max_update=1", "common.cpu=true",
                 "dataset.num_workers=0", "dataset.max_tokens=500", "optimization.update_freq=[1]",
                 "+model.encoder_layers=2", "+model.decoder_layers=2", "+model.cad_drop_depth=1",
                 "+model.encoder_embed_dim=16", "+model.decoder_embed_dim=16", "+model.encoder_ffn_embed_dim=32",
                 "+model.decoder_ffn_embed_dim=32", "+model.encoder_attention_heads=2",
                 "+model.decoder_attention_heads=2"]
    res = subprocess.run([commands.exe("fairseq-hydra-train"), "--config-dir", str(REPO / "configs"),
                          "--config-name", name, *overrides], capture_output=True, text=True,
                         env=corpus_env["env"], cwd=REPO,
                         timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert (tmp_path / "ck" / "checkpoint_last.pt").exists()
    assert "ddr_loss" in out and "ald_loss" in out and "dd_base_15_15_cad" in out
    assert (tmp_path / "ck" / ".hydra").is_dir()  # hydra's files go next to the checkpoints, not into the repo
    assert not (REPO / ".hydra").exists()


def test_msc_comparison_rows_run_the_papers_backbone():
    """MSC Sec. 4.2: Bapna et al. and Wang et al. 'on the same vanilla Transformer backbone'
    (pre-norm); Wang et al. is DLCL; Fig. 2's plain nets are pre-norm.  Post-norm variants
    exist as their own experiments, outside the paper's tables."""
    from fairseq.models import ARCH_MODEL_REGISTRY  # noqa: F401  (architectures registered)

    from deepnmt_fairseq.repro.registry import EXPERIMENTS, TABLES

    def model_args(name):
        from argparse import Namespace

        from fairseq.models import ARCH_CONFIG_REGISTRY

        (stage,) = [s for s in EXPERIMENTS[name].stages if getattr(s, "arch", None)]
        args = Namespace()
        ARCH_CONFIG_REGISTRY[stage.arch](args)
        return args

    rows = {r.experiment: r for t in TABLES if t.key in ("msc-t3", "msc-fig2") for r in t.rows
            if r.experiment and not r.label.startswith("variant")}
    (wang,) = [r for t in TABLES if t.key == "msc-t4" for r in t.rows if r.label.startswith("Wang")]
    rows[wang.experiment] = wang
    for name in rows:
        args = model_args(name)
        assert args.encoder_normalize_before, name  # every compared system is pre-norm
        if "-wang-" in name or "dlcl" in name:
            assert args.deep_memory == "dlcl", name
        if "-bapna-" in name and name.startswith("msc-iwslt"):
            assert args.deep_memory == "transparent", name
    assert {"msc-iwslt14-ende-wang-36L", "msc-iwslt14-ende-wang-72L-l2", "msc-wmt14-ende-dlcl-30L",
            "msc-iwslt14-ende-plain-36L", "msc-iwslt14-ende-plain-72L"} <= set(rows)
    variants = {r.experiment for t in TABLES for r in t.rows if r.label.startswith("variant")}
    for post in ("msc-iwslt14-ende-bapna-postnorm-36L", "msc-iwslt14-ende-plain-postnorm-72L"):
        assert not model_args(post).encoder_normalize_before and post in variants


# ------------------------------------------------------------------------------ issue 37: recipes, round 2
def _train_argv(name, stage=None, gpus=8):
    steps = [s for s in _plan(name, gpus=gpus) if s.kind == "train" and (stage is None or s.stage == stage)]
    assert len(steps) == 1, (name, [s.stage for s in steps])
    return steps[0].argv


def _dry_run_lines(capsys, *argv):
    from deepnmt_cli import repro as cli

    capsys.readouterr()
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def _table(key):
    return next(t for t in experiments.TABLES if t.key == key)


def test_gpkd_two_stage_rows_train_table_3s_budget_with_a_matched_control():
    """Li et al. 2021 Table 3: Deep-RPR-48L and '+ Skipping Sub-Layer' both 50K updates.  Stage 1 early-stops
    within 50K, stage 2 continues the update count to the same 50K (not 100K), and the control runs the same
    stage 2 without skipping."""
    deep = _train_argv("gpkd-wmt14-ende-48L")
    stage1 = _train_argv("gpkd-wmt14-ende-48L-converged")
    ssl = _train_argv("gpkd-wmt14-ende-48L-ssl")
    control = _train_argv("gpkd-wmt14-ende-48L-continued")
    assert _flag(deep, "--max-update") == _flag(stage1, "--max-update") == "50000" and _flag(deep, "--patience") is None
    for argv in (stage1, ssl, control):
        assert _flag(argv, "--patience") == str(experiments.GPKD_PATIENCE)
    for argv in (ssl, control):  # --continue-once keeps stage 1's update count: 50K is the total
        assert _flag(argv, "--max-update") == "50000"
        assert _flag(argv, "--continue-once") == "/ckpt/gpkd-wmt14-ende-48L-converged/checkpoint_avg5.resume.pt"
        assert "--finetune-from-model" not in argv
    assert _flag(ssl, "--ssl-rate") == "0.4"

    def without(argv, *flags):  # the command line less the given flags and their values
        out, skip = [], False
        for a in argv:
            if skip:
                skip = False
            elif a in flags:
                skip = True
            else:
                out.append(a)
        return out

    # the same command but for skipping (and the DDP backend skipping needs, and the run's own directory)
    assert without(control, "--save-dir", "--ddp-backend") == without(ssl, "--save-dir", "--ddp-backend", "--ssl-rate")
    for key in ("gpkd-t3", "gpkd-t4", "gpkd-t5"):  # the control is a row wherever a finetune row is
        (row,) = [r for r in _table(key).rows if r.experiment == "gpkd-wmt14-ende-48L-continued"]
        assert row.label.startswith("matched control (not in the paper)")
    # every GPKD row's budget is the setup section's: Base/Deep 50k, Big 150k updates (En-De)
    for name, exp in EXPS.items():
        if exp.paper != experiments.GPKD:
            continue
        for stage in exp.train_stages:
            want = "150000" if "big" in stage.arch else "50000"
            assert _flag(_train_argv(name, stage.name), "--max-update") == want, (name, stage.name)
    note = _table("gpkd-t3").rows[5].note
    assert "100K" in note and "50k/150k/50k" in note  # Base-RPR: Table 3's 100K vs the setup text's 50K


def test_gpkd_table_6_names_each_students_teacher_and_the_cost(capsys):
    t6 = _table("gpkd-t6")
    teachers = {n for n, e in EXPS.items() if n.startswith("gpkd-wmt14-ende-48L-ssl-gp-")}
    assert teachers == {f"gpkd-wmt14-ende-48L-ssl-gp-e{e}-d{d}-teacher" for e, d in ((2, 2), (2, 6), (8, 2))}
    assert "3 two-stage teachers (3x the paper's teacher cost)" in t6.note
    rows = {r.label: r for r in t6.rows}
    assert rows["Skipping Sub-Layer + GP 48-6"].experiment == "gpkd-wmt14-ende-48L-ssl-gp-e8-d2-teacher"
    for label, teacher, h in (("GPKD 24-3", "e2-d2", ("2", "2")), ("GPKD 24-1", "e2-d6", ("2", "6")),
                              ("GPKD 6-6", "e8-d2", ("8", "1")), ("GPKD 6-3", "e8-d2", ("8", "2"))):
        assert f"student of gpkd-wmt14-ende-48L-ssl-gp-{teacher}-teacher" in rows[label].note
        plan = _plan(rows[label].experiment)
        (extract,) = [s for s in plan if s.kind == "extract"]
        assert (_flag(extract.argv, "--encoder-group-size"), _flag(extract.argv, "--decoder-group-size")) == h
        assert f"/ckpt/gpkd-wmt14-ende-48L-ssl-gp-{teacher}-teacher/" in " ".join(extract.argv)
    text = tables_render("gpkd-t6")
    assert "3x the paper's teacher cost" in text and "student of gpkd-wmt14-ende-48L-ssl-gp-e8-d2-teacher" in text


def tables_render(key):
    from deepnmt_fairseq.repro import tables

    return tables.render(Path("/nonexistent"), key)


def test_dlcl_rows_follow_wang_et_al_run_script(capsys):
    """MSC Table 4 cites Wang et al. (2019a)'s 29.3: lr 2e-3, 16K warm-up from 1e-7, Adam (0.9, 0.997), 8 x 4096 x 2
    tokens per update, 20 epochs, last 5 averaged, beam 4, lenpen 0.6.  The MSC-recipe run is a named variant."""
    argv = _train_argv("msc-wmt14-ende-dlcl-30L", gpus=8)
    assert (_flag(argv, "--arch"), _flag(argv, "--lr"), _flag(argv, "--warmup-updates"),
            _flag(argv, "--warmup-init-lr"), _flag(argv, "--adam-betas")) == \
        ("dlcl_wmt_base_30l", "0.002", "16000", "1e-07", "(0.9, 0.997)")
    assert (_flag(argv, "--max-epoch"), _flag(argv, "--max-update")) == ("20", "0")
    assert (_flag(argv, "--max-tokens"), _flag(argv, "--update-freq")) == ("4096", "2")  # 8 x 4096 x 2
    out = _dry_run_lines(capsys, "evaluate", "msc-wmt14-ende-dlcl-30L", "--dry-run")
    gen = shlex.split([ln for ln in out.splitlines() if "fairseq-generate" in ln][0])
    avg = shlex.split([ln for ln in out.splitlines() if "deepnmt-average-checkpoints" in ln][0])
    assert (_flag(gen, "--beam"), _flag(gen, "--lenpen"), _flag(avg, "--num-epoch-checkpoints")) == ("4", "0.6", "5")
    variant = _train_argv("msc-wmt14-ende-dlcl-30L-msc-recipe")
    assert (_flag(variant, "--lr"), _flag(variant, "--max-update"), _flag(variant, "--max-epoch")) == \
        ("0.000494", "100000", None)
    rows = {r.experiment: r for r in _table("msc-t4").rows if r.experiment}
    assert rows["msc-wmt14-ende-dlcl-30L"].label == "Wang et al. (2019a)"
    assert rows["msc-wmt14-ende-dlcl-30L-msc-recipe"].label.startswith("variant (not in the paper)")
    # Table 3 is MSC's own re-implementation on its backbone and settings: it says so
    for r in _table("msc-t3").rows:
        if "Wang" in r.label:
            assert "MSC's backbone and recipe" in r.note
            assert _flag(_train_argv(r.experiment), "--warmup-updates") == "8000"


def test_deep_decoder_loss_weights_are_the_unweighted_sum_and_readings_are_visible(capsys):
    from deepnmt_fairseq.criterions.collapse_reducing import CollapseReducingConfig

    cfg = CollapseReducingConfig()
    assert (cfg.ddr_alpha, cfg.ald_alpha) == (1.0, 1.0)  # the criterion's defaults: the unweighted sum
    for name in ("dd-wmt14-ende-base-15-15-cad-crt", "dd-wmt14-ende-base-27-27-cad-crt", "dd-wmt14-ende-big-15-15-cad-crt"):
        argv = _train_argv(name)
        assert (_flag(argv, "--ddr-alpha"), _flag(argv, "--ald-alpha")) == ("1.0", "1.0"), name
    argv = _train_argv("dd-fig2-base-27-27-depth21-ratio0.5")
    assert (_flag(argv, "--ddr-alpha"), _flag(argv, "--ald-alpha")) == ("0", "1.0")
    ours = _train_argv("dd-wmt14-ende-base-15-15-cad-crt-ald0.5")  # our earlier weighting, kept as a named row
    assert (_flag(ours, "--ddr-alpha"), _flag(ours, "--ald-alpha")) == ("1.0", "0.5")
    assert any(r.experiment == "dd-wmt14-ende-base-15-15-cad-crt-ald0.5" and r.label.startswith("variant")
               for r in _table("dd-t3").rows)
    out = _dry_run_lines(capsys, "show", "dd-wmt14-ende-base-15-15-cad-crt")
    assert "unweighted sum" in out and "joint model optimization" in out
    # p_net = 1.0: no cross-attention in layers 1..L_dr, also at inference - a reading, with the paper's words
    out = _dry_run_lines(capsys, "show", "dd-fig2-base-27-27-depth21-ratio1")
    assert "During the inference stage, both attentions are used" in out and "--cad-drop-ratio 1" in out
    text = tables_render("dd-fig2")
    assert "p_net 1†" in text and "During the inference stage, both attentions are used" in text
    from deepnmt_fairseq.modules import cross_attention_drop

    assert "During the inference stage" in cross_attention_drop.__doc__
    assert cross_attention_drop.layers_without_cross_attention(cross_attention_drop.drop_probabilities(4, 2, 1.0)) \
        == [True, True, False, False]


def test_bapna_tables_name_their_backbone_and_offer_both_norm_placements():
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY

    def normalize_before(arch):
        args = Namespace()
        ARCH_CONFIG_REGISTRY[arch](args)
        return args.encoder_normalize_before, getattr(args, "deep_memory", None)

    for key in ("bapna-t1", "bapna-t2"):
        t = _table(key)
        assert "does not state the norm placement" in t.note and "latest version of the Transformer base" in t.note
        for r in t.rows:
            argv = _train_argv(r.experiment)
            pre, memory = normalize_before(_flag(argv, "--arch"))
            assert pre == r.label.startswith("variant"), (key, r.label)  # the paper's rows: post-norm
            assert (memory == "transparent") == r.label.lower().startswith(("transparent", "variant (not in the "
                                                                                "paper): transparent")), r.label
        pre_rows = [r for r in t.rows if r.label.startswith("variant")]
        assert len(pre_rows) == 8
    assert _flag(_train_argv("transparent-wmt14-ende-baseline-prenorm-20L"), "--arch") == "prenorm_chen_wmt_base_20l"
    assert _flag(_train_argv("transparent-wmt14-ende-transparent-prenorm-20L"), "--arch") == \
        "transparent_prenorm_wmt_base_20l"


def test_msc_hiertrans_row_trains_the_hierarchical_baseline_with_msc_cnndm_recipe():
    (row,) = [r for r in _table("msc-t6").rows if r.label.startswith("HIERTRANS")]
    assert row.experiment == "msc-cnndm-hiertrans-36L" and row.paper["rouge1"] == 41.22
    assert "our readings" in row.note and "sentence-level" in row.note
    argv = _train_argv("msc-cnndm-hiertrans-36L")
    msc = _train_argv("msc-cnndm-36L")
    assert _flag(argv, "--arch") == "hiertrans_cnndm_36l"
    for flag in ("--lr", "--max-epoch", "--max-source-positions", "--label-smoothing", "--warmup-updates"):
        assert _flag(argv, flag) == _flag(msc, flag), flag  # the same Appendix A recipe as MSC (36 L)
    assert EXPS["msc-cnndm-hiertrans-36L"].eval == EXPS["msc-cnndm-36L"].eval
    text = tables_render("msc-t6")
    assert "msc-cnndm-hiertrans-36L" in text


# ------------------------------------------------------------------------------ issue 34: DeepNet and Admin rows
# Admin rows -> (GPUs of the script, arch, lr, dropout, max-epoch, max-update, tokens per update, beam, lenpen):
# Transformer-Clinic's wmt14_en-de.md / wmt14_en-fr.md ("admin 6l", "admin 60-12l") and microsoft/deepnmt's
# run_wmt14_en_fr.sh with their eval scripts
ADMIN_SCRIPTS = {
    "admin-wmt14-ende-6L-6L": (4, "admin_wmt_base_6_6", "0.001", "0.1", "100", "500000", 4 * 8192, 5, 1.0),
    "admin-wmt14-ende-60L-12L": (4, "admin_wmt_base_60_12", "0.001", "0.1", "100", "500000", 4 * 8192, 5, 1.0),
    "admin-wmt14-enfr-6L-6L": (8, "admin_wmt_base_6_6", "0.0007", "0.1", "50", "0", 8 * 8000 * 10, 5, 0.8),
    "admin-wmt14-enfr-60L-12L": (16, "admin_wmt_base_60_12", "0.001", "0.2", "50", "0", 16 * 3200 * 8, 10, 1.0),
    "admin-wmt14-enfr-60L-12L-clinic": (16, "admin_wmt_base_60_12", "0.0007", "0.1", "50", "0", 16 * 5000 * 16, 5,
                                        0.8),
}


@pytest.mark.parametrize("name", sorted(ADMIN_SCRIPTS))
def test_admin_rows_follow_the_authors_released_scripts(name):
    gpus, arch, lr, dropout, epochs, updates, tokens, beam, lenpen = ADMIN_SCRIPTS[name]
    argv = _train_argv(name, gpus=gpus)
    assert (_flag(argv, "--arch"), _flag(argv, "--optimizer"), _flag(argv, "--adam-betas"), _flag(argv, "--lr"),
            _flag(argv, "--warmup-updates"), _flag(argv, "--warmup-init-lr"), _flag(argv, "--dropout"),
            _flag(argv, "--attention-dropout"), _flag(argv, "--activation-dropout"), _flag(argv, "--weight-decay"),
            _flag(argv, "--clip-norm"), _flag(argv, "--max-epoch"), _flag(argv, "--max-update"),
            _flag(argv, "--seed")) == \
        (arch, "radam", "(0.9, 0.98)", lr, "8000", "1e-07", dropout, "0.1", "0.1", "0", "0", epochs, updates, "1111")
    # the script's own per-GPU batch and update frequency on its GPU count
    assert int(_flag(argv, "--max-tokens")) * int(_flag(argv, "--update-freq")) * gpus == tokens
    ev = EXPS[name].eval
    assert (ev.beam, ev.lenpen, ev.average) == (beam, lenpen, 10)
    notes = " ".join(v for s in EXPS[name].train_stages for _, v in s.recipe.notes)
    assert "RAdam" in notes and not re.search(r"(?<!R)Adam \(0\.9", notes)  # the note named the script's Adam


def test_deepnet_and_admin_rows_train_their_papers_settings(capsys):
    """DeepNet Table 1 rows: the DeepNorm architecture of each depth, DeepNet's huge-batch recipe
    (lr 1.5e-3, 4K warm-up, 128 x 4096 tokens, dropout 0.4, weight decay 1e-4, 100K updates); Admin's
    rows: the Admin architecture and the authors' released scripts (test below)."""
    from deepnmt_fairseq.models.architectures import PAPER_ROWS

    argv = _train_argv("deepnet-wmt-ende-100L-100L", gpus=8)
    assert (_flag(argv, "--arch"), _flag(argv, "--lr"), _flag(argv, "--warmup-updates"), _flag(argv, "--dropout"),
            _flag(argv, "--weight-decay"), _flag(argv, "--max-update")) == \
        ("deepnorm_wmt_base_100l", "0.0015", "4000", "0.4", "0.0001", "100000")
    assert int(_flag(argv, "--max-tokens")) * int(_flag(argv, "--update-freq")) * 8 == 128 * 4096
    assert PAPER_ROWS["deepnorm_wmt_base_100l"][0].startswith("DeepNet")
    rows = {r.experiment: r.paper.get("bleu") for r in _table("admin-t1").rows}
    assert rows["admin-wmt14-ende-60L-12L"] == 30.1 and rows["admin-wmt14-enfr-60L-12L"] == 43.8
    out = _dry_run_lines(capsys, "show", "deepnet-wmt-ende-18L-18L")
    assert "WMT-17" in out and "wmt14-en-de" in out  # the data difference is where a user sees it
