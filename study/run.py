"""The evidence study's runs (``python -m study``): the data, the training and evaluation of every run
(:class:`Study`: resumable, recorded, rebuilt where a later run needs a lost checkpoint), the runs that
need earlier ones' outputs (SKD data and students, the second stage of the skipping study), and the
order of the whole study (:func:`run_study`).

Every command is a stage (:class:`deepnmt_fairseq.jobs.stage.Stage`) that the one job runner
(:class:`deepnmt_fairseq.jobs.runner.Runner`) executes, starting it through the study's launcher
(:mod:`study.launcher`: forked from an interpreter that has imported torch and fairseq, in its own
process group, stopped at the deadline or a signal): a run's training (done-marker ``.trained``;
fairseq-train resumes from ``checkpoint_last.pt``), then its evaluation (``study/evaluate.py``, whose
output ``eval.out`` is the stage's), and the GPKD planner's own SKD and extraction stages.  A run is
finished when its ``done.json`` (and record) exist; the layout of a run directory is unchanged.
Imports the plan (study.plan) and the launcher (study.launcher)."""

from __future__ import annotations

import fcntl
import fnmatch
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from deepnmt_fairseq.distill import plan as gpkd_plan
from deepnmt_fairseq.jobs.fairseq_argv import fairseq_train, user_dir
from deepnmt_fairseq.jobs.runner import RunError, Runner, write_atomic
from deepnmt_fairseq.jobs.stage import Stage, make_log
from .launcher import Deadline, Launcher
from .plan import (
    DATA_STAMP, REPO, REPRODUCED, Preset, Run, close_systems, choose_dd_depth, converged_runs, dd_compare_runs,
    dd_search_runs, finished, matched_updates, headline_pairs, independent_runs, model_flags, partial_path,
    record_path, prenorm_check_runs, prenorm_sweep_runs, postnorm_schedule, retuned_runs, seeded, ssl_stage1, teacher_run)

# --user-dir of every command: the installed package (the one lookup, deepnmt_fairseq/jobs/fairseq_argv.py)
USER_DIR = user_dir()
# a training that stops on these has diverged (fairseq's overflow/NaN checks, the plugin's NaN guard)
DIVERGED = ("FloatingPointError", "NaN detected", "non-finite loss", "Minimum loss scale reached")


log = make_log("fidelity", stdout=True)


def _quiet(line: str) -> None:
    """The job runner's own log lines (stage started, skipped, finished): not printed by the study."""


class Study:
    def __init__(self, preset: Preset, work: Path, data: Path, raw: Path, threads: int = 1,
                 short_first: bool = False, fork: bool = True, deadline: Optional[float] = None,
                 records: Optional[Path] = None, select: Sequence[str] = (), add_statistics: bool = False,
                 cuda: bool = False):
        self.p, self.work, self.data, self.raw, self.records = preset, work, data, raw, records
        # --cuda: a float32 preset's commands on the GPU (without --cpu); the records say so
        # (machine.device), and their seconds are left out of the CPU budget (remaining_hours)
        self.cuda = cuda
        # --add-statistics: the selected runs recorded without sentence statistics are trained again
        self.add_statistics = add_statistics
        self.short_first = short_first
        # --runs: only the planned runs whose names match one of these patterns, in the patterns' order
        self.select = list(select)
        # runs go in parallel (--jobs), each with this many threads: small models use cores
        # better as separate processes than as intra-op threads
        self.env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                        PYTHONUNBUFFERED="1")
        if cuda:  # float32 as on the CPU: no TensorFloat-32 in cuBLAS or cuDNN, whatever torch allows
            self.env["NVIDIA_TF32_OVERRIDE"] = "0"
        from deepnmt_fairseq.console import child_env

        self.env = child_env(self.env)
        self.launch = Launcher(self.env, threads, fork, deadline)

    def dir(self, name: str) -> Path:
        return self.work / "runs" / name

    def selected(self, name: str) -> bool:
        """Whether this command trains the run (--runs; every run without it)."""
        return not self.select or _pattern_index(name, self.select) is not None

    def result(self, name: str, work_only: bool = False) -> Optional[dict]:
        """The finished run's result: its ``done.json`` in the work directory, else its record."""
        for done in (self.dir(name) / "done.json", None if work_only else record_path(self.records, name)):
            if done is not None and done.exists():
                return json.loads(done.read_text())
        return None

    def _save(self, name: str, out: dict) -> None:
        """Write the result to the run's ``done.json`` and to its record (never over another record)."""
        text = json.dumps(out, indent=1) + "\n"
        write_atomic(self.dir(name) / "done.json", text)  # read by the scheduler's other threads (run_all's more)
        part = partial_path(self.records, name)
        if part is not None and part.exists():  # what a stopped segment kept: superseded
            part.unlink()
        rec = record_path(self.records, name)
        if rec is not None:
            if rec.exists():  # a rebuild: the record stays
                old, new = json.loads(rec.read_text()), json.loads(text)
                if all(old.get(k) == new.get(k) for k in REPRODUCED):
                    log(f"  {name}: the rebuilt run reproduces its record ({', '.join(REPRODUCED)})")
                    gained = {k: v for k, v in new.items() if k not in old}
                    if not gained:
                        return
                    # a record made before a measurement was kept (the sentence statistics of the paired
                    # bootstrap) gains it from a run that reproduces it; nothing it had is changed
                    log(f"  {name}: its record gains {', '.join(gained)}")
                    text = json.dumps({**old, **gained}, indent=1) + "\n"
                else:
                    rec = rec.with_name(f"{name}.rebuilt.json")
                    log(f"  {name}: the rebuilt run DIFFERS from its record; kept as {rec.name}, the record stays "
                        f"(trained on {new.get('machine')}; the record on {old.get('machine', 'a machine not recorded')})")
            rec.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(rec, text)

    def lacks_statistics(self, name: str) -> bool:
        """A finished, evaluated run recorded before every evaluation kept ``test_stats`` (round 1)."""
        out = self.result(name)
        return out is not None and not out.get("diverged") and "bleu" in out and "test_stats" not in out

    def rebuild(self, r: Run) -> dict:
        """Train a recorded run again in this work directory, for a checkpoint that a later run needs
        and that only the checkout which trained it had (the teacher of the SKD data, stage 1 of the
        skipping study).  Training is deterministic (same command, same seed, one thread; resumed runs
        included: ``resume_same_batches``), so the result should equal the record; one that does not
        is kept next to it (``<run>.rebuilt.json``) and the record is not overwritten."""
        log(f"rebuild {r.name}: its checkpoint is needed and only its record is here")
        return self.train(r, rebuild=True)

    # ---------------------------------------------------------------- training
    def train_command(self, r: Run) -> List[str]:
        p = self.p
        save = self.dir(r.name)
        updates = r.updates or p.updates
        post = "--post-norm" in r.model
        lr, warmup = postnorm_schedule(p) if post else (p.lr, p.warmup)
        lr, warmup = (r.lr if r.lr is not None else lr), (r.warmup if r.warmup is not None else warmup)
        cmd = fairseq_train(r.data or self.data, r.model, r.crit, [
               "--task", "deep_translation" if r.diagnostics else "translation", "--optimizer", r.optimizer, "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
               "--lr", str(lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup),
               "--max-tokens", str(p.max_tokens), "--max-update", str(updates), "--seed", str(r.seed),
               "--save-dir", str(save), "--save-interval-updates", str(p.save_every), "--keep-interval-updates", "3",
               # fairseq saves no interval checkpoint at an epoch's end (it is an epoch checkpoint
               # then): keep the newest epoch checkpoint so that the last 3 by update are all there.
               # A curve run keeps them all: an epoch's end on a curve point is saved only as an epoch
               # checkpoint (the CPU corpus has 200-update epochs: every 800th update is one);
               # prune_epochs deletes those that are no curve point, but for the 3 newest while the
               # run trains and the newest once curve() has evaluated it
               *([] if r.curve_every else ["--keep-last-epochs", "1"]),
               "--log-format", "json", "--log-interval", str(max(1, p.save_every // 5)),
               "--num-workers", "0", "--skip-invalid-size-inputs-valid-test", *p.extra, *self.device()], resolve=True)
        if r.early_stop:
            cmd += ["--validate-interval-updates", str(p.valid_every),
                    "--patience", str(r.patience if r.patience is not None else p.patience),
                    "--best-checkpoint-metric", "loss"]
        elif not r.valid_log:  # a valid_log run validates at every checkpoint save, and never stops early
            cmd += ["--disable-validation"]
        if r.diagnostics:  # DeepNet's and Admin's diagnostics (deepnmt_fairseq/tasks/deep_translation.py)
            cmd += ["--log-change-norms", "--log-grad-norms-every", str(r.diagnostics)]
        if r.update_freq > 1:
            cmd += ["--update-freq", str(r.update_freq)]
        if r.curve_every:  # interval checkpoints at multiples of curve_every are not deleted
            cmd += ["--keep-interval-updates-pattern", str(r.curve_every)]
        if r.init is not None:
            how, ckpt = r.init
            cmd += ["--finetune-from-model" if how == "finetune" else "--continue-once", str(ckpt)]
        return cmd

    # ---------------------------------------------------------------- stages, on the job runner
    def runner(self, start) -> Runner:
        """The job runner (:class:`deepnmt_fairseq.jobs.runner.Runner`) that executes the study's
        stages: it skips a stage whose done-marker exists and checks that a finished command wrote it;
        it starts each command with ``start(cmd, log)``, which goes through :attr:`launch` (the fork
        server that has imported torch and fairseq, a process group per command, the deadline, the
        signals).  One runner per plan: the runs train in parallel threads (``--jobs``).  Its own
        lines are not printed: the study's log says what starts and what it gave."""
        return Runner(prefix="fidelity", echo=_quiet, in_process=False, numbered=False, start=start)

    @staticmethod
    def train_stage(r: Run, cmd: Sequence, save: Path) -> Stage:
        """A run's training as a stage: the command, its log ``save/train.log``, its done-marker
        ``save/.trained`` (the total wall time of its segments; written when the command succeeds).  The
        layout of a run directory is the one every earlier work directory has: ``.trained`` there means
        trained."""
        return Stage(f"{r.name}/train", [str(c) for c in cmd], save, done=save / ".trained", log=save / "train.log",
                     kind="train", what=f"train {r.name}")

    def train(self, r: Run, rebuild: bool = False) -> dict:
        """Train (or resume) the run, average its last 3 checkpoints, evaluate; once."""
        if self.add_statistics and self.selected(r.name) and self.lacks_statistics(r.name):
            log(f"rebuild {r.name}: recorded without the sentence statistics of the paired bootstrap")
            rebuild = True
        out = self.result(r.name, work_only=rebuild)
        if out is not None:
            return out
        self.launch.check()
        save = self.dir(r.name)
        save.mkdir(parents=True, exist_ok=True)
        with open(save / ".lock", "w") as lock:
            try:  # two study commands on one work directory never train the same run at once
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"  {r.name}: being trained by another study command; skipped here")
                return {"name": r.name, "system": r.system, "seed": r.seed, "diverged": True, "returncode": None}
            return self._train(r, save, rebuild)  # the lock is released when the file closes

    def _train(self, r: Run, save: Path, rebuild: bool = False) -> dict:
        out = self.result(r.name, work_only=rebuild)  # finished by the command that held the lock
        if out is not None:
            return out
        cmd = self.train_command(r)
        stage = self.train_stage(r, cmd, save)
        if not stage.is_done():
            log(f"train {r.name}")
            kept = _partial_updates(partial_path(self.records, r.name))
            if kept and not (save / "checkpoint_last.pt").exists():
                log(f"  {r.name}: its partial record ({kept} updates) has no "
                    f"checkpoint in {save} (a new machine or work directory): it trains from update 0, and the "
                    "record stays until this run passes it")
        # a curve run keeps its epoch checkpoints while it trains; those that can no longer be
        # a curve point or among the last 3 go every minute (prune_epochs), not only at the end
        tick = (lambda: self.prune_epochs(save, r.curve_every, keep=3)) if r.curve_every else None

        def start(argv: List[str], log_file: Optional[Path]) -> int:
            """How the runner starts the training command: through the launcher; its wall time is added
            to ``.elapsed``, and ``.trained`` (the stage's done-marker) holds the total once it succeeds."""
            t0 = time.time()
            try:
                code = self.launch.run(argv, log_file, tick=tick)
            except Deadline:  # the run stays unfinished: keep what its log says (valid only)
                self._keep_partial(r, cmd, save, _add_seconds(save / ".elapsed", time.time() - t0))
                raise
            # train_seconds is the wall time of every segment of a stopped and resumed run
            seconds = _add_seconds(save / ".elapsed", time.time() - t0)
            if code == 0:
                (save / ".trained").write_text(f"{seconds:.1f}\n")
            return code

        runner = self.runner(start)
        try:
            runner.run([stage])  # skipped when .trained exists; fairseq-train resumes from checkpoint_last.pt
        except RunError:
            code = runner.returncode
            if code is None:  # not the command's failure
                raise
            out = {"name": r.name, "system": r.system, "seed": r.seed, "command": _portable(cmd),
                   "returncode": code, "diverged": True, "losses": self.losses(save)}
            text = (save / "train.log").read_text(errors="replace")
            log(f"  {r.name} FAILED (exit {code}): " + " / ".join(text.splitlines()[-3:]))
            if any(sign in text for sign in DIVERGED):  # deterministic: recorded, not retried
                self._save(r.name, out)
            return out  # any other failure (killed, out of memory) is retried by a re-run
        losses = self.losses(save)
        out = {"name": r.name, "system": r.system, "seed": r.seed, "command": _portable(cmd), "returncode": 0,
               "train_seconds": float((save / ".trained").read_text()), "losses": losses,
               "final_train_loss": final_loss(losses),
               "diverged": not losses or not math.isfinite(losses[-1][1]), "machine": self.machine()}
        try:
            self._evaluate_trained(r, save, out)
        except Deadline:  # trained, not yet evaluated: the partial record says how far it got
            self._keep_partial(r, cmd, save, out["train_seconds"], trained=True)
            raise
        self._save(r.name, out)
        log(f"  {r.name}: " + json.dumps({k: out.get(k) for k in ("final_train_loss", "valid_nll", "bleu",
                                                                   "train_bleu", "unk_gap", "train_seconds")}))
        return out

    def _evaluate_trained(self, r: Run, save: Path, out: dict) -> None:
        """Add to a trained run's record what its checkpoints say: the average of its last 3 evaluated
        (unless it diverged), its valid curve, diagnostics, where the patience rule stopped it, and its
        curve points; the deadline may stop this (:class:`study.launcher.Deadline`)."""
        if not out["diverged"]:
            avg = save / "checkpoint_avg.pt"  # the last 3 checkpoints averaged (by study/evaluate.py)
            out.update(self.evaluate(avg, r.unk_gap, average_dir=save, valid_only=r.valid_only))
            out["checkpoint"] = str(avg.relative_to(self.work))
        if r.valid_log:  # the valid NLL at every save: where a run leaves (or stays on) a plateau
            out["valid_log"] = (partial_record(save / "train.log") or {}).get("valid_log", [])
        if r.diagnostics:
            out["change_log"] = change_log(save / "train.log")
        if r.early_stop:
            out["best_update"] = self.updates_of(save / "checkpoint_best.pt")
            out["stopped_at"] = self.updates_of(save / "checkpoint_last.pt")
        if r.curve_every:  # a diverged run has no curve, but its epoch checkpoints are pruned too
            curve = self.curve(save, r.curve_every, evaluate=not out["diverged"])
            if not out["diverged"]:
                out["curve"] = curve

    def curve(self, save: Path, every: int, evaluate: bool = True) -> List[dict]:
        """Valid NLL and test BLEU of the single checkpoint at every multiple of ``every`` updates
        (interval checkpoints kept by ``--keep-interval-updates-pattern``, and epoch checkpoints
        where an epoch ended on one), in update order; each point is cached in ``curve-U.json``, so
        an interrupted evaluation resumes.  Then the epoch checkpoints that are no curve point are
        deleted, but for the newest (what ``--keep-last-epochs 1`` keeps in the other runs;
        :meth:`prune_epochs`).  ``evaluate=False`` (a diverged run) only deletes them."""
        points: Dict[int, Path] = {}
        for ckpt in save.glob("checkpoint*.pt"):
            interval = re.fullmatch(r"checkpoint_\d+_(\d+)", ckpt.stem)
            update = int(interval.group(1)) if interval else self._epoch_update(ckpt)
            if update and update % every == 0:
                points.setdefault(update, ckpt)
        out = []
        for update, ckpt in sorted(points.items()) if evaluate else ():
            cache = save / f"curve-{update}.json"
            if not cache.exists():
                res = self.evaluate(ckpt, train_sample=False)  # a curve point: valid NLL and test BLEU
                cache.write_text(json.dumps({"updates": update, **{k: res.get(k) for k in
                                                                  ("valid_nll", "bleu", "test_stats")}}))
            out.append(json.loads(cache.read_text()))
        self.prune_epochs(save, every, keep=1)
        return out

    def _epoch_update(self, ckpt: Path) -> Optional[int]:
        """The update an epoch checkpoint (``checkpoint{E}.pt``) was saved at; None for any other
        file.  Read once per file (the checkpoint is loaded), then from a cache keyed by its mtime."""
        if not re.fullmatch(r"checkpoint\d+", ckpt.stem):
            return None
        cache = self.__dict__.setdefault("_epoch_updates", {})
        key = (str(ckpt), ckpt.stat().st_mtime_ns)
        if key not in cache:
            cache[key] = self.updates_of(ckpt)
        return cache[key]

    def prune_epochs(self, save: Path, every: int, keep: int) -> None:
        """Delete a curve run's epoch checkpoints (``checkpoint{E}.pt``) but for the ``keep`` newest
        epochs and those on a curve point (an update that is a multiple of ``every``).  A curve run
        cannot use ``--keep-last-epochs`` (it would delete the curve points saved at an epoch's end),
        so fairseq keeps every epoch checkpoint: on the GPU preset's corpus, an epoch of about 160
        updates and 146 MB for a 6-layer model, 3.1 GB a run after 2700 updates, measured on the
        H200 lease of 2026-11-28.  While the run trains (``keep=3``, every minute through
        :meth:`study.launcher.Launcher.run`'s ``tick``) the three newest stay: the average of
        the last 3 checkpoints by update, interval and epoch alike, reads only those, and the
        newest may be the one fairseq has just written.  After the run (``keep=1``, :meth:`curve`)
        only the newest stays, as ``--keep-last-epochs 1`` keeps in the other runs."""
        epochs = sorted((int(c.stem[len("checkpoint"):]), c) for c in save.glob("checkpoint*.pt")
                        if re.fullmatch(r"checkpoint\d+", c.stem))
        for _, ckpt in epochs[:-keep] if keep else epochs:
            try:
                update = self._epoch_update(ckpt)
                if update is None or update % every:
                    ckpt.unlink()
            except FileNotFoundError:  # deleted meanwhile (a second study command on the same run)
                pass

    def _keep_partial(self, r: Run, cmd: Sequence, save: Path, seconds: float, trained: bool = False) -> None:
        """Record a run stopped by ``--deadline-minutes`` before it finished (:func:`partial_record`)
        as ``<records>/partial/<run>.json``, so that a machine lent for a few minutes, whose checkpoints
        are lost with it, brings back at least the run's validation curve; the finished run's record
        replaces it (:meth:`_save`).  A partial record further on than this segment (kept by an earlier
        machine whose checkpoints this work directory lacks) is never overwritten by it.  ``trained``: the
        training had finished and the deadline stopped its evaluation (recorded as ``"trained": true``;
        the same command evaluates it without training further)."""
        out = partial_record(save / "train.log")
        path = partial_path(self.records, r.name)
        if out is None or path is None:
            return
        before = _partial_updates(path)
        if before > out["updates"]:  # a segment that restarted without the checkpoints
            log(f"  {r.name}: stopped unfinished at {out['updates']} updates, behind its partial record "
                f"({before} updates, from checkpoints this work directory lacks): the record stays; "
                f"this segment resumes from {save}")
            return
        out.update({"name": r.name, "system": r.system, "seed": r.seed, "command": _portable(cmd),
                    "train_seconds": round(seconds, 1), "machine": self.machine()})
        if trained:
            out["trained"] = True
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")  # a stop while writing never leaves half a record
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        tmp.replace(path)
        log(f"  {r.name}: " + (f"trained ({out['updates']} updates), its evaluation stopped by the deadline"
                                if trained else f"stopped unfinished at {out['updates']} updates") + f"; kept {path}")

    @staticmethod
    def losses(save: Path) -> List[Tuple[int, float]]:
        """(update, train loss) of every logged interval of the run (fairseq --log-format json)."""
        from deepnmt_fairseq.analysis.logs import read_json_log, series

        log_file = save / "train.log"
        return series(read_json_log(str(log_file)), "loss") if log_file.exists() else []

    @staticmethod
    def updates_of(ckpt: Path) -> Optional[int]:
        from deepnmt_fairseq.checkpoint_safety import load_checkpoint

        if not ckpt.exists():
            return None
        state = load_checkpoint(str(ckpt))
        return int(state["optimizer_history"][-1]["num_updates"])

    # ---------------------------------------------------------------- evaluation
    def eval_command(self, ckpt: Path, unk_gap: bool, average_dir: Optional[Path] = None,
                     train_sample: bool = True, valid_only: bool = False) -> List[str]:
        cmd = [sys.executable, str(Path(__file__).with_name("evaluate.py")), "--data", str(self.data),
               "--raw", str(self.raw), "--checkpoint", str(ckpt), *self.device()]
        if average_dir is not None:
            cmd += ["--average-dir", str(average_dir)]
        return (cmd + (["--unk-gap"] if unk_gap else []) + ([] if train_sample else ["--no-train-sample"])
                + (["--valid-only"] if valid_only else []))

    def evaluate(self, ckpt: Path, unk_gap: bool = False, average_dir: Optional[Path] = None,
                 train_sample: bool = True, valid_only: bool = False) -> dict:
        """valid NLL, test BLEU, train-sample BLEU (and the UNK-source gap): study/evaluate.py
        (``valid_only``: the valid NLL alone, for a tuning run)."""
        cmd = self.eval_command(ckpt, unk_gap, average_dir, train_sample, valid_only)
        stdout, stderr = ckpt.parent / "eval.out", ckpt.parent / "eval.log"
        # a stage whose output is this evaluation's stdout: removed first, so that it is never done
        # before the command has run (every point of a curve run shares the file; a run evaluates once)
        stdout.unlink(missing_ok=True)
        stage = Stage(f"{ckpt.parent.name}/evaluate", [str(c) for c in cmd], stdout, log=stderr, kind="evaluate",
                      what=f"evaluate {ckpt.name}")
        try:
            self.runner(lambda argv, log_file: self.launch.run(argv, stdout, log_file)).run([stage])
        except RunError:
            raise RuntimeError(f"evaluation of {ckpt} failed:\n{stderr.read_text(errors='replace')[-3000:]}") from None
        out = json.loads(stdout.read_text().strip().splitlines()[-1])
        out["eval_command"] = _portable(cmd)
        return out

    def call(self, stage: Stage, log_file: Path) -> None:
        """A stage of the one GPKD planner (:mod:`deepnmt_fairseq.distill.plan`: SKD data, extraction) that
        must succeed, on the job runner through the launcher, its output appended to ``log_file``
        (skipped when its done-marker exists)."""
        from deepnmt_fairseq.console import exe

        stage.action.log = log_file
        try:
            self.runner(lambda argv, log: self.launch.run(argv, log)).run([stage])
        except RunError:
            cmd = stage.command()
            text = log_file.read_text(errors="replace") if log_file.exists() else ""
            raise RuntimeError(f"{_portable([exe(cmd[0]), *cmd[1:]])} failed:\n{text[-3000:]}") from None

    def device(self) -> List[str]:
        """``--cpu`` for the float32 presets, unless ``--cuda`` moves them to the GPU."""
        return [] if (self.cuda or "--bf16" in self.p.extra or "--fp16" in self.p.extra) else ["--cpu"]

    def machine(self) -> Dict[str, object]:
        """:func:`machine`, with ``device: cuda`` for a run that ``--cuda`` moved to the GPU."""
        return machine(self.launch.threads, cuda=self.cuda)

    # ---------------------------------------------------------------- scheduling
    def run_all(self, runs: Sequence[Run], jobs: int,
                more: Optional[Callable[[], Sequence[Run]]] = None) -> Dict[str, dict]:
        """Train ``runs``, at most ``jobs`` at once; ``more``, asked after each run finishes, names the runs
        that finished runs have made ready (issue 77's tuning chain), which join the queue in its order at
        once, while the runs before them still train: a long run no longer leaves the other slots idle until
        it ends.  A run is trained at most once per call, so one that failed is not tried again here."""
        seen: set = set()
        kept: Dict[str, dict] = {}
        queue: List[Run] = []

        def add(new: Sequence[Run]) -> None:
            new = [r for r in {r.name: r for r in new}.values() if r.name not in seen]
            seen.update(r.name for r in new)
            # --runs: a run not selected is not trained, but its finished result is returned as a trained
            # one would be (the phases after this one read the teacher's, stage 1's and the depth search's
            # results from here)
            kept.update({r.name: res for r in new if not self.selected(r.name) and (res := self.result(r.name)) is not None})
            queue.extend(r for r in new if self.selected(r.name))
            # longest first (the shortest makespan), or shortest first (--order short-first: the most
            # finished comparisons when the study is stopped early and resumed later); then --runs: the
            # first matching pattern decides the place (a stable sort)
            queue.sort(key=lambda r: _cost(r, self.p) * (1 if self.short_first else -1))
            queue.sort(key=lambda r: _pattern_index(r.name, self.select or ["*"]))

        add(runs)
        out: Dict[str, dict] = {}
        with ThreadPoolExecutor(jobs) as pool:
            running: Dict[Future, Run] = {}
            while queue or running:
                while queue and len(running) < jobs:
                    r = queue.pop(0)
                    running[pool.submit(self.train, r)] = r
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    out[running.pop(f).name] = f.result()
                if more is not None:
                    try:
                        add(more())
                    except Exception as e:  # a planning error must not idle the slots while the others train
                        log(f"the runs that wait for finished ones could not be planned ({type(e).__name__}: {e}); "
                            "this command plans them again after the runs it has started")
                        more = None
        return {**kept, **out}


def _pattern_index(name: str, patterns: Sequence[str]) -> Optional[int]:
    """The index of the first shell-style pattern (``fnmatch``) that ``name`` matches, else None."""
    return next((i for i, pat in enumerate(patterns) if fnmatch.fnmatchcase(name, pat)), None)


def _cost(r: Run, p: Preset) -> float:
    """The run's relative training time (for the order of the runs): layers times micro-batches."""
    from deepnmt_fairseq.memories.msc import encoder_layers_of

    flags = dict(zip(r.model[:-1], r.model[1:]))  # a flag given twice: the last wins, as in fairseq
    dec = int(flags.get("--decoder-layers", 0))
    enc = int(flags.get("--encoder-layers", 0)) or encoder_layers_of(flags.get("--msc-block-layers"), dec) or 0
    return ((enc + 1.5 * dec + 2) * (r.updates or p.updates) * (r.update_freq or 1)
            * (2.5 if "collapse_reducing" in r.crit else 1.0))


def _portable(cmd: Sequence[str]) -> str:
    """The command as a user of a fresh clone would type it (repository-relative paths,
    console scripts by name, the plugin as $(deepnmt-user-dir))."""
    words = [str(w) for w in cmd]
    if words:
        words[0] = Path(words[0]).name
    words = ["$(deepnmt-user-dir)" if w == USER_DIR else w for w in words]
    return " ".join(w if w.startswith("$(") else shlex.quote(w.replace(str(REPO) + "/", "")) for w in words)


def gpkd_student_runs(study: Study, p: Preset, seeds, jobs: int) -> List[Run]:
    """SKD data from the averaged teacher (Sec. 3.2), then the students."""
    teacher = study.dir(teacher_run(p).name)
    avg = teacher / "checkpoint_avg.pt"
    skd = study.work / "skd-bin"
    h = p.teacher_layers // p.depths[0]
    student = study.work / "student-init.pt"
    shape = model_flags(p, p.depths[0], p.decoder_layers)
    runs = (seeded(f"gpkd-student-{p.depths[0]}", seeds, model=shape, data=skd, init=("finetune", student))
            + seeded(f"skd-only-{p.depths[0]}", seeds, model=shape, data=skd)
            # matched compute: trained from scratch as long as the GPKD student in all (teacher + student)
            + seeded(f"skd-only-{p.depths[0]}-matched", seeds, model=shape, data=skd, updates=matched_updates(p)))
    if all(study.result(r.name) is not None for r in runs if study.selected(r.name)):
        return runs  # all finished (here or in the records) or not trained by this command: nothing to build
    if not ((skd / ".done").exists() and student.exists()) and not avg.exists():
        study.rebuild(teacher_run(p))
    # the one GPKD planner's stages (deepnmt_fairseq.distill.plan): SKD from the averaged teacher,
    # then one layer per group with h = the group size the teacher was GP-trained with (Eq. 4)
    if not (skd / ".done").exists():  # the marker of gpkd_plan.skd_stage's output
        log("SKD data: the averaged teacher translates the training set")
        study.call(gpkd_plan.skd_stage(study.data, avg, skd, study.device(),
                                       ["--batch-size", "128", "--shards", jobs, "--jobs", jobs]), study.work / "skd.log")
    if not student.exists():
        h_enc, h_dec = teacher_group_sizes(avg)
        if h_enc != h:
            raise RuntimeError(f"{avg}: GP-trained with h = {h_enc}, the study's students need h = {h}")
        study.call(gpkd_plan.extract_stage(avg, h_enc, h_dec, student), study.work / "extract-student.log")
    return runs


def teacher_group_sizes(checkpoint: Path) -> Tuple[int, int]:
    """The GP group sizes a teacher checkpoint was trained with (the planner's h rule)."""
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint
    from deepnmt_fairseq.modules.student_extraction import model_args

    return gpkd_plan.extraction_group_sizes(model_args(load_checkpoint(str(checkpoint))))


def ssl_stage2_runs(study: Study, p: Preset, seeds) -> List[Run]:
    """Stage 2 continues stage 1's best checkpoint (weights, Adam state, schedule, update count)."""
    s1 = study.dir(ssl_stage1(p).name)
    best = s1 / "checkpoint_best.pt"
    # the best update as recorded (its checkpoint may be in another checkout's work directory)
    start = (study.result(ssl_stage1(p).name) or {}).get("best_update") or study.updates_of(best)
    total = start + int(p.updates * p.stage2_factor)
    model = model_flags(p, p.ssl_layers, p.decoder_layers)
    init = ("continue", best)
    runs = (seeded(f"ssl-stage2-skip-{p.ssl_layers}", seeds, model=model + ["--ssl-rate", "0.4"], updates=total,
                   init=init)
            + seeded(f"ssl-stage2-plain-{p.ssl_layers}", seeds, model=model, updates=total, init=init))
    if not best.exists() and any(study.result(r.name) is None for r in runs if study.selected(r.name)):
        study.rebuild(ssl_stage1(p))
    return runs


# --------------------------------------------------------------------------------- data
def prepare(p: Preset, work: Path) -> Tuple[Path, Path]:
    """The binarized corpus (:func:`deepnmt_data.small_corpus.prepare`, the quickstart's tokenization
    and BPE) plus the ``trainsample`` split: the first ``train_sample`` training pairs, binarized with
    the same dictionary."""
    from deepnmt_data import small_corpus  # the one data preparation (the quickstart's too)
    from deepnmt_data.preprocess import preprocess_argv
    from deepnmt_fairseq.console import child_env, exe

    corpus = Path(p.corpus) if p.corpus else small_corpus.EMBEDDED
    if not corpus.is_absolute():
        corpus = REPO / corpus
    if not corpus.exists():
        raise SystemExit(f"corpus {corpus} not found (preset {p.name}); build it with "
                         "python scripts/build_evidence_corpus.py")
    if p.subset:
        corpus = _subset(corpus, work / "corpus", *p.subset)
    data = small_corpus.prepare(work, p.bpe, corpus, log=log, binarize=lambda argv: small_corpus.fairseq_preprocess(
        argv, env=child_env(dict(os.environ, PYTHONUNBUFFERED="1")), log=log))
    tok = work / "tok"
    if not (data / "trainsample.en-de.de.bin").exists():
        for lang in ("en", "de"):
            for kind in ("bpe", "raw"):
                lines = (tok / f"train.{kind}.{lang}").read_text(encoding="utf-8").splitlines()[:p.train_sample]
                (tok / f"trainsample.{kind}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp = work / "trainsample-bin"
        shutil.rmtree(tmp, ignore_errors=True)
        small_corpus.fairseq_preprocess(
            preprocess_argv("en", "de", tmp, testpref=tok / "trainsample.bpe", srcdict=data / "dict.en.txt",
                            tgtdict=data / "dict.de.txt", workers=1), log=None, quiet=True)
        for f in tmp.glob("test.en-de.*"):
            shutil.copy(f, data / f.name.replace("test.", "trainsample.", 1))
        shutil.rmtree(tmp)
    return data, tok


def data_fingerprint(data: Path) -> dict:
    """sha256 of every file fairseq reads from the binarized directory (its dictionaries, ``.bin`` and
    ``.idx`` files), and one sha256 over them all."""
    import hashlib

    from deepnmt_data.prepare.archives import hash_file

    files = {f.name: hash_file(f)["sha256"] for f in sorted(data.iterdir())
             if f.is_file() and (f.suffix in (".bin", ".idx") or (f.name.startswith("dict.") and f.suffix == ".txt"))}
    if not files:
        raise SystemExit(f"{data}: no binarized data (dict.*.txt, *.bin, *.idx) to fingerprint")
    whole = hashlib.sha256("".join(f"{k} {v}\n" for k, v in files.items()).encode()).hexdigest()
    return {"sha256": whole, "files": files}


def check_data(data: Path, records: Path) -> dict:
    """Refuse to add runs to a records directory whose runs were trained on other data.  The study
    rebuilds its data on every new machine or work directory (tokenization, BPE, binarization are
    deterministic); this guard makes that a checked fact, not an assumption: the first command stamps
    ``<records>/data.json``, and a command whose rebuilt data differs stops before training, naming the
    files that differ.  A records directory made before the stamp existed is stamped by its next command
    (issue 77: the cpu records were stamped on 2026-12-07; the earlier ones were checked by two restarted
    runs' valid NLL against their partial records: equal to 3 decimals at updates 50-200 and within 0.003
    to update 400, the drift of another CPU type, Intel Xeon against AMD EPYC)."""
    stamp = records / DATA_STAMP
    now = data_fingerprint(data)
    if stamp.exists():
        old = json.loads(stamp.read_text())
        if old.get("sha256") != now["sha256"]:
            was, is_ = old.get("files", {}), now["files"]
            differ = sorted(k for k in set(was) | set(is_) if was.get(k) != is_.get(k))
            raise SystemExit(
                f"the binarized data in {data} is not the data the runs of {records} were trained on "
                f"({stamp.name}: sha256 {old.get('sha256', '?')[:16]}, now {now['sha256'][:16]}; files that differ: "
                f"{', '.join(differ)}).  Its finished runs would be compared with runs on other data.  Build the data "
                f"as they were (the same corpus, BPE merges and code), or give this data its own --records and "
                f"--work-dir")
        return old
    records.mkdir(parents=True, exist_ok=True)
    write_atomic(stamp, json.dumps({**now, "stamped": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                                   indent=1, sort_keys=True) + "\n")
    log(f"stamped {stamp} with the data's fingerprint (sha256 {now['sha256'][:16]})")
    return now


def _subset(corpus: Path, out: Path, train: int, held_out: int) -> Path:
    """The first lines of every split (the tiny preset)."""
    import gzip

    if not (out / ".done").exists():
        out.mkdir(parents=True, exist_ok=True)
        for split in ("train", "valid", "test"):
            for lang in ("en", "de"):
                with gzip.open(corpus / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                    lines = [next(f) for _ in range(train if split == "train" else held_out)]
                with gzip.open(out / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                    f.writelines(lines)
        (out / ".done").write_text("")
    return out


def partial_record(log_file: Path) -> Optional[dict]:
    """What the ``train.log`` of an unfinished run says: its last update, train loss (mean of the last
    5 logged intervals, as a finished record's), updates per second, and every validation's valid NLL
    (fairseq's ``valid_nll_loss``: bits/token of the valid references under the training model, no
    label smoothing, dropout off).  No checkpoint is read and no test sentence is translated: a
    partial record makes no call (:func:`study.report.partial_table`).  None: nothing logged yet."""
    from deepnmt_fairseq.analysis.logs import read_json_log, series

    if not log_file.exists():
        return None
    recs = read_json_log(str(log_file))
    losses = series(recs, "loss")
    if not losses:
        return None
    ups = series(recs, "ups")
    valid = series(recs, "valid_nll_loss", tag="valid", updates="valid_num_updates")
    return {"unfinished": True, "updates": losses[-1][0], "final_train_loss": final_loss(losses),
            "updates_per_second": ups[-1][1] if ups else None,
            "valid_log": [[u, round(v, 3)] for u, v in valid]}


CHANGE_KEYS = ("enc_dF", "enc_dW", "enc_gnorm")


def change_log(log_file: Path) -> List[dict]:
    """The diagnostics of ``--log-change-norms``/``--log-grad-norms-every`` in a run's ``train.log``: one
    entry per diagnostic update, ``{"update": steps taken, "enc_dF": [layer 1 ... N], "enc_dW": [...],
    "enc_gnorm": [...]}`` (4 significant digits; the module docstring of deep_translation.py says what
    each is)."""
    from deepnmt_fairseq.analysis.logs import diagnostics, read_json_log

    if not log_file.exists():
        return []
    xs, vals = diagnostics(read_json_log(str(log_file)), r"delta_update|(enc_dF|enc_dW|enc_gnorm)_\d+")
    out = []
    for k, x in enumerate(xs):
        entry = {"update": int(vals["delta_update"][k]) if "delta_update" in vals else int(x) - 1}
        for key in CHANGE_KEYS:
            layers = sorted((n for n in vals if n.startswith(key + "_")), key=lambda n: int(n.rsplit("_", 1)[1]))
            entry[key] = [float(f"{vals[n][k]:.4g}") for n in layers]
        out.append(entry)
    return out


def _partial_updates(path: Optional[Path]) -> int:
    """The updates a partial record (:meth:`Study._keep_partial`) reached; 0 where there is none, or it
    cannot be read (then any new partial record may replace it)."""
    try:
        return int(json.loads(path.read_text()).get("updates") or 0) if path is not None else 0
    except (OSError, ValueError, AttributeError):
        return 0


def final_loss(losses: List[Tuple[int, float]]) -> float:
    """A run's train loss: the mean of its last five logged intervals (NaN: none logged)."""
    return round(statistics.fmean(v for _, v in losses[-5:]), 3) if losses else math.nan


def machine(threads: Optional[int] = None, cuda: bool = False) -> Dict[str, object]:
    """What a run's floating-point results depend on beyond its command: torch's version, the CPU and the
    kernels torch picks for it, the GPU.  One seeded command gives the same losses on one kind of machine;
    kernels for another instruction set may round differently, and the runs then drift apart.  With
    ``threads``, also the torch threads of the command that finished the run (``--threads``): they set
    its speed (``train_seconds``), not its losses."""
    import torch

    from deepnmt_fairseq.machine import cpu_kernels, cpu_model

    out = {"torch": torch.__version__, "cpu": cpu_model(), "kernels": cpu_kernels()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    if threads is not None:
        out["threads"] = threads
    if cuda:  # a float32 preset trained and evaluated on the GPU (--cuda), not on this CPU
        out["device"] = "cuda"
    return out


def _add_seconds(path: Path, seconds: float) -> float:
    """Adds ``seconds`` to the total kept in ``path``; returns the new total."""
    total = (float(path.read_text()) if path.exists() else 0.0) + seconds
    path.write_text(f"{total:.1f}\n")
    return total


def run_study(study: Study, p: Preset, only: Sequence[str], seeds: Sequence[int], jobs: int) -> None:
    # phase 1: everything that depends on nothing, and, as soon as what they wait for has finished, issue 77's
    # tuning chain (the pre-norm check, the pre-norm sweep, the converged runs at the chosen recipes): these
    # need only finished records, so a long run of this phase (Admin's large batch) does not hold them back
    tuning: set = set()

    def ready(tried: frozenset = frozenset()) -> List[Run]:
        runs = [r for r in tuning_runs(study, p, only, seeds) if r.name not in tried]
        tuning.update(r.name for r in runs)
        return runs

    results = study.run_all(independent_runs(p, only, seeds) + ready(), jobs, more=ready)
    # phase 2: what depends on phase 1
    dec = None
    if "deep-decoder" in only:
        missing = [r.name for r in dd_search_runs(p, seeds[0]) if study.result(r.name) is None]
        if missing:  # failed, not diverged: a re-run retries it; the depth is chosen from the whole search
            log(f"deep decoder: the search is incomplete ({', '.join(missing)}), so no depth is chosen yet")
            only = [s for s in only if s != "deep-decoder"]
        else:
            dec, why = choose_dd_depth(p, results, seeds[0])
            for d in {study.work, study.records} - {None}:
                d.mkdir(parents=True, exist_ok=True)
                (d / "dd-depth.json").write_text(json.dumps({"depth": dec, "why": why}) + "\n")
            log(f"deep decoder: {why}")
    # the tuning chain goes on here for what phase 2 makes ready; a run phase 1 tried (one that failed) is
    # tried once per command, as in the other phases
    tried = frozenset(tuning)
    todo = [r for r in dependent_runs(study, p, only, seeds, results, dec, jobs) if r.name not in tried]
    study.run_all(todo, jobs, more=lambda: ready(tried))
    # phase 3: a third seed of both systems of every close headline comparison (issue 16)
    close, seed = close_systems(p, finished(study.work, study.records), dec), [max(seeds) + 1]
    # only the studies with a close comparison (a dependent run may need a checkpoint rebuilt)
    pairs = headline_pairs(p, dec)
    only = [s for s in only if any(n in close for pair in pairs.get(s, []) for n in pair)]  # the sweep: none
    third = [r for r in independent_runs(p, only, seed) + dependent_runs(study, p, only, seed, results, dec, jobs)
             if r.system in close and r.seed == seed[0]]  # (teacher_runs and ssl_stage1 add seed 1)
    if third:
        log(f"a third seed (under {p.close_bleu} BLEU apart): {', '.join(r.name for r in third)}")
        study.run_all(third, jobs)


def tuning_runs(study: Study, p: Preset, only: Sequence[str], seeds: Sequence[int]) -> List[Run]:
    """The runs of issue 77 that wait for the sweep, not finished yet, as the finished runs plan them: the
    pre-norm check at the post-norm column's chosen point (part 2), the pre-norm families' sweep where the
    check calls for one, and the converged runs again at the sweep's recipes (part 3).  The scheduler asks
    again after each finished run (``run_all``'s ``more``), since each of these can wait for the one before."""
    done, runs = finished(study.work, study.records), []
    if "postnorm-sweep" in only:
        runs += prenorm_check_runs(p, done) + prenorm_sweep_runs(p, done)
    if "converged" in only:
        runs += retuned_runs(p, seeds, done)
    return [r for r in runs if study.result(r.name) is None]


def dependent_runs(study: Study, p: Preset, only: Sequence[str], seeds: Sequence[int], results: Dict[str, dict],
                   dec: Optional[int], jobs: int) -> List[Run]:
    """The seeded runs that need phase 1's results: the deep-decoder comparison at the searched
    depth ``dec`` (its plain decoder's first seed is the search's run of that depth, same name
    and settings, so it is not trained again), the GPKD students (after the SKD data) and the
    skipping sub-layer's second stage."""
    runs: List[Run] = []
    if "deep-decoder" in only:
        runs += dd_compare_runs(p, dec, seeds)
    if "gpkd" in only and not results.get(teacher_run(p).name, {}).get("diverged", True):
        runs += gpkd_student_runs(study, p, seeds, jobs)
    if "ssl" in only and not results.get(ssl_stage1(p).name, {}).get("diverged", True):
        runs += ssl_stage2_runs(study, p, seeds)
    runs += tuning_runs(study, p, only, seeds)
    if "converged" in only:  # the deepest depth's transparent variant: the better one at the middle depth
        runs += [r for r in converged_runs(p, seeds, finished(study.work, study.records))
                 if study.result(r.name) is None]
    return runs
