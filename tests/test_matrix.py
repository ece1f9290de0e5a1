"""Configuration matrix: every architecture family and feature combination, end to end.

Each combination goes through the whole user chain at tiny size:
``fairseq-train`` 2 updates -> save -> resume from ``checkpoint_last.pt`` for 1 more
update -> ``fairseq-generate`` beam 1 and beam 4 -> ``fairseq-interactive`` ->
``fairseq-validate``.  Zero crashes, every sentence translated.

Cost: a fairseq CLI start is ~5 s of imports, so most of the matrix runs the same
``cli_main`` functions the console scripts call, in-process, inside two worker processes
(this file is also the worker: ``python tests/test_matrix.py PLAN.json``).  Two
combinations (a named MSC architecture and CAD with the collapse-reducing criterion) run
the real console scripts, and every named architecture is built and trained for one step
in-process.  Refused combinations (docs/mechanisms.md, GPKD section) must fail with an error that
names the conflicting options.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from fairseq_helpers import USER_DIR, build_model, random_batch, run_cli, tiny_model_flags

N_TEST = 10  # sentences in the data_bin fixture's test split (tests/conftest.py)
INTERACTIVE_INPUT = "the cat sees a dog\n\nzzz unknown qqq\nbig red house runs over the tree\n"

TINY = [*map(str, tiny_model_flags()), "--share-all-embeddings", "--dropout", "0.1"]
CRT = ["--criterion", "collapse_reducing", "--label-smoothing", "0.1"]

# name -> (arch, model flags, criterion flags).  Every memory type, norm, MSC variant and
# stochastic feature appears at least once; features are combined to keep the count down
# (each chain costs ~6 fairseq CLI runs), the isolated variants are covered in-process by
# tests/test_exactness.py and tests/test_deep_transformer.py.
COMBOS = {
    "prenorm-rpr-layerdrop": ("deepnmt_transformer", ["--encoder-layers", "3", "--decoder-layers", "2",
                                                      "--rpr-max-relative-position", "2", "--rpr-values",
                                                      "--encoder-layerdrop", "0.3", "--decoder-layerdrop", "0.3"],
                              []),
    "postnorm-ssl-sublayer": ("deepnmt_transformer", ["--post-norm", "--encoder-layers", "4", "--decoder-layers",
                                                      "2", "--ssl-rate", "0.4", "--ssl-decoder"], []),
    "msc-gate-everything": ("deepnmt_transformer", ["--deep-memory", "msc", "--msc-block-layers", "2",
                                                    "--decoder-layers", "2", "--gp-group-size", "2", "--ssl-rate",
                                                    "0.4", "--ssl-decoder", "--rpr-max-relative-position", "2",
                                                    "--cad-drop-depth", "1", "--cad-drop-ratio", "0.5",
                                                    "--encoder-layerdrop", "0.2"],
                            [*CRT, "--ddr-alpha", "1.0", "--ald-alpha", "0.5"]),
    "msc-add-no-encoder-context": ("deepnmt_transformer", ["--deep-memory", "msc", "--msc-block-layers", "1,2",
                                                           "--decoder-layers", "2", "--msc-fusion", "add",
                                                           "--msc-no-encoder-context"], []),
    "msc-ffn-cell-postnorm": ("deepnmt_transformer", ["--deep-memory", "msc", "--msc-block-layers", "2",
                                                      "--decoder-layers", "2", "--msc-context-cell", "ffn",
                                                      "--post-norm"], []),
    # no context cell + Stochastic Layers whose second stage starts at update 2, i.e. across the resume
    "msc-no-ctx-ssl-layer-two-stage": ("deepnmt_transformer", ["--deep-memory", "msc", "--msc-block-layers", "2",
                                                               "--decoder-layers", "2", "--msc-context-cell", "none",
                                                               "--ssl-rate", "0.4", "--ssl-mode", "layer",
                                                               "--ssl-start-update", "2"], []),
    "transparent-gp": ("deepnmt_transformer", ["--deep-memory", "transparent", "--encoder-layers", "4",
                                               "--decoder-layers", "2", "--gp-group-size", "2",
                                               "--gp-decoder-group-size", "2"], []),
    "transparent-postnorm-cad-ddr": ("deepnmt_transformer", ["--deep-memory", "transparent", "--post-norm",
                                                             "--encoder-layers", "3", "--decoder-layers", "3",
                                                             "--cad-drop-depth", "2", "--cad-drop-ratio", "0.5"],
                                     [*CRT, "--ddr-alpha", "1.0", "--ald-alpha", "0"]),
    "dlcl-cad-ssl": ("deepnmt_transformer", ["--deep-memory", "dlcl", "--encoder-layers", "3", "--decoder-layers",
                                             "2", "--cad-drop-depth", "1", "--cad-drop-ratio", "0.5", "--ssl-rate",
                                             "0.4"], []),
    "cad-full-ald": ("deepnmt_transformer", ["--encoder-layers", "2", "--decoder-layers", "3", "--cad-drop-depth",
                                             "1", "--cad-drop-ratio", "1.0"],
                     [*CRT, "--ddr-alpha", "0", "--ald-alpha", "0.5", "--encoder-l2", "1e-5"]),
    # CAD's literal reading (--cad-reading literal): layer 3 (above the drop depth) never uses its
    # cross-attention in training, every layer uses it at inference (beam search reorders it)
    "cad-literal-ddr": ("deepnmt_transformer", ["--encoder-layers", "2", "--decoder-layers", "3", "--cad-drop-depth",
                                                "2", "--cad-drop-ratio", "0.5", "--cad-reading", "literal"],
                        [*CRT, "--ddr-alpha", "1.0", "--ald-alpha", "0"]),
    # DeepNorm and Admin alone, and each with MSC, transparent attention, CAD + CRT, GP + SSL + RPR
    "deepnorm": ("deepnmt_transformer", ["--deepnorm", "--encoder-layers", "3", "--decoder-layers", "2"], []),
    "admin": ("deepnmt_transformer", ["--admin", "--encoder-layers", "3", "--decoder-layers", "2"], []),
    "deepnorm-msc-cad-crt": ("deepnmt_transformer", ["--deepnorm", "--deep-memory", "msc", "--msc-block-layers", "2",
                                                     "--decoder-layers", "2", "--cad-drop-depth", "1",
                                                     "--cad-drop-ratio", "0.5"], [*CRT]),
    "deepnorm-transparent-gp-ssl-rpr": ("deepnmt_transformer", ["--deepnorm", "--deep-memory", "transparent",
                                                                "--encoder-layers", "4", "--decoder-layers", "2",
                                                                "--gp-group-size", "2", "--ssl-rate", "0.4",
                                                                "--rpr-max-relative-position", "2"], []),
    "admin-msc-gp-ssl-rpr": ("deepnmt_transformer", ["--admin", "--deep-memory", "msc", "--msc-block-layers", "2",
                                                     "--decoder-layers", "2", "--gp-group-size", "2", "--ssl-rate",
                                                     "0.4", "--ssl-decoder", "--rpr-max-relative-position", "2"], []),
    "admin-transparent-cad-crt": ("deepnmt_transformer", ["--admin", "--deep-memory", "transparent",
                                                          "--encoder-layers", "3", "--decoder-layers", "3",
                                                          "--cad-drop-depth", "2", "--cad-drop-ratio", "0.5"],
                                  [*CRT, "--ddr-alpha", "1.0", "--ald-alpha", "0.5"]),
    # HIERTRANS (MSC Table 6's hierarchical baseline, --arch hiertrans): sentence- and document-level
    # encoders, fairseq's standard decoder reading both levels; 'the' and 'a' end sentences here
    "hiertrans": ("hiertrans", ["--encoder-layers", "2", "--document-layers", "2", "--decoder-layers", "2",
                                "--sentence-end-symbols", "the a"], []),
    # named architectures with tiny dimensions (flags win over the names' defaults)
    "named-msc_iwslt_6l": ("msc_iwslt_6l", ["--encoder-layers", "2", "--decoder-layers", "2"], []),
    # --cad-drop-depth given: the name derives it from its own 24 layers (test_named_cad_architecture...)
    "named-dd_base_6_24_cad": ("dd_base_6_24_cad", ["--encoder-layers", "2", "--decoder-layers", "3",
                                                    "--cad-drop-depth", "2"], [*CRT]),
}

# the DESDAR-like student: deep-encoder/shallow-decoder teacher with GP -> extracted student
TEACHER = ("deepnmt_transformer", ["--encoder-layers", "4", "--decoder-layers", "2", "--gp-group-size", "2",
                                   "--gp-decoder-group-size", "2", "--rpr-max-relative-position", "2",
                                   "--ssl-rate", "0.4"])
# the student keeps its teacher's SSL (its checkpoint carries the SSL schedule state)
STUDENT = ["--encoder-layers", "2", "--decoder-layers", "1", "--rpr-max-relative-position", "2", "--ssl-rate", "0.4"]

CLI_COMBOS = ("named-msc_iwslt_6l",)  # runs the real console scripts


# ---------------------------------------------------------------------------- argv builders
def train_argv(data, save_dir, arch, flags, crit=(), max_update=2, extra=()):
    return [
        str(data), "--user-dir", USER_DIR, "--task", "translation", "--arch", arch, *TINY, *flags,
        "--optimizer", "adam", "--lr", "0.001", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
        "--max-tokens", "500", "--max-update", str(max_update), "--save-dir", str(save_dir),
        "--no-progress-bar", "--log-format", "json", "--log-interval", "1", "--seed", "1", "--cpu",
        "--num-workers", "0", "--no-epoch-checkpoints",
        *(crit or ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]), *extra,
    ]


def generate_argv(data, ckpt, beam):
    # default --required-batch-size-multiple (8) on purpose: reliability keeps the last batch
    return [str(data), "--user-dir", USER_DIR, "--path", str(ckpt), "--gen-subset", "test", "--beam", str(beam),
            "--batch-size", "4", "--max-len-b", "12", "--cpu", "--no-progress-bar"]


def interactive_argv(data, ckpt, input_file):
    return [str(data), "--user-dir", USER_DIR, "--path", str(ckpt), "--source-lang", "src", "--target-lang", "tgt",
            "--beam", "2", "--buffer-size", "2", "--batch-size", "2", "--max-len-b", "12", "--cpu",
            "--input", str(input_file)]


def validate_argv(data, ckpt):
    return [str(data), "--user-dir", USER_DIR, "--path", str(ckpt), "--task", "translation",
            "--valid-subset", "valid", "--max-tokens", "500", "--cpu", "--no-progress-bar"]


def chain(name, data, work, arch, flags, crit=(), first=None):
    """The steps of one combination: (step name, kind, argv)."""
    save = work / name
    ckpt = save / "checkpoint_last.pt"
    steps = list(first or [])
    if not first:
        steps.append(("train", "train", train_argv(data, save, arch, flags, crit, 2)))
    steps += [
        ("resume", "train", train_argv(data, save, arch, flags, crit, 3)),
        ("generate-beam1", "generate", generate_argv(data, ckpt, 1)),
        ("generate-beam4", "generate", generate_argv(data, ckpt, 4)),
        ("interactive", "interactive", interactive_argv(data, ckpt, work / "interactive.txt")),
        ("validate", "validate", validate_argv(data, ckpt)),
    ]
    return steps


def student_chain(data, work):
    arch, tflags = TEACHER
    teacher = work / "teacher" / "checkpoint_last.pt"
    student = work / "student.pt"
    save = work / "desdar-student"
    first = [
        ("teacher-train", "train", train_argv(data, work / "teacher", arch, tflags, (), 2)),
        ("extract", "extract", ["--teacher", str(teacher), "--encoder-group-size", "2", "--decoder-group-size", "2",
                                "--output", str(student), "--overwrite"]),
        ("student-generate", "generate", generate_argv(data, student, 4)),
        ("train", "train", train_argv(data, save, "deepnmt_transformer", STUDENT, (), 2,
                                      ["--restore-file", str(student), "--reset-optimizer", "--reset-lr-scheduler",
                                       "--reset-meters", "--reset-dataloader"])),
    ]
    return chain("desdar-student", data, work, "deepnmt_transformer", STUDENT, (), first=first)


# refused combinations (docs/mechanisms.md, GPKD section, plus --rpr-values with MSC's context-fusing encoder
# layers): name -> (kind, model flags, words the error must contain)
REFUSED = {
    "gp-group-size-vs-msc-block": (
        "train", ["--deep-memory", "msc", "--msc-block-layers", "3", "--decoder-layers", "2", "--gp-group-size", "2"],
        ["--gp-group-size", "MSC block"]),
    "gp-decoder-group-size-with-msc": (
        "train", ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                  "--gp-decoder-group-size", "2"], ["--gp-decoder-group-size", "--deep-memory msc"]),
    "rpr-with-cross-self-attention": (
        "train", ["--encoder-layers", "1", "--decoder-layers", "1", "--rpr-max-relative-position", "2",
                  "--cross-self-attention"], ["--rpr-max-relative-position", "--cross-self-attention"]),
    "rpr-values-with-msc-encoder-context": (
        "train", ["--deep-memory", "msc", "--msc-block-layers", "1", "--decoder-layers", "2",
                  "--rpr-max-relative-position", "2", "--rpr-values"], ["--rpr-values", "--deep-memory msc"]),
    "dlcl-post-norm": ("train", ["--deep-memory", "dlcl", "--post-norm", "--encoder-layers", "2", "--decoder-layers",
                                 "1"], ["--deep-memory dlcl", "--post-norm"]),
    "deepnorm-with-admin": ("train", ["--deepnorm", "--admin", "--encoder-layers", "1", "--decoder-layers", "1"],
                            ["--deepnorm", "--admin"]),
    "deepnorm-pre-norm": ("train", ["--deepnorm", "--encoder-normalize-before", "--encoder-layers", "1",
                                    "--decoder-layers", "1"], ["--deepnorm", "--encoder-normalize-before"]),
    "admin-dlcl": ("train", ["--admin", "--deep-memory", "dlcl", "--encoder-layers", "2", "--decoder-layers", "1"],
                   ["--admin", "--deep-memory dlcl"]),
    # extraction refusals: (teacher combination, deepnmt-extract-student flags)
    "extract-msc-decoder": ("extract", ("msc-add-no-encoder-context", ["--decoder-group-size", "2"]),
                            ["MSC decoder", "cannot be compressed"]),
    "extract-dlcl-encoder": ("extract", ("dlcl-cad-ssl", ["--encoder-layers-select", "1"]),
                             ["DLCL encoder", "--deep-memory dlcl", "cannot be compressed"]),
}


def plan(data, work):
    """All in-process combinations, as {combo: [steps]}."""
    out = {name: chain(name, data, work, arch, flags, crit)
           for name, (arch, flags, crit) in COMBOS.items() if name not in CLI_COMBOS}
    out["desdar-student"] = student_chain(data, work)
    refused = {}
    for name, (kind, flags, _words) in REFUSED.items():
        if kind == "train":
            refused[name] = [("refused", "train", train_argv(data, work / name, "deepnmt_transformer", flags))]
        else:  # needs a trained checkpoint: the named combination's, after it trained
            combo, extract_flags = flags
            teacher = work / combo / "checkpoint_last.pt"
            refused[name] = [("refused", "extract", ["--teacher", str(teacher), *extract_flags,
                                                     "--output", str(work / f"{name}-student.pt")])]
    return out, refused


# ---------------------------------------------------------------------------- the worker
_MODULES = {"train": "fairseq_cli.train", "generate": "fairseq_cli.generate", "preprocess": "fairseq_cli.preprocess",
            "interactive": "fairseq_cli.interactive", "validate": "fairseq_cli.validate",
            "extract": "deepnmt_cli.extract_student"}


def _execute(kind, argv, out_path):
    """Run one fairseq CLI in this process as its console script would; stdout, stderr and
    the log go to ``out_path``."""
    from fairseq import checkpoint_utils

    module = importlib.import_module(_MODULES[kind]) if kind in _MODULES else None
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    with open(out_path, "w") as out:
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter("%(levelname)s | %(name)s | %(message)s"))
        root.handlers = [handler]
        root.setLevel(logging.INFO)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                if kind == "truncate":  # test helper: the first third of a file (a save cut short)
                    data = Path(argv[0]).read_bytes()
                    Path(argv[1]).write_bytes(data[: len(data) // 3])
                    return
                if kind == "extract":
                    rc = module.main(argv)
                    if rc:
                        raise RuntimeError(f"deepnmt-extract-student exited with {rc}")
                    return
                if kind == "train" and hasattr(checkpoint_utils.save_checkpoint, "best"):
                    del checkpoint_utils.save_checkpoint.best  # a fresh process has no best yet
                if kind in ("generate", "validate"):
                    # data loading in this process: in one long-lived interpreter, from the third
                    # DataLoader with a worker process on, each call waited 5 s more (0.4 s of
                    # work; measured 2026-11-28). The console scripts (test_real_cli_chain) keep
                    # fairseq's default loader workers.
                    argv = [*argv, "--num-workers", "0"]
                sys.argv = [f"fairseq-{kind}", *argv]
                try:
                    module.cli_main()
                except SystemExit as e:
                    if e.code not in (0, None):
                        raise RuntimeError(f"fairseq-{kind} exited with {e.code}") from e
        finally:
            root.handlers = saved_handlers
            root.setLevel(saved_level)


def run_plan(plan_file):
    """Worker entry point: run every combination's steps, stop a combination at its first failure."""
    spec = json.loads(Path(plan_file).read_text())
    import deepnmt_fairseq  # noqa: F401
    from deepnmt_fairseq import fairseq_fixes

    behaviour = {f.name for f in fairseq_fixes.FIXES if f.kind == "behaviour"}
    installed_by_import = behaviour <= {f.name for f in fairseq_fixes.active()}  # does importing the plugin turn the guards on?
    fairseq_fixes.install()
    results = {"_worker": {"installed_by_import": installed_by_import}}
    for combo, steps in spec["combos"].items():
        res = results[combo] = {}
        for step, kind, argv in steps:
            out = Path(spec["work"]) / f"{combo}.{step}.out"
            t0, c0 = time.time(), time.process_time()
            try:
                _execute(kind, argv, out)
                res[step] = {"ok": True, "out": str(out)}
            except BaseException as err:  # noqa: BLE001 - every failure is a result
                res[step] = {"ok": False, "out": str(out), "error": f"{type(err).__name__}: {err}",
                             "trace": traceback.format_exc()[-3000:]}
            res[step]["seconds"] = round(time.time() - t0, 2)
            res[step]["cpu_seconds"] = round(time.process_time() - c0, 2)
            print(f"[matrix] {combo} {step}: {'ok' if res[step]['ok'] else 'FAILED'} "
                  f"({res[step]['seconds']} s)", file=sys.__stderr__, flush=True)
            if not res[step]["ok"] and not spec.get("continue", False):
                break
    Path(spec["results"]).write_text(json.dumps(results, indent=1))
    print(f"[matrix] worker done: {time.process_time():.0f} CPU seconds", file=sys.__stderr__, flush=True)


def _start_worker(work, combos, tag, continue_on_error=False):
    plan_file = work / f"plan-{tag}.json"
    results = work / f"results-{tag}.json"
    plan_file.write_text(json.dumps({"combos": combos, "work": str(work), "results": str(results),
                                     "continue": continue_on_error}, default=str))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, __file__, str(plan_file)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    return proc, results


def _finish(proc, results, timeout=900):
    log, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0 and results.exists(), log[-5000:]
    return json.loads(results.read_text())


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def matrix(data_bin, tmp_path_factory):
    """Run the whole in-process matrix in two parallel workers (2 cores); {combo: {step: result}}."""
    work = tmp_path_factory.mktemp("matrix")
    (work / "interactive.txt").write_text(INTERACTIVE_INPUT)
    combos, refused = plan(data_bin, work)
    names = list(combos)
    halves = [{n: combos[n] for n in names[0::2]}, {n: combos[n] for n in names[1::2]}]
    # the refused combinations run last in the worker that trains the MSC model they need
    msc = next(i for i, h in enumerate(halves) if "msc-add-no-encoder-context" in h)
    halves[msc].update(refused)
    workers = [_start_worker(work, half, f"w{i}") for i, half in enumerate(halves)]
    results = {}
    for proc, res in workers:
        results.update(_finish(proc, res))
    results.pop("_worker")
    return results


def _text(result):
    return Path(result["out"]).read_text()


def _hyps(text):
    return [line for line in text.splitlines() if line.startswith("H-")]


def _updates(text):
    """num_updates of every logged training step (json log format)."""
    return [int(json.loads(m)["num_updates"]) for m in re.findall(r"train_inner\W+(\{.*\})", text)]


def check_chain(results, name):
    """The assertions every combination must pass (used for in-process and CLI runs)."""
    res = results[name]
    failed = {k: v for k, v in res.items() if not v["ok"]}
    assert not failed, {k: (v["error"], v.get("trace", "")[-1500:]) for k, v in failed.items()}
    assert set(res) >= {"train", "resume", "generate-beam4", "interactive", "validate"}
    assert _updates(_text(res["train"]))[-1] == 2
    resume = _text(res["resume"])
    assert re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ 2 updates\)", resume)
    assert _updates(resume) == [3], "the resumed run continues at update 3, not from scratch"
    for beam in [b for b in ("generate-beam1", "generate-beam4") if b in res]:
        hyps = _hyps(_text(res[beam]))
        assert len(hyps) == N_TEST, f"{beam}: {len(hyps)} of {N_TEST} test sentences translated"
        ids = sorted(int(h.split("\t")[0][2:]) for h in hyps)
        assert ids == list(range(N_TEST))
        assert all(math.isfinite(float(h.split("\t")[1])) for h in hyps)
    inter = _text(res["interactive"])
    n_in = len(INTERACTIVE_INPUT.splitlines())
    assert len(_hyps(inter)) == n_in, inter[-2000:]  # empty line and unknown words included
    assert "S-2\t<unk> <unk> <unk>" in inter
    val = _text(res["validate"])
    m = re.search(r"valid on 'valid' subset \| loss ([0-9.]+)", val)
    assert m and math.isfinite(float(m.group(1))), val[-2000:]


# ---------------------------------------------------------------------------- tests
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in COMBOS if n not in CLI_COMBOS])
def test_combination_trains_resumes_generates_validates(matrix, name):
    check_chain(matrix, name)
    assert "generate-beam1" in matrix[name]


@pytest.mark.slow
def test_ssl_two_stage_switches_on_across_the_resume(matrix):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    name = "msc-no-ctx-ssl-layer-two-stage"
    check_chain(matrix, name)
    state = load_checkpoint(str(Path(matrix[name]["resume"]["out"]).parent / name / "checkpoint_last.pt"))
    assert bool(state["model"]["encoder.ssl_active"])  # switched on at update 2, saved at update 3


@pytest.mark.slow
def test_collapse_reducing_terms_are_logged(matrix):
    ald = _text(matrix["cad-full-ald"]["train"])
    assert '"ald_loss"' in ald and '"ddr_loss"' not in ald and '"encoder_l2"' in ald
    ddr = _text(matrix["transparent-postnorm-cad-ddr"]["train"])
    assert '"ddr_loss"' in ddr and '"ald_loss"' not in ddr
    for name in ("msc-gate-everything", "named-dd_base_6_24_cad"):
        text = _text(matrix[name]["train"])
        assert '"ald_loss"' in text and '"ddr_loss"' in text, name


@pytest.mark.slow
def test_desdar_student_is_extracted_decoded_and_trained(matrix):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    check_chain(matrix, "desdar-student")
    res = matrix["desdar-student"]
    assert len(_hyps(_text(res["student-generate"]))) == N_TEST
    student = load_checkpoint(str(Path(res["train"]["out"]).parent / "student.pt"))
    cfg = student["cfg"]["model"]
    assert (cfg.encoder_layers, cfg.decoder_layers, cfg.gp_group_size) == (2, 1, 1)
    assert re.search(r"Loaded checkpoint \S+student\.pt", _text(res["train"]))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_combination_names_the_conflicting_options(matrix, name):
    res = matrix[name]["refused"]
    assert not res["ok"], f"{name} was accepted"
    message = res["error"] + "\n" + _text(res)
    for word in REFUSED[name][2]:
        assert word in message, (word, res["error"])


@pytest.mark.slow
def test_extract_msc_refusal_names_the_flag(matrix):
    assert "--decoder-group-size" in _text(matrix["extract-msc-decoder"]["refused"])


@pytest.mark.slow
def test_refused_combination_through_the_real_cli(data_bin, tmp_path):
    flags = REFUSED["rpr-with-cross-self-attention"][1]
    res = run_cli("fairseq-train", *train_argv(data_bin, tmp_path, "deepnmt_transformer", flags), check=False)
    assert res.returncode != 0
    assert "--rpr-max-relative-position cannot be combined with --cross-self-attention" in res.stderr
    assert not (tmp_path / "checkpoint_last.pt").exists()


@pytest.mark.slow
def test_real_cli_chain(data_bin, tmp_path):
    """The same chain through the installed console scripts, as a user runs it."""
    (tmp_path / "interactive.txt").write_text(INTERACTIVE_INPUT)
    results = {}
    for name in CLI_COMBOS:
        arch, flags, crit = COMBOS[name]
        res = results[name] = {}
        for step, kind, argv in chain(name, data_bin, tmp_path, arch, flags, crit):
            if step == "generate-beam1":  # beam 1 runs in-process for every other combination (saves a start)
                continue
            out = tmp_path / f"{name}.{step}.out"
            if kind == "generate":  # stock fairseq (no reliability guard) drops the last partial batch
                argv = [*argv, "--required-batch-size-multiple", "1"]
            proc = run_cli(f"fairseq-{kind}", *argv, check=False)
            out.write_text(proc.stdout + proc.stderr)
            res[step] = {"ok": proc.returncode == 0, "out": str(out), "error": proc.stderr[-3000:]}
        check_chain(results, name)


# ---------------------------------------------------------------------------- in-process, fast
def _named_architectures():
    import deepnmt_fairseq  # noqa: F401
    from fairseq.models import ARCH_MODEL_REGISTRY

    from deepnmt_fairseq.models.deep_transformer import MODEL_NAME

    return sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__name__ == "DeepTransformerModel" and a != MODEL_NAME)


NARROW = ["--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-ffn-embed-dim", "16",
          "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


@pytest.mark.parametrize("arch", _named_architectures())
def test_named_architecture_builds_and_steps_at_tiny_width(arch):
    """Each name keeps its depth and features (only widths are overridden) and takes a
    training step with every parameter in the graph, then runs in eval mode."""
    import torch

    model = build_model(arch, NARROW, vocab=24).train()
    src, lens, tgt = random_batch(model, bsz=2, src_len=5, tgt_len=4)
    torch.manual_seed(0)
    out, _ = model(src, lens, tgt)
    out.float().log_softmax(-1).mean().backward()
    assert torch.isfinite(out).all()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing[:5]
    with torch.no_grad():
        assert torch.isfinite(model.eval()(src, lens, tgt)[0]).all()


def test_named_architectures_are_all_covered():
    names = _named_architectures()
    assert len(names) >= 40  # MSC, transparent, deep-decoder and GPKD tables
    for family in ("msc_iwslt_", "prenorm_iwslt_", "postnorm_iwslt_", "transparent_iwslt_", "msc_wmt_",
                   "transparent_wmt_", "postnorm_wmt_", "dd_base_", "dd_big_", "rpr_", "desdar_", "gpkd_student_"):
        assert any(n.startswith(family) for n in names), family


def test_named_cad_architecture_with_fewer_decoder_layers():
    model = build_model("dd_base_6_24_cad", NARROW + ["--encoder-layers", "2", "--decoder-layers", "3"], vocab=24)
    assert 1 <= sum(p > 0 for p in model.decoder.cad_probs) <= 3


if __name__ == "__main__":
    run_plan(sys.argv[1])
