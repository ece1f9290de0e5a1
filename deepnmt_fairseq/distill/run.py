"""Running a plan: each stage skipped when its output exists, its command's progress shown and
logged, the work directory tied to the settings it was made with."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterable, Optional

from .plan import Stage

# lines of a stage's log echoed to the console: fairseq-train's progress and validation, deepnmt-skd's
# progress, fairseq-generate's summary, errors
PROGRESS = re.compile(r"\bepoch \d+|done training|valid on|\[skd |Translated \d|error|Error|Traceback|exported ")


# the package's own quick commands run in this process (no second interpreter and fairseq import,
# which take half a minute on a loaded 2-core machine): console script -> module with main(argv)
IN_PROCESS = {"deepnmt-average-checkpoints": "deepnmt_fairseq.cli.average_checkpoints",
              "deepnmt-extract-student": "deepnmt_fairseq.cli.extract_student"}


class RunError(RuntimeError):
    """A stage failed; the message names the stage, its command and its log."""


def settings_guard(work: Path, settings: Dict, name: str = "settings.json", flag: str = "--work-dir") -> None:
    """Tie ``work`` to ``settings``: the first run writes them, a run with other settings is refused
    (the outputs in ``work`` were made with the old ones)."""
    work.mkdir(parents=True, exist_ok=True)
    stamp = work / name
    settings = json.loads(json.dumps(settings))  # the JSON view (tuples as lists, paths as strings)
    if stamp.exists():
        old = json.loads(stamp.read_text())
        if old != settings:
            diff = {k: {"then": old.get(k), "now": settings.get(k)} for k in sorted(set(old) | set(settings))
                    if old.get(k) != settings.get(k)}
            raise RunError(f"{work} holds a run with other settings ({stamp}): {json.dumps(diff)}; "
                           f"use another {flag}, or the same settings to resume")
        return
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, stamp)


class Runner:
    def __init__(self, prefix: str = "distill", env: Optional[Dict[str, str]] = None, echo=print):
        from ..console import child_env

        self.prefix = prefix
        self.env = child_env(dict(env if env is not None else os.environ, PYTHONUNBUFFERED="1"))
        self.echo = echo
        self.ran = []  # names of the stages run (not skipped) by this runner

    def log(self, msg: str) -> None:
        self.echo(f"[{self.prefix} {time.strftime('%H:%M:%S')}] {msg}")
        sys.stdout.flush()

    def run(self, stages: Iterable[Stage]) -> None:
        stages = list(stages)
        for i, st in enumerate(stages, 1):
            head = f"stage {i}/{len(stages)} {st.name}"
            if st.is_done():
                self.log(f"{head}: done earlier ({st.done_file()})")
                continue
            self.log(f"{head}: {st.what}")
            t0 = time.time()
            self.execute(st)
            self.ran.append(st.name)
            self.log(f"{head}: finished in {time.time() - t0:.0f} s")

    def execute(self, st: Stage) -> None:
        if st.call is not None:
            st.call()
        else:
            self.command(st.command(), st.log, st.name)
        if st.marker:
            st.output.mkdir(parents=True, exist_ok=True)
            st.done_file().write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
        if not st.is_done():
            raise RunError(f"stage {st.name}: finished without writing {st.done_file()}")

    def command(self, argv, log: Optional[Path] = None, name: str = "") -> None:
        """Run ``argv`` (a console script by name first); its output goes to ``log`` (appended:
        a resumed stage keeps its history) and its progress lines to the console."""
        from ..console import exe

        if str(argv[0]) in IN_PROCESS:
            import importlib

            self.log("$ " + " ".join(_quote(str(c)) for c in argv))
            rc = importlib.import_module(IN_PROCESS[str(argv[0])]).main([str(a) for a in argv[1:]])
            if rc:
                raise RunError(f"stage {name}: {argv[0]} failed (exit {rc})")
            return
        cmd = [exe(str(argv[0]))] + [str(a) for a in argv[1:]]
        self.log("$ " + " ".join(_quote(c) for c in [str(argv[0]), *cmd[1:]]))
        if log is None:
            res = subprocess.run(cmd, env=self.env)
            if res.returncode:
                raise RunError(f"stage {name}: {argv[0]} failed (exit {res.returncode})")
            return
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(_quote(c) for c in cmd)}\n")
            f.flush()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env, text=True,
                                    errors="replace")
            try:
                for line in proc.stdout:
                    f.write(line)
                    if PROGRESS.search(line):
                        self.echo(f"  {line.rstrip()}")
                rc = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        if rc:
            tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise RunError(f"stage {name}: {argv[0]} failed (exit {rc}); end of {log}:\n{tail}")


def _quote(c: str) -> str:
    import shlex

    return shlex.quote(c)
