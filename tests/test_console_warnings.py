"""Clean console: the known-harmless third-party warnings (deepnmt_fairseq/console.py) are
hidden in the project's own entry points and nowhere else.

* every warning of the list is still raised by the real hydra/torch/fairseq code (so the list
  stays a measurement, not folklore) and each filter, in-process and as PYTHONWARNINGS,
  hides exactly it: the mask-dtype warning and an unrelated UserWarning stay visible;
* importing the plugin installs no filter (``fairseq-train --user-dir`` shows everything);
* an entry point that starts fairseq (deepnmt-skd) prints none of them, while the same
  fairseq-generate run directly still does.
"""

import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from deepnmt_fairseq import console
from fairseq_helpers import generate, run_cli, tiny_model_flags, train

# reproduces each warning of console.KNOWN through the code path fairseq takes, then two
# warnings that must stay visible
TRIGGER = textwrap.dedent('''
    import sys, warnings
    if sys.argv[1:] == ["quiet"]:
        from deepnmt_fairseq.console import quiet_known_warnings
        quiet_known_warnings()
    import torch
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks.fairseq_task import FairseqTask

    # every fairseq CLI: argparse args -> hydra config (the six hydra warnings)
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["data", "--arch", "transformer", "--task", "translation"])
    convert_namespace_to_omegaconf(args)
    # fairseq's batch iterators: DataLoader(pin_memory=True)
    list(torch.utils.data.DataLoader([1, 2], pin_memory=True))
    # FairseqTask.train_step: torch.cuda.amp.autocast(enabled=False)
    class Model(torch.nn.Linear):
        def set_num_updates(self, n):
            pass
    class Criterion:
        def __call__(self, model, sample):
            return torch.zeros((), requires_grad=True), 1, {}
    class Optimizer:
        def backward(self, loss):
            loss.backward()
    FairseqTask.train_step(FairseqTask.__new__(FairseqTask), {}, Model(1, 1), Criterion(), Optimizer(), 0)
    # not filtered: a bool padding mask with a float attention mask, and anything else
    q = torch.zeros(3, 2, 4)
    torch.nn.MultiheadAttention(4, 1)(q, q, q, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool),
                                      attn_mask=torch.zeros(3, 3))
    warnings.warn("an unrelated UserWarning")
    print("trigger done")
''')

MASK_WARNING = "Support for mismatched key_padding_mask and attn_mask"


def printed(known, text: str) -> bool:
    pattern = known.message[3:] if known.message.startswith(r"\s*") else known.message
    return re.search(pattern, text) is not None


def expected(known) -> bool:
    """pin_memory only warns on a machine without an accelerator."""
    return not (known.name == "pin-memory-no-accelerator" and torch.cuda.is_available())


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", console.ENV_VAR)}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def trigger(tmp_path_factory):
    path = tmp_path_factory.mktemp("warnings") / "trigger.py"
    path.write_text(TRIGGER)

    def run(*args, env=None):
        res = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                             env=env or clean_env(), timeout=300)
        assert res.returncode == 0 and "trigger done" in res.stdout, res.stderr[-4000:]
        return res.stderr

    return run


# ----------------------------------------------------------------- the list itself
def test_every_pythonwarnings_entry_is_valid_and_specific():
    names = [k.name for k in console.KNOWN]
    assert len(names) == len(set(names))
    for entry in console.pythonwarnings_entries():
        assert "," not in entry and entry.count(":") <= 4, entry
        action, message, category, module = (entry.split(":") + [""] * 5)[:4]
        assert action == "ignore" and category in ("UserWarning", "FutureWarning"), entry
        assert message or module, f"blanket filter: {entry}"  # never 'ignore::UserWarning'
        with warnings.catch_warnings():
            warnings._setoption(entry)  # what Python does with PYTHONWARNINGS; raises if malformed
    for k in console.KNOWN:
        re.compile(k.message)
        assert not printed(k, MASK_WARNING) and not printed(k, "an unrelated UserWarning")


def test_child_env_keeps_the_users_filters_and_adds_ours_once(monkeypatch):
    monkeypatch.delenv(console.ENV_VAR, raising=False)
    ours = list(console.pythonwarnings_entries())
    env = console.child_env({"PYTHONWARNINGS": "error::RuntimeWarning", "PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert env["PYTHONWARNINGS"].split(",") == ["error::RuntimeWarning", *ours]  # later entries win
    assert console.child_env(env) == env  # passed down again (quickstart -> deepnmt-skd -> fairseq)
    assert console.child_env({})["PYTHONWARNINGS"].split(",") == ours
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    assert console.child_env()["PYTHONWARNINGS"].split(",") == ["default", *ours]
    shown = {console.ENV_VAR: "1", "PYTHONWARNINGS": "default"}
    assert console.child_env(shown) == shown


def test_quiet_known_warnings_is_idempotent_and_can_be_turned_off(monkeypatch):
    monkeypatch.delenv(console.ENV_VAR, raising=False)
    with warnings.catch_warnings():
        before = len(warnings.filters)
        console.quiet_known_warnings()
        console.quiet_known_warnings()
        assert len(warnings.filters) == before + len(console.KNOWN)
    monkeypatch.setenv(console.ENV_VAR, "1")
    with warnings.catch_warnings():
        before = list(warnings.filters)
        console.quiet_known_warnings()
        assert warnings.filters == before


# ------------------------------------------------------ measured, then filtered
def test_known_warnings_are_raised_by_the_real_code(trigger):
    err = trigger()
    missing = [f"{k.name} ({k.source})" for k in console.KNOWN if expected(k) and not printed(k, err)]
    assert not missing, f"no longer raised (drop them from console.KNOWN?): {missing}\n{err[-3000:]}"
    assert MASK_WARNING in err and "an unrelated UserWarning" in err


@pytest.mark.parametrize("mode", ["in-process", "PYTHONWARNINGS"])
def test_filters_hide_exactly_the_known_warnings(trigger, mode):
    if mode == "in-process":
        err = trigger("quiet")
    else:
        err = trigger(env=console.child_env(clean_env(PYTHONWARNINGS="default::DeprecationWarning:__main__")))
    shown = [k.name for k in console.KNOWN if printed(k, err)]
    assert not shown, f"{mode}: still printed {shown}\n{err[-3000:]}"
    assert MASK_WARNING in err and "an unrelated UserWarning" in err
    assert "Invalid -W option" not in err


def test_show_warnings_variable_turns_the_filters_off(trigger):
    env = console.child_env(clean_env(**{console.ENV_VAR: "1"}))
    assert "PYTHONWARNINGS" not in env
    err = trigger("quiet", env=env)  # and quiet_known_warnings() is a no-op
    assert all(printed(k, err) for k in console.KNOWN if expected(k)), err[-3000:]


# ------------------------------------------------------------------- the plugin
def test_importing_the_plugin_installs_no_warning_filter():
    """fairseq, torch & co. are imported first (they install filters of their own); then the
    plugin, exactly as --user-dir does, must leave warnings.filters as it found it."""
    code = textwrap.dedent('''
        import warnings
        import torch, fairseq, fairseq.models, fairseq.tasks, fairseq.criterions, fairseq.trainer
        import fairseq.checkpoint_utils, fairseq.options, fairseq_cli.train
        before = list(warnings.filters)
        import deepnmt_fairseq
        from fairseq import utils
        utils.import_user_module(type("Args", (), {"user_dir": deepnmt_fairseq.USER_DIR})())
        after = list(warnings.filters)
        added = [f for f in after if f not in before]
        assert after == before, f"importing the plugin changed warnings.filters: {added}"
        print("unchanged", len(after))
    ''')
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(),
                         timeout=300)
    assert res.returncode == 0 and "unchanged" in res.stdout, res.stderr[-3000:]


# ------------------------------------------------------------- an entry point
@pytest.mark.slow
def test_skd_entry_point_prints_none_of_the_known_warnings(data_bin, tmp_path):
    save = tmp_path / "teacher"
    train(data_bin, save, "deepnmt_transformer",
          [*tiny_model_flags(), "--share-all-embeddings", "--encoder-layers", "1", "--decoder-layers", "1"],
          max_update=2)
    teacher = save / "checkpoint_last.pt"
    env = clean_env()
    # fairseq-generate itself (what deepnmt-skd runs) shows them: the check below is not vacuous
    # (fresh processes: a command forked from the tests' warm interpreter prints no import-time warning)
    direct = generate(data_bin, teacher, "--max-len-b", 3, fork=False).stderr
    assert [k.name for k in console.KNOWN if printed(k, direct)], direct[-3000:]

    res = run_cli("deepnmt-skd", "--data", data_bin, "--teacher", teacher, "--output", tmp_path / "skd",
                  "--beam", "1", "--batch-size", "40", "--cpu", "--max-len-b", "3", env=env, fork=False)
    assert (tmp_path / "skd" / ".done").exists()
    shown = [k.name for k in console.KNOWN if printed(k, res.stderr)]
    assert not shown, f"deepnmt-skd printed {shown}:\n{res.stderr[-4000:]}"
    assert "Warning" not in res.stderr, res.stderr[-4000:]
