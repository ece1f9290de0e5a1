"""Every ``deepnmt-repro train ROW --dry-run`` output, compared with a committed snapshot.

The job-model redesign (issue 68) must not change a single command line of the registry: this
test runs the dry run of every row under four launches (CPU, 8 local GPUs with --fp16, a
torchrun rank and a Slurm rank on GPU nodes) and compares the text with
``tests/data/dry_run_snapshot.txt``.  Machine-specific paths are replaced by placeholders
(``<USER_DIR>``, ``<BIN>``, ``<DATA>``, ``<CK>``).

A row's *intended* change (a registry value edited on purpose) changes the snapshot too.
Regenerate it with the one command

    OMP_NUM_THREADS=1 .venv/bin/python tests/test_dry_run_snapshot.py

and commit the new snapshot together with the change that explains its diff
(``git diff tests/data/dry_run_snapshot.txt`` shows exactly which command lines moved).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parent / "data" / "dry_run_snapshot.txt"
DATA, CK = "/snapshot/data", "/snapshot/checkpoints"

#: (label, extra flags, environment) of each launch the snapshot covers
LAUNCHES = [
    ("cpu", ["--gpus", "0"], {"CUDA_VISIBLE_DEVICES": ""}),
    ("local-8gpu-fp16", ["--gpus", "8", "--fp16"], {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}),
    ("torchrun-16", ["--launcher", "torchrun"],
     {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "WORLD_SIZE": "16", "RANK": "0", "LOCAL_RANK": "0"}),
    ("slurm-4", ["--launcher", "slurm", "--bf16"],
     {"CUDA_VISIBLE_DEVICES": "0", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
      "MASTER_ADDR": "node1", "MASTER_PORT": "29400"}),
]
#: variables the launches read; cleared before each so that the caller's shell does not leak in
CLEARED = ("CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "RANK", "LOCAL_RANK", "SLURM_NTASKS", "SLURM_PROCID",
           "SLURM_LOCALID", "MASTER_ADDR", "MASTER_PORT", "DEEPNMT_DATA", "DEEPNMT_CHECKPOINTS")


def _placeholders(text: str) -> str:
    from deepnmt_fairseq import USER_DIR
    from deepnmt_fairseq.console import exe

    bin_dir = str(Path(exe("fairseq-train")).parent)
    return text.replace(str(USER_DIR), "<USER_DIR>").replace(bin_dir + "/", "<BIN>/") \
               .replace(DATA, "<DATA>").replace(CK, "<CK>")


def dry_runs() -> str:
    """The text of every row's dry run under every launch, in registry order."""
    from deepnmt_cli.repro import main  # the console script's entry point (it parses, deepnmt_fairseq.repro runs)
    from deepnmt_fairseq.repro.registry import EXPERIMENTS

    saved = dict(os.environ)
    out = []
    try:
        for label, flags, env in LAUNCHES:
            for key in CLEARED:
                os.environ.pop(key, None)
            os.environ.update(env, DEEPNMT_DATA=DATA, DEEPNMT_CHECKPOINTS=CK)
            for name in EXPERIMENTS:
                buf, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
                    rc = main(["train", name, "--dry-run", *flags])
                out.append(f"===== {label}: deepnmt-repro train {name} --dry-run {' '.join(flags)} (exit {rc})\n")
                out.append(buf.getvalue())
                if rc:
                    out.append(f"[stderr] {err.getvalue()}")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return _placeholders("".join(out))


def test_every_dry_run_is_the_snapshot():
    now = dry_runs()
    want = SNAPSHOT.read_text(encoding="utf-8")
    import difflib

    diff = "".join(list(difflib.unified_diff(want.splitlines(True), now.splitlines(True), "snapshot", "now", n=1))[:80])
    assert now == want, ("a registry dry run changed; if intended, regenerate the snapshot with "
                         "`python tests/test_dry_run_snapshot.py` (module docstring):\n" + diff)


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    SNAPSHOT.write_text(dry_runs(), encoding="utf-8")
    print(f"wrote {SNAPSHOT}", file=sys.stderr)
