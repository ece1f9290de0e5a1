"""Plugin loading: registration, no name clashes, one copy at a time."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(code, cwd=None, extra_path=()):
    env_path = ":".join([str(REPO), *map(str, extra_path)])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})


def test_import_registers_everything_without_clashing_with_fairseq():
    res = _run("""
        import fairseq.models, fairseq.criterions, fairseq.tasks
        from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
        from fairseq.criterions import CRITERION_REGISTRY
        from fairseq.tasks import TASK_REGISTRY
        before = {k: set(r) for k, r in (("arch", ARCH_MODEL_REGISTRY), ("model", MODEL_REGISTRY),
                                         ("crit", CRITERION_REGISTRY), ("task", TASK_REGISTRY))}
        import deepnmt_fairseq
        from deepnmt_fairseq.models.architectures import PAPER_ROWS
        after = {k: set(r) for k, r in (("arch", ARCH_MODEL_REGISTRY), ("model", MODEL_REGISTRY),
                                        ("crit", CRITERION_REGISTRY), ("task", TASK_REGISTRY))}
        new = {k: after[k] - before[k] for k in after}
        assert new["model"] == {"deepnmt_transformer", "rnmt_plus", "hiertrans"}, new["model"]
        assert set(PAPER_ROWS) <= new["arch"], set(PAPER_ROWS) - new["arch"]
        assert "collapse_reducing" in new["crit"]
        ours = {n for n, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("deepnmt_fairseq")}
        assert ours == new["arch"], "an architecture name of ours shadows a fairseq built-in"
        print("OK", len(new["arch"]))
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("OK")


def test_second_copy_of_the_plugin_fails_clearly(tmp_path):
    shutil.copytree(REPO / "deepnmt_fairseq", tmp_path / "deepnmt_copy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    res = _run("""
        import deepnmt_fairseq
        from deepnmt_fairseq import fairseq_fixes
        from fairseq.data import data_utils
        from fairseq import checkpoint_utils
        try:
            import deepnmt_copy
        except ImportError as e:
            print("REFUSED:", e)
        # the copy's fairseq_fixes.install() ran before the refusal: it must not wrap fairseq twice
        assert not hasattr(data_utils.batch_by_size.__wrapped__, "__wrapped__")
        assert checkpoint_utils.PathManager.__module__ == "deepnmt_fairseq.behaviour_fixes"
        assert len(fairseq_fixes.active()) == len(fairseq_fixes.FIXES)
    """, extra_path=[tmp_path])
    assert "REFUSED: another copy of deepnmt_fairseq is already registered" in res.stdout, res.stderr[-2000:]
    assert str(tmp_path / "deepnmt_copy") in res.stdout
    assert res.returncode == 0, res.stderr[-2000:]


def test_user_dir_import_from_a_renamed_checkout_works_alone(tmp_path):
    """--user-dir imports the folder by its own name; a renamed copy works when loaded alone."""
    shutil.copytree(REPO / "deepnmt_fairseq", tmp_path / "my_plugin", ignore=shutil.ignore_patterns("__pycache__"))
    res = _run(f"""
        import argparse
        from fairseq import utils
        utils.import_user_module(argparse.Namespace(user_dir={str(tmp_path / 'my_plugin')!r}))
        from fairseq.models import MODEL_REGISTRY
        print(MODEL_REGISTRY["deepnmt_transformer"].__module__)
    """)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().startswith("my_plugin.")
