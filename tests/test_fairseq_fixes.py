"""The plugin's changes to fairseq: one table, exactly what is applied, undoable, switchable.

``deepnmt_fairseq/fairseq_fixes.py`` lists every fairseq (and torch) attribute the plugin
replaces.  These tests check that the table is the whole truth (no other fairseq attribute
changes when the fixes are installed), that uninstall() puts back every original object, that
``DEEPNMT_FAIRSEQ_FIXES`` and another fairseq version leave fairseq's behaviour alone while the
weights-only checkpoint safety stays on, that every test named in the table exists, and that
docs/reliability.md lists the same table.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import deepnmt_fairseq  # noqa: F401  (applies the fixes, as --user-dir does)
from deepnmt_fairseq import fairseq_fixes as ff

REPO = Path(__file__).resolve().parents[1]
ATTRIBUTE_ROWS = [f for f in ff.FIXES if f.attribute is not None]
SAFETY = {f.name for f in ff.FIXES if f.kind == "safety"}
BEHAVIOUR = {f.name for f in ff.FIXES if f.kind == "behaviour"}


@pytest.fixture
def restore_fixes():
    """Leave the process with the rows that were active before the test."""
    before = {f.name for f in ff.active()}
    yield
    ff.uninstall()
    ff.install(behaviour=True)
    ff.uninstall(names=[f.name for f in ff.FIXES if f.name not in before])
    assert {f.name for f in ff.active()} == before


def _fairseq_attributes():
    """{(module, "attr" or "Class.attr"): object} of every loaded fairseq module and class."""
    snap = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name in ("fairseq", "fairseq_cli") or name.startswith(("fairseq.", "fairseq_cli."))):
            continue
        for attr, value in list(vars(mod).items()):
            snap[(name, attr)] = value
            if isinstance(value, type) and value.__module__ == name:
                for cattr, cvalue in list(vars(value).items()):
                    snap[(name, f"{attr}.{cattr}")] = cvalue
    return snap


def test_the_table_lists_exactly_the_attributes_that_install_replaces(restore_fixes):
    ff.uninstall()
    assert ff.active() == ()
    before = _fairseq_attributes()
    allowed_before = set(torch.serialization.get_safe_globals())
    ff.install(behaviour=True)
    after = _fairseq_attributes()
    changed = {key for key in before if key in after and after[key] is not before[key]}
    assert changed == {(f.module, f.attribute) for f in ATTRIBUTE_ROWS}
    assert not {key for key in before if key not in after}, "install() removed a fairseq attribute"
    for f in ATTRIBUTE_ROWS:  # each replacement is the row's own (marked with its name)
        assert getattr(after[(f.module, f.attribute)], "_deepnmt_fairseq_fix") == f.name
    # the one change that is not an attribute: torch's allow-list grew by the fairseq classes
    allowed = set(torch.serialization.get_safe_globals())
    from deepnmt_fairseq.checkpoint_safety import safe_globals

    assert set(safe_globals()) <= allowed and allowed - allowed_before <= set(safe_globals())
    assert {f.name for f in ff.active()} == SAFETY | BEHAVIOUR


def test_uninstall_puts_back_every_original_object(restore_fixes):
    ff.uninstall()
    originals = {f.name: ff._current(*ff.resolve(f)) for f in ATTRIBUTE_ROWS}
    allowed = set(torch.serialization.get_safe_globals())
    ff.install(behaviour=True)
    patched = {f.name: ff._current(*ff.resolve(f)) for f in ATTRIBUTE_ROWS}
    for f in ATTRIBUTE_ROWS:
        assert patched[f.name] is not originals[f.name], f.name
        assert ff.original(f.name) is originals[f.name], f.name
    ff.install(behaviour=True)  # idempotent: nothing wrapped twice
    ff.install()
    assert {f.name: ff._current(*ff.resolve(f)) for f in ATTRIBUTE_ROWS} == patched
    ff.uninstall()
    for f in ATTRIBUTE_ROWS:  # the checkpoint loaders included
        assert ff._current(*ff.resolve(f)) is originals[f.name], f.name
    from fairseq import checkpoint_utils

    assert not hasattr(checkpoint_utils.load_checkpoint_to_cpu, "_deepnmt_safe")
    assert not hasattr(checkpoint_utils.load_ema_from_checkpoint, "_deepnmt_safe")
    assert set(torch.serialization.get_safe_globals()) == allowed
    assert ff.active() == ()


def test_behaviour_only_uninstall_keeps_the_safety(restore_fixes):
    ff.install(behaviour=True)
    ff.uninstall(kinds=("behaviour",))
    assert {f.name for f in ff.active()} == SAFETY
    ff.install(behaviour=True)
    assert {f.name for f in ff.active()} == SAFETY | BEHAVIOUR


# ---------------------------------------------------------------------------- fresh processes
PROBE = r"""
import importlib, json, sys, warnings
rows = json.loads(sys.argv[1])
import fairseq
if sys.argv[2]:
    fairseq.__version__ = sys.argv[2]
import torch

def current(module, attribute):
    owner = importlib.import_module(module)
    *path, attr = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    return vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)

before = {name: current(m, a) for name, m, a in rows}
allowed = set(torch.serialization.get_safe_globals())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import deepnmt_fairseq
    from deepnmt_fairseq import fairseq_fixes
print("RESULT", json.dumps({
    "replaced": sorted(name for name, m, a in rows if current(m, a) is not before[name]),
    "allow_listed": len(set(torch.serialization.get_safe_globals()) - allowed),
    "active": [f.name for f in fairseq_fixes.active()],
    "warnings": [f"{w.category.__name__}: {w.message}" for w in caught if "deepnmt" in str(w.message).lower()],
}))
"""


def _fresh_import(env_value=None, fake_version=""):
    env = {k: v for k, v in os.environ.items() if k != ff.ENV_VAR}
    if env_value is not None:
        env[ff.ENV_VAR] = env_value
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    rows = json.dumps([(f.name, f.module, f.attribute) for f in ATTRIBUTE_ROWS])
    res = subprocess.run([sys.executable, "-c", PROBE, rows, fake_version], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.split("RESULT ", 1)[1])


@pytest.mark.parametrize("value, off", [("0", BEHAVIOUR), ("-keep_last_batch,-cpu_c10d_ddp",
                                                          {"keep_last_batch", "cpu_c10d_ddp"})])
def test_env_var_switches_behaviour_fixes_off_but_never_the_safety(value, off):
    got = _fresh_import(value)
    attribute_safety = {f.name for f in ATTRIBUTE_ROWS if f.kind == "safety"}
    assert set(got["replaced"]) == attribute_safety | (BEHAVIOUR - off)
    assert set(got["active"]) == SAFETY | (BEHAVIOUR - off)
    assert got["allow_listed"] > 0
    assert got["warnings"] == []


def test_env_var_cannot_switch_the_safety_off():
    got = _fresh_import("0,-safe_load_checkpoint")
    assert set(got["active"]) == SAFETY
    assert any("ignored '-safe_load_checkpoint'" in w and "safety fixes cannot be switched off" in w
               for w in got["warnings"]), got["warnings"]


@pytest.mark.parametrize("env_value", [None, "force"])
def test_another_fairseq_version_warns_and_gets_only_the_safety(env_value):
    got = _fresh_import(env_value, fake_version="0.12.2")
    if env_value == "force":  # the user takes the risk: everything applied, no warning
        assert set(got["active"]) == SAFETY | BEHAVIOUR and got["warnings"] == []
        return
    assert set(got["replaced"]) == {f.name for f in ATTRIBUTE_ROWS if f.kind == "safety"}
    assert set(got["active"]) == SAFETY and got["allow_listed"] > 0
    assert len(got["warnings"]) == 1, got["warnings"]
    warning = got["warnings"][0]
    assert warning.startswith("FairseqVersionWarning: deepnmt_fairseq: fairseq 0.12.2 is not the version")
    assert "DEEPNMT_FAIRSEQ_FIXES=force" in warning and "DEEPNMT_FAIRSEQ_FIXES=0" in warning


def test_supported_versions():
    for v in ("0.12.3", "0.12.3.1", "0.12.3+cu118"):
        assert ff.version_supported(v), v
    for v in ("0.12.2", "0.12.30", "0.13.0", "1.0.0a0", "unknown", None):
        assert not ff.version_supported(v), v


def test_fixes_flag_lists_every_row_and_its_state():
    env = dict(os.environ, PYTHONPATH=str(REPO), **{ff.ENV_VAR: "-keep_last_batch"})
    res = subprocess.run([sys.executable, "-m", "deepnmt_fairseq", "--fixes"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("fairseq 0.12.3 (supported); DEEPNMT_FAIRSEQ_FIXES='-keep_last_batch'")
    states = {line.split()[2]: line.split()[0] for line in lines[1:]}
    assert states == {f.name: ("off" if f.name == "keep_last_batch" else "on") for f in ff.FIXES}
    plain = subprocess.run([sys.executable, "-m", "deepnmt_fairseq"], capture_output=True, text=True, env=env,
                           cwd=REPO, timeout=300)
    assert plain.stdout.strip() == str(REPO / "deepnmt_fairseq")  # the --user-dir output is unchanged


# ---------------------------------------------------------------------------- the table itself
def _test_ids(path: Path):
    """Names of the test functions (and Class::method) defined in a test file."""
    tree = ast.parse(path.read_text())
    ids = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            ids.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            ids |= {f"{node.name}::{n.name}" for n in node.body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")}
    return ids


def test_every_test_named_in_the_table_exists():
    assert len({f.name for f in ff.FIXES}) == len(ff.FIXES)
    for f in ff.FIXES:
        assert f.kind in ("safety", "behaviour"), f.name
        assert f.bug and "\n" not in f.bug and "|" not in f.bug, f.name
        path, _, test = f.test.partition("::")
        assert (REPO / path).is_file(), f.test
        assert re.sub(r"\[.*\]$", "", test) in _test_ids(REPO / path), f"{f.test} does not exist"


def test_reliability_doc_lists_the_table():
    doc = (REPO / "docs" / "reliability.md").read_text()
    section = doc.split("\n## The fixes to fairseq\n", 1)[1].split("\n## ", 1)[0]
    assert ff.markdown_table() in section, \
        "docs/reliability.md's table differs from fairseq_fixes.FIXES:\n" + ff.markdown_table()
    assert ff.ENV_VAR in section and "fairseq_fixes.py" in section


# ---------------------------------------------------------------------------- ddp_bypass_check
BYPASS_LAUNCHER = r"""
import sys
import deepnmt_fairseq
from deepnmt_fairseq import fairseq_fixes
fairseq_fixes.install()
from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion


class Direct:
    # model(**net_input) computed as model.decoder(model.encoder(...)): what a criterion does
    # that calls the parts directly (it gets the DDP wrapper, whose attributes reach the model)
    def __init__(self, model):
        self.model = model

    def __call__(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        encoder_out = self.model.encoder(src_tokens, src_lengths=src_lengths)
        return self.model.decoder(prev_output_tokens, encoder_out=encoder_out)

    def __getattr__(self, name):
        return getattr(self.model, name)


@register_criterion("deepnmt_test_bypass_ddp")
class BypassDDP(CrossEntropyCriterion):
    def forward(self, model, sample, reduce=True):
        return super().forward(Direct(model), sample, reduce=reduce)


from fairseq_cli.train import cli_main
sys.argv = ["fairseq-train"] + sys.argv[1:]
cli_main()
"""


@pytest.mark.slow
def test_c10d_criterion_that_bypasses_ddp_forward_is_stopped(data_bin, tmp_path):
    """Without the check both ranks train on their own gradients (no error, diverging replicas)."""
    from test_distributed import _argv, _free_port, _wait

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for _attempt in range(2):  # another process may take the free port before rank 0 binds it
        port, procs, logs = _free_port(), [], []
        for rank in range(2):
            argv = _argv(data_bin, tmp_path / "ckpt", ["--encoder-layers", "1", "--decoder-layers", "1"],
                         ["--criterion", "deepnmt_test_bypass_ddp"], 2, [
                             "--distributed-world-size", "2", "--distributed-rank", str(rank),
                             "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn",
                             "--distributed-backend", "gloo", "--ddp-backend", "c10d"])
            logs.append(tmp_path / f"rank{rank}.log")
            procs.append(subprocess.Popen([sys.executable, "-c", BYPASS_LAUNCHER, *argv], env=env,
                                          stdout=open(logs[-1], "w"), stderr=subprocess.STDOUT))
        results = _wait(procs, logs)
        if not any("Address already in use" in log for _rc, log in results):
            break
    for rank, (rc, log) in enumerate(results):
        assert rc != 0 and "DDPBypassError" in log, f"rank {rank} ({rc}):\n{log[-3000:]}"
        assert "BypassDDP computed the loss without calling the model through DistributedDataParallel" in log
        assert "--ddp-backend legacy_ddp" in log
    assert not (tmp_path / "ckpt" / "checkpoint_1_1.pt").exists()  # stopped before the first update


PREFETCH_SCRIPT = textwrap.dedent("""
    import torch
    import deepnmt_fairseq  # noqa: F401  (as --user-dir does)
    from fairseq.data import iterators

    class Busy:  # a data source that keeps the prefetch thread in torch code (GIL released)
        def __len__(self):
            return 1000

        def __iter__(self):
            x = torch.randn(256, 256)
            for i in range(1000):
                for _ in range(20):
                    x = torch.tanh(x @ x)
                yield i

    it = iterators.BufferedIterator(2, Busy())  # what fairseq-train's --data-buffer-size makes
    assert next(it) == 0
    print("left with the prefetch thread running", flush=True)
""")


@pytest.mark.parametrize("fixes", ["1", "0"])
def test_prefetch_thread_does_not_abort_the_exit(fixes, tmp_path):
    """A process that leaves fairseq's prefetch thread running (fairseq-train stopped by
    --max-update mid-epoch) exits 0 with the fix; fairseq's own thread is killed inside torch
    code during finalization and the process aborts with SIGABRT (measured: every run)."""
    script = tmp_path / "prefetch_exit.py"
    script.write_text(PREFETCH_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", DEEPNMT_FAIRSEQ_FIXES=fixes)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert "left with the prefetch thread running" in res.stdout, res.stderr[-2000:]
    if fixes == "1":
        assert res.returncode == 0, res.stderr[-2000:]
    else:  # the bug the fix is for (if fairseq ever fixes it, the row can go)
        assert res.returncode == -6 and "terminate called without an active exception" in res.stderr


RESUME_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from fairseq_cli.train import cli_main

    data, user_dir, work = sys.argv[1:4]

    def train(save, max_update):
        sys.argv = ["fairseq-train", data, "--user-dir", user_dir, "--arch", "deepnmt_transformer",
                    "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
                    "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings",
                    "--dropout", "0.1", "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "100",
                    "--required-batch-size-multiple", "1", "--max-update", str(max_update), "--seed", "1",
                    "--save-dir", save, "--save-interval-updates", "10", "--disable-validation", "--cpu",
                    "--num-workers", "0", "--no-progress-bar", "--log-format", "json", "--log-interval", "1"]
        cli_main()
        return torch.load(f"{save}/checkpoint_last.pt", weights_only=False)

    whole = train(f"{work}/whole", 40)
    part = train(f"{work}/part", 30)  # stopped at update 30, in a later epoch than the first
    resumed = train(f"{work}/part", 40)  # resumed from checkpoint_last.pt (update 30)
    diff = max((whole["model"][k] - resumed["model"][k]).abs().max().item() for k in whole["model"])
    print("RESULT " + json.dumps({"epoch_at_stop": part["extra_state"]["train_iterator"]["epoch"],
                                  "in_epoch": part["extra_state"]["train_iterator"]["iterations_in_epoch"],
                                  "max_param_diff": diff}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("fixes", ["1", "-resume_same_batches"])
def test_a_resumed_run_is_the_uninterrupted_run(fixes, data_bin, tmp_path):
    """fairseq-train stopped mid-epoch after its first epoch and resumed from checkpoint_last.pt
    ends with exactly the parameters of the same run uninterrupted.  Without the fix the resumed
    run cuts its batches with another seed and ends elsewhere (the bug the row is for)."""
    from fairseq_helpers import USER_DIR

    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", DEEPNMT_FAIRSEQ_FIXES=fixes)
    res = subprocess.run([sys.executable, str(script), str(data_bin), USER_DIR, str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.split("RESULT ")[-1])
    assert out["epoch_at_stop"] > 1 and out["in_epoch"] > 0, out  # the case of the bug: mid-epoch, epoch > 1
    if fixes == "1":
        assert out["max_param_diff"] == 0.0, out
    else:
        assert out["max_param_diff"] > 1e-4, out


PATIENCE_SCRIPT = textwrap.dedent("""
    import json, runpy, sys
    import torch

    data, user_dir, save, max_update, how = sys.argv[1:6]
    # --maximize-best-checkpoint-metric on the valid *loss*: while training lowers the loss no
    # validation is "better" than the first, so --patience 4 stops at the 5th validation
    # (update 10 with one every 2 updates), deterministically
    sys.argv = ["fairseq-train", data, "--user-dir", user_dir, "--arch", "deepnmt_transformer",
                "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
                "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings",
                "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "100",
                "--required-batch-size-multiple", "1", "--max-update", max_update, "--seed", "1",
                "--save-dir", save, "--save-interval-updates", "2", "--validate-interval-updates", "2",
                "--validate-interval", "1000",  # not at the epochs' ends (their updates depend on the data)
                "--patience", "4", "--best-checkpoint-metric", "loss", "--maximize-best-checkpoint-metric",
                "--cpu", "--num-workers", "0", "--no-progress-bar", "--log-format", "json", "--log-interval", "1"]
    if how == "python -m":  # the module runs as __main__, as `python -m fairseq_cli.train` runs it
        runpy.run_module("fairseq_cli.train", run_name="__main__", alter_sys=True)
    else:  # as the fairseq-train console script does
        from fairseq_cli.train import cli_main
        cli_main()
    last = torch.load(save + "/checkpoint_last.pt", weights_only=False)
    print("RESULT " + json.dumps({"updates": last["optimizer_history"][-1]["num_updates"],
                                  "state": last["extra_state"].get("deepnmt_should_stop_early")}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fairseq-train", "python -m"])
def test_a_resumed_run_stops_early_where_the_uninterrupted_run_stops(data_bin, tmp_path, how):
    """--patience across a resume: a run stopped at update 6 (3 validations, 2 without
    improvement) and resumed goes on counting from there and stops at update 10, as the same
    run uninterrupted does; fairseq alone would count afresh after the resume (update 16). Both
    as fairseq-train runs it and as ``python -m fairseq_cli.train`` does (the module is __main__)."""
    from fairseq_helpers import USER_DIR

    script = tmp_path / "patience.py"
    script.write_text(PATIENCE_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

    def train(save, max_update):
        res = subprocess.run([sys.executable, str(script), str(data_bin), USER_DIR, str(tmp_path / save),
                              str(max_update), how], capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        return json.loads(res.stdout.split("RESULT ")[-1])

    whole = train("whole", 40)
    assert whole["updates"] == 10 and whole["state"]["num_runs"] == 4
    part = train("part", 6)
    assert part["updates"] == 6 and part["state"] == {"best": whole["state"]["best"], "num_runs": 2}
    assert train("part", 40)["updates"] == 10  # resumed: stops where the uninterrupted run stopped


def test_early_stopping_state_lives_in_the_running_train_module_also_under_python_m(monkeypatch):
    """``python -m fairseq_cli.train`` runs the module as ``__main__``: its should_stop_early holds
    the state, not the one of an imported ``fairseq_cli.train`` (which would never validate)."""
    import importlib.machinery
    import sys
    import types

    import fairseq_cli.train as train
    from deepnmt_fairseq import behaviour_fixes as bf

    assert bf._should_stop_early() is train.should_stop_early  # fairseq-train: the console script imports it
    main = types.ModuleType("__main__")
    main.__spec__ = importlib.machinery.ModuleSpec("fairseq_cli.train", None)
    main.should_stop_early = lambda cfg, valid_loss: False
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert bf._should_stop_early() is main.should_stop_early


@pytest.mark.parametrize("start, restored", [("resume", True), ("continue_once", False), ("finetune", False),
                                             ("reset_meters", False), ("restore_file", True)])
def test_early_stopping_state_is_restored_only_when_the_run_resumes_itself(tmp_path, start, restored):
    """The state comes back when fairseq resumes the run (its checkpoint_last.pt, or --restore-file),
    not on a first launch from another run's checkpoint (--continue-once, --finetune-from-model:
    a stage 2 continuing stage 1 counts its own patience) nor after --reset-meters."""
    import types

    import fairseq_cli.train as train
    from deepnmt_fairseq import behaviour_fixes as bf

    if start in ("resume", "reset_meters"):
        (tmp_path / "checkpoint_last.pt").write_text("")
    cfg = types.SimpleNamespace(save_dir=str(tmp_path), restore_file="checkpoint_last.pt", reset_optimizer=False,
                                reset_meters=start == "reset_meters",
                                continue_once="/elsewhere/avg.pt" if start == "continue_once" else None,
                                finetune_from_model="/elsewhere/m.pt" if start == "finetune" else None)
    if start == "restore_file":
        cfg.restore_file = "/elsewhere/checkpoint_7.pt"
    extra = {bf.EARLY_STOP_KEY: {"best": 3.0, "num_runs": 3}}
    wrapped = bf._restore_early_stopping(lambda cfg, trainer, **kw: (extra, "itr"))
    train.should_stop_early.best, train.should_stop_early.num_runs = 9.0, 1  # left by an earlier run
    try:
        assert wrapped(cfg, types.SimpleNamespace(checkpoint_suffix="")) == (extra, "itr")
        state = (getattr(train.should_stop_early, "best", None), getattr(train.should_stop_early, "num_runs", None))
        assert state == ((3.0, 3) if restored else (None, None))
    finally:
        for attr in ("best", "num_runs"):
            if hasattr(train.should_stop_early, attr):
                delattr(train.should_stop_early, attr)


@pytest.mark.parametrize("extra, tpu", [([], False), (["--tpu"], True)])
def test_bf16_does_not_turn_on_tpu_mode(extra, tpu):
    """``--bf16`` keeps a run on its CUDA/CPU device: fairseq's parser implies ``--tpu``, whose
    trainer then fails without torch_xla ("'NoneType' object has no attribute 'xla_device'",
    seen on an H100); an explicit ``--tpu`` is kept.  fairseq's own parser shows the bug."""
    from fairseq import options

    argv = ["data-bin", "--arch", "transformer", "--task", "translation", "--bf16", *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    assert args.bf16 and args.tpu is tpu
    raw = ff.original("bf16_on_gpu")(options.get_training_parser(), argv)
    assert raw.tpu is True  # the bug the fix is for (if fairseq ever fixes it, the row can go)
