"""The evidence study (study/cli.py, issue 16): the whole pipeline at tiny size (every
comparison, 2 seeds, the report), its resumability, and the report's statistics.

benchmarks/ is importable through the pythonpath option of pytest (pyproject.toml)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest


def _run(system, seed, bleu, **extra):
    return {"name": f"{system}-s{seed}", "system": system, "seed": seed, "command": f"fairseq-train ... {system}",
            "eval_command": f"python study/evaluate.py ... {system}", "returncode": 0,
            "losses": [(10, 8.0), (20, 7.0)], "final_train_loss": 7.0, "diverged": False, "valid_nll": 6.5,
            "bleu": bleu, "train_bleu": bleu + 5, **extra}


def test_verdict_calls_a_difference_only_beyond_both_spreads():
    from study.plan import stat
    from study.report import verdict

    a = [_run("a", 1, 14.0), _run("a", 2, 15.0)]
    b = [_run("b", 1, 12.0), _run("b", 2, 12.5)]
    assert stat(a, "bleu") == (14.5, 1.0, 2)
    assert verdict("a", a, "b", b).startswith("a better than b: +2.25 bleu")
    close = [_run("c", 1, 13.0), _run("c", 2, 14.6)]  # diff 0.7 < spread 1.6
    assert "no difference" in verdict("c", close, "a", a)
    assert "fewer than 2 seeds" in verdict("a", a, "b", b[:1])
    # lower is better for losses and a diverged seed has no value
    worse = [_run("d", 1, 1.0, valid_nll=9.0), _run("d", 2, 1.0, valid_nll=9.1)]
    assert verdict("d", worse, "a", a, "valid_nll", higher_better=False).startswith("d worse than a")


def test_paired_bootstrap_is_sacrebleus_bleu_resampled_over_the_same_sentences():
    """The per-sentence statistics sum to sacreBLEU's corpus score (its 'exp' smoothing included);
    the bootstrap is deterministic, finds a system that is better on most sentences, and does not
    find one that differs on a single sentence of 60."""
    import random

    import numpy as np
    import sacrebleu
    from study.stats import (_bleu_rows, bleu_from_stats, decode_stats, encode_stats, paired_bootstrap,
                                sentence_stats)

    rng = random.Random(3)
    words = "der die das haus ist gut ein mann frau kind und oder nicht".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(60)]
    noisy = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 9))) for _ in range(60)]
    for hyps in (noisy, refs, noisy[:7] + refs[7:]):
        st = sentence_stats(hyps, refs)
        assert decode_stats(encode_stats(st)) == st
        corpus = sacrebleu.corpus_bleu(hyps, [refs]).score
        assert abs(bleu_from_stats(np.sum(st, 0)) - corpus) < 1e-9
        assert abs(_bleu_rows(np.sum(st, 0, keepdims=True))[0] - corpus) < 1e-6
    good = [sentence_stats([r if i % 5 else n for i, (r, n) in enumerate(zip(refs, noisy))], refs)]
    bad = [sentence_stats(noisy, refs)]
    res = paired_bootstrap(good, bad, samples=300)
    assert res["delta"] > 30 and res["p"] < 0.01 and res["low"] > 0 and res == paired_bootstrap(good, bad, samples=300)
    one_off = [sentence_stats(refs[:59] + noisy[59:], refs)]
    assert paired_bootstrap([sentence_stats(refs, refs)], one_off, samples=300)["p"] > 0.05
    assert paired_bootstrap(good, [None]) is None and paired_bootstrap(good, [st[:10]]) is None


def test_a_call_beyond_the_seed_spreads_needs_the_paired_bootstrap_too():
    """Two systems whose seeds agree exactly (spread 0) and differ on one test sentence of 60: the
    seed rule alone would call it; the paired bootstrap does not, so the verdict is no difference.
    Records without sentence statistics are called on the spreads and say so."""
    import random

    from study.report import verdict
    from study.stats import encode_stats, sentence_stats

    rng = random.Random(4)
    words = "der die das haus ist gut ein mann frau kind und oder nicht".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(60)]
    other = refs[:59] + ["und oder nicht"]
    a = [_run("a", s, 100.0, test_stats=encode_stats(sentence_stats(refs, refs))) for s in (1, 2)]
    b = [_run("b", s, 98.5, test_stats=encode_stats(sentence_stats(other, refs))) for s in (1, 2)]
    v = verdict("a", a, "b", b)
    assert "no difference" in v and "not over the test sentences" in v and "paired bootstrap over 60" in v
    assert verdict("a", [dict(r, test_stats=None) for r in a], "b", b).startswith("a better than b")
    assert "no paired bootstrap" in verdict("a", [dict(r, test_stats=None) for r in a], "b", b)


def test_the_deep_decoder_depth_is_chosen_on_valid_only():
    """The search compares valid NLL and the (valid) UNK-source gap with the shallow decoder; test
    BLEU, however it is set, changes nothing."""
    from study.plan import PRESETS, choose_dd_depth

    p = PRESETS["cpu"]  # dd_depths (3, 6, 12)

    def res(nll6, gap6, bleu6):
        runs = {3: (4.55, 2.7, 14.9), 6: (nll6, gap6, bleu6), 12: (4.43, 3.9, 17.7)}
        return {f"dd-plain-6-{d}-s1": {"valid_nll": v, "unk_gap": g, "bleu": b} for d, (v, g, b) in runs.items()}

    assert choose_dd_depth(p, res(4.60, 2.5, 99.0), 1)[0] == 6  # worse on valid, less source-dependent
    assert choose_dd_depth(p, res(4.50, 2.5, 0.0), 1)[0] == 12  # better on valid: not the premise
    assert choose_dd_depth(p, res(4.60, 2.9, 0.0), 1)[0] == 12  # more source-dependent: not the premise


def test_report_tables_have_mean_and_spread_per_system_and_every_command(tmp_path, monkeypatch):
    from study import plan
    from study import report as study_report

    monkeypatch.setattr(study_report, "FINDINGS", tmp_path / "none.md")
    p = plan.PRESETS["cpu"]
    results = {}
    for fam in plan.FAMILIES:
        for n in p.depths:
            for seed in (1, 2):
                r = _run(f"{fam}-{n}", seed, 10.0 + seed + n / 6)
                results[r["name"]] = r
    results["postnorm-24-s2"].update(diverged=True, returncode=1)
    del results["postnorm-24-s2"]["bleu"]
    for seed in (1, 2):
        for kind in plan.DD_KINDS:
            r = _run(f"dd-{kind}-6-12", seed, 9.0 + seed, unk_gap=0.5 * seed)
            results[r["name"]] = r
    (tmp_path / "dd-depth.json").write_text(json.dumps({"depth": 12, "why": "12 layers: lower BLEU"}))
    report = tmp_path / "fidelity.md"
    study_report.write_report(results, p, report, tmp_path)
    text = report.read_text()
    depth = text.split("\n## 1. Depth")[1].split("\n## ")[0]
    assert "| msc-12 | 1,2 | 7.000 ± 0.000 | 6.500 ± 0.000 | 13.50 ± 1.00 | 18.50 ± 1.00 |" in depth
    assert "| postnorm-24 | 1,2 (1 failed/diverged: seed 2) |" in depth and "15.00 (1 seed)" in depth
    assert "12 layers: lower BLEU" in text and "| dd-cad-crt-6-12 | 1,2 |" in text
    for name, r in results.items():  # the command of every number
        assert f"- `{name}`: `{r['command']}`; metrics: `{r['eval_command']}`" in text
    assert (tmp_path / "img" / "fidelity-cpu-depth.png").stat().st_size > 1000


def test_tiny_study_runs_every_comparison_with_two_seeds_and_resumes(tmp_path):
    """The whole pipeline at tiny size: depth, deep-decoder search and comparison, GPKD (teacher,
    SKD from the averaged teacher, extracted and scratch students), two-stage skipping; then a
    re-run recomputes nothing. Before it, a run whose deadline has passed starts nothing."""
    import torch

    from study import cli as study_cli
    from study import plan

    work, report = tmp_path / "work", tmp_path / "fidelity.md"
    args = ["--preset", "tiny", "--work-dir", str(work), "--report", str(report), "--jobs", "2"]
    # a deadline that has passed: nothing starts, the report is written, exit code 3, no depth chosen
    assert study_cli.main(args + ["--deadline-minutes", "0"]) == 3
    assert not list(work.glob("runs/*/done.json")) and report.exists() and not (work / "dd-depth.json").exists()
    assert study_cli.main(args) == 0
    p = plan.PRESETS["tiny"]
    done = {d.parent.name: json.loads(d.read_text()) for d in (work / "runs").glob("*/done.json")}
    dec = json.loads((work / "dd-depth.json").read_text())["depth"]
    systems = [f"{fam}-{n}" for fam in p.families for n in p.depths]
    systems += [f"dd-{k}-{p.dd_encoder}-{dec}" for k in plan.DD_KINDS] + [f"dd-plain-{p.dd_encoder}-{p.dd_depths[0]}"]
    systems += [f"gpkd-teacher-{p.teacher_layers}", f"gpkd-student-{p.depths[0]}", f"skd-only-{p.depths[0]}"]
    systems += [f"ssl-stage2-{k}-{p.ssl_layers}" for k in ("skip", "plain")]
    for system in systems:
        for seed in (1, 2):
            r = done[f"{system}-s{seed}"]
            assert not r["diverged"] and {"valid_nll", "bleu", "train_bleu"} <= set(r), r
            # what a rebuild on another machine needs to explain a drift: the kernels torch picked here
            assert r["machine"]["kernels"] == torch.backends.cpu.get_cpu_capability() and r["machine"]["cpu"]
            assert r["machine"]["threads"] == 1  # --threads' default: what train_seconds was measured with
    assert all("unk_gap" in done[f"dd-{k}-{p.dd_encoder}-{dec}-s1"] for k in plan.DD_KINDS)
    assert {f"dd-plain-{p.dd_encoder}-{d}-s1" for d in p.dd_depths} <= set(done)
    # GPKD: the student starts from one layer per group of the *averaged* GP teacher of seed 1
    skd_log = (work / "skd.log").read_text()
    assert f"gpkd-teacher-{p.teacher_layers}-s1/checkpoint_avg.pt" in skd_log and "-s2/" not in skd_log
    teacher = shlex.split(done[f"gpkd-teacher-{p.teacher_layers}-s1"]["command"])
    assert teacher[teacher.index("--gp-group-size") + 1] == str(p.teacher_layers // p.depths[0])
    student = shlex.split(done[f"gpkd-student-{p.depths[0]}-s1"]["command"])
    assert "--finetune-from-model" in student and student[1].endswith("skd-bin")
    assert (work / "skd-bin" / ".done").exists() and (work / "student-init.pt").exists()
    # skipping: stage 2 continues stage 1 (no warm-up restart), with and without skipping
    s1 = done[f"ssl-stage1-{p.ssl_layers}-s1"]
    for kind in ("skip", "plain"):
        cmd = shlex.split(done[f"ssl-stage2-{kind}-{p.ssl_layers}-s1"]["command"])
        assert "--continue-once" in cmd and cmd[cmd.index("--continue-once") + 1].endswith("checkpoint_best.pt")
        assert int(cmd[cmd.index("--max-update") + 1]) == s1["best_update"] + int(p.updates * p.stage2_factor)
        assert ("--ssl-rate" in cmd) == (kind == "skip")
    text = report.read_text()
    for section in ("## 1. Depth", "## 2. Deep decoder", "## 3. GPKD", "## 4. Skipping sub-layer", "## Commands"):
        assert section in text
    # every run keeps sacreBLEU's statistics of each test sentence, and the calls use the paired bootstrap
    from study.stats import bleu_from_stats, decode_stats

    n_test = len((work / "tok" / "test.raw.de").read_text().splitlines())
    for r in done.values():
        if "bleu" in r:
            st = decode_stats(r["test_stats"])
            assert len(st) == n_test and abs(bleu_from_stats([sum(c) for c in zip(*st)]) - r["bleu"]) < 0.006
    assert "paired bootstrap over" in text and "no paired bootstrap" not in text
    # matched compute: the baseline and the SKD-only student trained as long as teacher + student
    for name in (f"prenorm-{p.depths[0]}-matched", f"skd-only-{p.depths[0]}-matched"):
        for seed in (1, 2):
            cmd = shlex.split(done[f"{name}-s{seed}"]["command"])
            assert cmd[cmd.index("--max-update") + 1] == str(plan.matched_updates(p))
            assert ("skd-bin" in cmd[1]) == name.startswith("skd-only")
    assert any(f"gpkd-student-{p.depths[0]} {how} prenorm-{p.depths[0]}-matched" in text
               for how in ("vs", "better than", "worse than", "narrowly better than", "narrowly worse than"))
    # the converged comparison: 3 seeds, early stopping on valid loss, curve checkpoints kept and evaluated
    conv = {f"conv-{fam}-{n}-s{s}" for fam in p.families for n in p.depths for s in (1, 2, 3)}
    assert conv <= set(done) and "## 1b. Depth, converged" in text
    for name in conv:
        r, cmd = done[name], shlex.split(done[name]["command"])
        assert cmd[cmd.index("--patience") + 1] == str(p.converged_patience)
        assert cmd[cmd.index("--max-update") + 1] == str(p.converged_cap)
        assert cmd[cmd.index("--keep-interval-updates-pattern") + 1] == str(p.curve_every)
        assert r["curve"] and all(pt["updates"] % p.curve_every == 0 and "bleu" in pt for pt in r["curve"])
        assert all("train_bleu" not in pt and pt["test_stats"] for pt in r["curve"])  # curve points skip it
        assert r["stopped_at"] <= p.converged_cap
    assert "test BLEU sd" in text and f"| system | {p.curve_every} |" in text  # 1b: sd and the curve table
    # resumable: a second run trains nothing and leaves every result as it was
    stamps = {n: (work / "runs" / n / "done.json").stat().st_mtime_ns for n in done}
    assert study_cli.main(args) == 0
    assert {n: (work / "runs" / n / "done.json").stat().st_mtime_ns for n in done} == stamps
    # every result is also a record (committed for the real presets; a fresh clone reuses them:
    # test_a_fresh_clone_reuses_the_records_and_rebuilds_only_what_a_lost_run_needs)
    records = work / "records"
    assert {f.stem for f in records.glob("*.json") if f.name not in plan.NOT_RUNS} == set(done)
    assert all(json.loads((records / f"{n}.json").read_text()) == r for n, r in done.items())
    assert json.loads((records / "dd-depth.json").read_text())["depth"] == dec


def test_a_fresh_clone_reuses_the_records_and_rebuilds_only_what_a_lost_run_needs(tmp_path):
    """The records of finished runs (committed for the real presets) are all a fresh clone has of
    them: its empty work directory trains nothing and writes the same report.  A run lost before it
    finished, whose input is the checkpoint of a recorded run, has that run trained again first
    (deterministically: it reproduces its record).  The skipping study at tiny size: stage 1, then
    stage 2 with 2 seeds, with and without skipping."""
    from study import cli as study_cli
    from study import plan

    p = plan.PRESETS["tiny"]
    work, records = tmp_path / "work", tmp_path / "records"
    first = ["--preset", "tiny", "--work-dir", str(work), "--report", str(tmp_path / "first.md"), "--only", "ssl",
             "--records", str(records)]
    assert study_cli.main(first) == 0
    done = plan.finished(work)
    assert len(done) == 5 and plan.finished(work, records) == done
    fresh = tmp_path / "fresh"
    again = ["--preset", "tiny", "--work-dir", str(fresh), "--report", str(tmp_path / "again.md"), "--only", "ssl",
             "--records", str(records)]
    assert study_cli.main(again) == 0
    assert not list(fresh.glob("runs/*")) and plan.finished(fresh, records) == done
    strip = lambda path: [line for line in path.read_text().splitlines() if not line.startswith("Generated by")]
    assert strip(tmp_path / "again.md") == strip(tmp_path / "first.md")
    stage2 = f"ssl-stage2-skip-{p.ssl_layers}-s2"
    (records / f"{stage2}.json").unlink()
    assert study_cli.main(again) == 0
    rebuilt = {d.parent.name for d in fresh.glob("runs/*/done.json")}
    assert rebuilt == {stage2, f"ssl-stage1-{p.ssl_layers}-s1"}
    assert not list(records.glob("*.rebuilt.json"))  # nothing differed from its record
    for n in rebuilt:
        r = json.loads((records / f"{n}.json").read_text())
        assert {k: r.get(k) for k in plan.REPRODUCED} == {k: done[n].get(k) for k in plan.REPRODUCED}, n
    # --add-statistics: a record made before the sentence statistics were kept (round 1) gains them
    # from a retrained run that reproduces it; one that would not reproduce keeps its record as it is
    plain1, skip1 = f"ssl-stage2-plain-{p.ssl_layers}-s1", f"ssl-stage2-skip-{p.ssl_layers}-s1"
    for n in (plain1, skip1):
        r = json.loads((records / f"{n}.json").read_text())
        assert r.pop("test_stats")
        if n == skip1:
            r["bleu"] += 1.0  # as if the retrained run did not reproduce it
        (records / f"{n}.json").write_text(json.dumps(r, indent=1) + "\n")
    old = {n: (records / f"{n}.json").read_text() for n in (plain1, skip1, stage2)}
    assert study_cli.main(again + ["--add-statistics", "--runs", "ssl-stage2-*-s1"]) == 0
    gained = json.loads((records / f"{plain1}.json").read_text())
    assert gained["test_stats"] == done[plain1]["test_stats"]
    assert {k: v for k, v in gained.items() if k != "test_stats"} == json.loads(old[plain1])
    assert (records / f"{skip1}.json").read_text() == old[skip1]  # the record stays
    assert json.loads((records / f"{skip1}.rebuilt.json").read_text())["test_stats"] == done[skip1]["test_stats"]
    assert (records / f"{stage2}.json").read_text() == old[stage2]  # not selected, had its statistics


def test_a_work_dir_of_other_settings_is_refused(tmp_path, monkeypatch):
    """Finished runs are reused by name, so a work directory made with other settings is refused."""
    import dataclasses

    from study import cli as study_cli
    from study import plan

    (tmp_path / "preset.json").write_text(json.dumps(dataclasses.asdict(
        dataclasses.replace(plan.PRESETS["tiny"], lr=0.5)), default=list))
    with pytest.raises(SystemExit, match='other settings.*"lr": \\{"then": 0.5, "now": 0.001\\}.*--work-dir'):
        study_cli.main(["--preset", "tiny", "--work-dir", str(tmp_path), "--report-only"])


def test_post_norm_runs_use_the_presets_post_norm_schedule(tmp_path):
    """Post-norm and transparent-on-post-norm runs train at the preset's post-norm lr and warm-up
    (tuned at 6-3, study/findings.md); every other run at the shared ones."""
    import shlex

    from study import plan
    from study import run as runner

    p = plan.PRESETS["cpu"]
    assert p.postnorm_lr is not None and p.postnorm_lr != p.lr
    study = runner.Study(p, tmp_path, tmp_path / "bin", tmp_path / "tok", fork=False)
    seen = set()
    for r in plan.depth_runs(p, [1]):
        cmd = shlex.split(runner._portable(study.train_command(r)))
        lr, warmup = float(cmd[cmd.index("--lr") + 1]), int(cmd[cmd.index("--warmup-updates") + 1])
        post = "--post-norm" in cmd
        assert (lr, warmup) == ((p.postnorm_lr, p.postnorm_warmup) if post else (p.lr, p.warmup)), r.name
        seen.add(r.system.rsplit("-", 1)[0] if post else None)
    assert {"postnorm", "transparent-post"} <= seen


def test_cuda_moves_a_float32_presets_commands_to_the_gpu_and_its_seconds_out_of_the_budget(tmp_path):
    """``--cuda`` (the cpu preset on a lent GPU): the same training and evaluation commands without
    ``--cpu``, TensorFloat-32 off, the records marked ``machine.device: cuda``; the status line's CPU
    budget is not set by their (GPU) seconds per update."""
    import shlex

    from study import plan
    from study import report as study_report
    from study import run as runner

    p = plan.PRESETS["cpu"]
    run = plan.depth_runs(p, [1])[0]
    cpu = runner.Study(p, tmp_path, tmp_path / "bin", tmp_path / "tok", fork=False)
    gpu = runner.Study(p, tmp_path, tmp_path / "bin", tmp_path / "tok", fork=False, cuda=True)
    on_cpu = shlex.split(runner._portable(cpu.train_command(run)))
    on_gpu = shlex.split(runner._portable(gpu.train_command(run)))
    assert "--cpu" in on_cpu and [a for a in on_cpu if a != "--cpu"] == on_gpu
    assert "--cpu" in cpu.eval_command(tmp_path / "c.pt", False) and "--cpu" not in gpu.eval_command(tmp_path / "c.pt", False)
    assert gpu.env["NVIDIA_TF32_OVERRIDE"] == "0" and "NVIDIA_TF32_OVERRIDE" not in cpu.env
    assert gpu.machine()["device"] == "cuda" and "device" not in cpu.machine()

    def rec(seconds, device=None):
        return {"train_seconds": seconds, "losses": [[1000, 5.0]],
                "machine": {"cpu": "x", **({"device": device} if device else {})}}

    missing = ["conv-prenorm-24-s2"]
    cpu_only = study_report.remaining_hours(p, missing, {"conv-prenorm-24-s1": rec(1000.0)})
    both = study_report.remaining_hours(p, missing, {"conv-prenorm-24-s1": rec(1000.0),
                                                        "conv-dlcl-24-s1": rec(10.0, "cuda"),
                                                        "conv-msc-24-s1": rec(10.0, "cuda")})
    assert cpu_only == both > 0
    # core-hours: a run that trained with 2 threads kept 2 cores busy for its wall seconds
    # (the same as 2000 s with 1 thread; the evaluation's fixed seconds are not per update)
    two = {"conv-prenorm-24-s1": {**rec(1000.0), "machine": {"cpu": "x", "threads": 2}}}
    assert study_report.remaining_hours(p, missing, two) == \
        study_report.remaining_hours(p, missing, {"conv-prenorm-24-s1": rec(2000.0)}) > cpu_only


class _RecordingStudy:
    """A Study that trains nothing: every run "finishes" with the test BLEU ``bleu(run)``, and the
    names it was asked to train are recorded (the scheduling of the third seed, without fairseq)."""

    def __init__(self, work, bleu, fail=()):
        self.work, self.bleu, self.trained, self.runs, self.fail = work, bleu, [], {}, set(fail)
        self.records, self.rebuilt = None, []

    def dir(self, name):
        return self.work / "runs" / name

    def selected(self, name):
        return True

    def result(self, name, work_only=False):
        done = self.dir(name) / "done.json"
        return json.loads(done.read_text()) if done.exists() else None

    def rebuild(self, r):  # a checkpoint that a later run needs (none here: nothing is written)
        self.rebuilt.append(r.name)

    @staticmethod
    def updates_of(ckpt):
        return 3200

    def run_all(self, runs, jobs, more=None):
        """In the order given (the real scheduler sorts by cost), then what ``more`` makes ready, once each."""
        out, todo = {}, list(runs)
        while todo:
            for r in todo:
                done = self.dir(r.name) / "done.json"
                if r.name in self.fail:  # failed without diverging (killed): not recorded, retried later
                    out[r.name] = {"name": r.name, "returncode": 1, "diverged": True}
                    continue
                if not done.exists():
                    self.trained.append(r.name)
                    self.runs[r.name] = r
                    done.parent.mkdir(parents=True, exist_ok=True)
                    done.write_text(json.dumps(_run(r.system, r.seed, self.bleu(r))))
                out[r.name] = json.loads(done.read_text())
            todo = [r for r in (more() if more else []) if r.name not in out]
        return out


@pytest.mark.parametrize("skip_gain, third", [(0.6, True), (1.6, False)])
def test_a_headline_difference_under_1_bleu_gets_a_third_seed(tmp_path, monkeypatch, skip_gain, third):
    """Issue 16: "3 [seeds] where the difference is under 1 BLEU". After the 2-seed runs of the
    skipping comparison, both of its systems get seed 3, trained as seeds 1-2 were (stage 2 from
    stage 1's best checkpoint); a difference of 1 BLEU or more gets none. The third seed is in the
    plan, and the report's call says it waits for it until it has run."""
    from study import plan
    from study import run as runner
    from study import report as study_report

    monkeypatch.setattr(study_report, "FINDINGS", tmp_path / "none.md")
    p = plan.PRESETS["cpu"]
    skip, plain = f"ssl-stage2-skip-{p.ssl_layers}", f"ssl-stage2-plain-{p.ssl_layers}"
    # seeds 1, 2: plain 17.0 / 18.0, skipping + skip_gain; a third seed moves skipping up by 1
    bleus = {plain: 17.0, skip: 17.0 + skip_gain}
    study = _RecordingStudy(tmp_path, lambda r: bleus.get(r.system, 15.0) + (r.seed - 1) % 2 + (r.seed == 3) * (
        r.system == skip))
    runner.run_study(study, p, ["ssl"], [1, 2], jobs=2)
    extra = {f"{skip}-s3", f"{plain}-s3"}
    assert set(study.trained) == {f"ssl-stage1-{p.ssl_layers}-s1", f"{skip}-s1", f"{skip}-s2", f"{plain}-s1",
                                  f"{plain}-s2"} | (extra if third else set())
    if third:
        s3, s1 = study.runs[f"{skip}-s3"], study.runs[f"{skip}-s1"]
        assert (s3.model, s3.init, s3.updates) == (s1.model, s1.init, s1.updates) and s3.seed == 3
    results = plan.finished(tmp_path)
    assert extra <= set(plan.planned(p, [1, 2], None, results)) or not third
    # before the third seed the call waits for it; after it, it is an ordinary call
    two = {n: r for n, r in results.items() if not n.endswith("-s3")}
    for res, waits in ((two, third), (results, False)):
        report = tmp_path / "fidelity.md"
        study_report.write_report(res, p, report, tmp_path)
        call = [line for line in report.read_text().splitlines() if line.startswith(f"- {skip}")]
        assert len(call) == 1 and ("a third seed is planned" in call[0]) == waits, call
        assert ("2 vs 2 seeds" if res is two or not third else "3 vs 3 seeds") in call[0]


def test_a_work_dir_from_before_a_new_setting_is_reused(tmp_path):
    """A setting added to Preset after a work directory was made counts as its default there, so
    the finished runs of a long study are not refused (close_bleu came after the CPU preset's runs)."""
    import dataclasses

    from study import cli as study_cli
    from study import plan

    old = dataclasses.asdict(plan.PRESETS["cpu"])
    assert old.pop("close_bleu") == 1.0  # the default
    for new_runs_only in plan.NEW_RUNS_ONLY:  # settings of runs added later: a directory without them has none
        old.pop(new_runs_only)
    (tmp_path / "preset.json").write_text(json.dumps(old, default=list))
    assert study_cli.main(["--preset", "cpu", "--work-dir", str(tmp_path), "--report-only",
                          "--report", str(tmp_path / "r.md")]) == 0
    assert json.loads((tmp_path / "preset.json").read_text())["converged_cap"] == plan.PRESETS["cpu"].converged_cap
    stamped = json.loads((tmp_path / "preset.json").read_text())
    stamped["converged_cap"] = 99  # once stamped, a change of them is refused like any other
    (tmp_path / "preset.json").write_text(json.dumps(stamped))
    with pytest.raises(SystemExit, match="converged_cap"):
        study_cli.main(["--preset", "cpu", "--work-dir", str(tmp_path), "--report-only"])
    old["lr"] = 0.5  # a changed setting is still refused
    (tmp_path / "preset.json").write_text(json.dumps(old, default=list))
    with pytest.raises(SystemExit, match='"lr": \\{"then": 0.5, "now": 0.003\\}'):
        study_cli.main(["--preset", "cpu", "--work-dir", str(tmp_path), "--report-only"])


def test_a_close_teacher_gets_its_third_seed_and_only_seed_1_distils(tmp_path):
    """GPKD: the teacher is trained with every seed; seed 1's makes the SKD data and the student
    initialisation. A teacher less than 1 BLEU from the baseline gets a third seed, and so does the
    baseline; the students, far from both, get none."""
    from study import plan
    from study import run as runner

    p = plan.PRESETS["cpu"]
    (tmp_path / "skd-bin").mkdir()
    (tmp_path / "skd-bin" / ".done").write_text("")
    (tmp_path / "student-init.pt").write_text("")
    level = {f"gpkd-teacher-{p.teacher_layers}": 15.0, f"prenorm-{p.depths[0]}": 15.4,
             f"gpkd-student-{p.depths[0]}": 20.0, f"skd-only-{p.depths[0]}": 10.0,
             f"prenorm-{p.depths[0]}-matched": 17.0, f"skd-only-{p.depths[0]}-matched": 12.0}
    study = _RecordingStudy(tmp_path, lambda r: level[r.system] + (r.seed - 1) % 2)
    runner.run_study(study, p, ["gpkd"], [1, 2], jobs=2)
    third = [n for n in study.trained if n.endswith("-s3")]
    assert sorted(third) == [f"gpkd-teacher-{p.teacher_layers}-s3", f"prenorm-{p.depths[0]}-s3"]
    assert study.trained.count(f"gpkd-teacher-{p.teacher_layers}-s1") == 1
    assert all(str(tmp_path / "student-init.pt") == str(r.init[1])
               for n, r in study.runs.items() if n.startswith("gpkd-student"))


def test_the_students_rebuild_the_teacher_only_when_they_need_it(tmp_path, monkeypatch):
    """A fresh clone has the records of the teacher and the students but not the teacher's
    checkpoint: nothing is rebuilt while every student is recorded; once one is missing, the
    teacher of seed 1 is trained again (its averaged checkpoint makes the SKD data)."""
    from study import plan
    from study import run as runner

    p = plan.PRESETS["cpu"]
    study = _RecordingStudy(tmp_path, lambda r: 15.0)
    study.data, study.device = tmp_path / "data-bin", lambda: []
    study.call = lambda cmd, log_file: None  # the SKD data and the student initialisation
    monkeypatch.setattr(runner, "teacher_group_sizes", lambda ckpt: (p.teacher_layers // p.depths[0], 1))
    study.selected = lambda name: name.startswith("conv-")  # --runs 'conv-*': this command trains no student
    runner.gpkd_student_runs(study, p, [1, 2], jobs=2)
    assert study.rebuilt == []
    del study.selected
    runs = runner.gpkd_student_runs(study, p, [1, 2], jobs=2)
    assert study.rebuilt == [f"gpkd-teacher-{p.teacher_layers}-s1"]
    study.run_all(runs, 2)
    study.rebuilt.clear()
    runner.gpkd_student_runs(study, p, [1, 2], jobs=2)
    assert study.rebuilt == []


def test_the_deep_decoder_depth_waits_for_the_whole_search(tmp_path):
    """A search run that failed without diverging (killed, out of memory) is retried by the next
    run of the study; until then no depth is chosen and no comparison run starts."""
    from study import plan
    from study import run as runner

    p = plan.PRESETS["cpu"]
    search = [r.name for r in plan.dd_search_runs(p, 1)]
    level = {f"dd-{k}-{p.dd_encoder}": 10.0 + 2 * i for i, k in enumerate(plan.DD_KINDS)}  # none close
    shallow = f"dd-plain-{p.dd_encoder}-{p.dd_depths[0]}"  # 2 BLEU above the deeper plain decoders
    study = _RecordingStudy(tmp_path, lambda r: level[r.system.rsplit("-", 1)[0]] + 2 * (r.system == shallow),
                            fail=search[-1:])
    runner.run_study(study, p, ["deep-decoder"], [1, 2], jobs=2)
    assert sorted(study.trained) == sorted(search[:-1]) and not (tmp_path / "dd-depth.json").exists()
    study.fail = set()
    runner.run_study(study, p, ["deep-decoder"], [1, 2], jobs=2)
    dec = json.loads((tmp_path / "dd-depth.json").read_text())["depth"]
    compare = {r.name for r in plan.dd_compare_runs(p, dec, [1, 2])}
    assert set(study.trained) == set(search) | compare
    # every kind at the chosen depth, and the shallow plain decoder, with both seeds
    assert {f"dd-{k}-{p.dd_encoder}-{d}-s{s}" for k, d in [(k, dec) for k in plan.DD_KINDS] + [("plain", p.dd_depths[0])]
            for s in (1, 2)} == compare


def test_a_run_being_trained_by_another_study_command_is_skipped(tmp_path):
    """Two study commands on one work directory (a chunk started while another still runs) never
    train the same run at once: the second skips it, records nothing, and trains it once free."""
    import fcntl

    from study import plan
    from study import run as runner

    p = plan.PRESETS["tiny"]
    study = runner.Study(p, tmp_path, tmp_path / "no-data", tmp_path / "tok", fork=False)
    run = plan.baseline(p, [1])[0]
    study.dir(run.name).mkdir(parents=True)
    with open(study.dir(run.name) / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = study.train(run)
    assert out["diverged"] and out["returncode"] is None and study.result(run.name) is None
    assert not (study.dir(run.name) / "train.log").exists()  # nothing was started
    out = study.train(run)  # the lock is free: it trains (and fails here: there is no data)
    assert out["returncode"] not in (None, 0) and (study.dir(run.name) / "train.log").exists()


def test_lease_script_reports_updates_and_pauses_a_run_by_its_log(tmp_path):
    """study/lease.sh (the GPU preset on a lent machine): ``status`` gives each
    run's last logged update and whether it is done; ``pause RUN`` stops (SIGSTOP) exactly the
    process that writes that run's train.log."""
    import os
    import re
    import subprocess
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "study" / "lease.sh"
    runs = tmp_path / "runs"
    for name, updates, done in (("prenorm-6-s1", 1500, True), ("msc-6-s1", 1100, False)):
        (runs / name).mkdir(parents=True)
        (runs / name / "train.log").write_text(
            f'{{"num_updates": "{updates - 100}"}}\n{{"num_updates": "{updates}"}}\n')
        if done:
            (runs / name / "done.json").write_text("{}")
    env = dict(os.environ, FIDELITY_WORK=str(tmp_path), FIDELITY_LOG=str(tmp_path / "gpu.log"))
    out = subprocess.run(["bash", str(script), "status"], env=env, capture_output=True, text=True, check=True).stdout
    assert 'prenorm-6-s1: "num_updates": "1500" done' in out
    assert re.search(r'^msc-6-s1: "num_updates": "1100"\s*$', out, re.M), out

    writers = [subprocess.Popen(["bash", "-c", f"exec 3>>{runs / name / 'train.log'}; sleep 60"])
               for name in ("msc-6-s1", "prenorm-6-s1")]
    try:
        time.sleep(0.5)
        out = subprocess.run(["bash", str(script), "pause", "msc-6-s1"], env=env, capture_output=True,
                             text=True, check=True).stdout
        assert f"paused msc-6-s1 ({writers[0].pid})" in out
        states = [Path(f"/proc/{w.pid}/stat").read_text().split(") ", 1)[1][0] for w in writers]
        assert states == ["T", "S"], states
    finally:
        for w in writers:
            w.kill()
            w.wait()
    assert subprocess.run(["bash", str(script)], capture_output=True).returncode == 2


def test_lease_collect_brings_back_records_and_logs_but_no_checkpoint(tmp_path):
    """``study/lease.sh collect`` packs the log, the records (partial ones too) and the runs'
    train logs, and no checkpoint: neither a saved ``*.pt`` nor the temporary file fairseq is
    writing when the deadline stops it, which once made the archive too large to come back."""
    import os
    import subprocess
    import tarfile
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "study" / "lease.sh"
    run, records, out = tmp_path / "runs" / "conv-prenorm-6-s1", tmp_path / "records", tmp_path / "out"
    for d in (run, records / "partial", out):
        d.mkdir(parents=True)
    (run / "train.log").write_text('{"num_updates": "2700"}\n')
    for ckpt in ("checkpoint_last.pt", "checkpoint3.pt", ".checkpoint_last.pt.ntrf1gqr.tmp"):
        (run / ckpt).write_bytes(b"x" * 1000)
    (records / "partial" / "conv-prenorm-6-s1.json").write_text("{}")
    (tmp_path / "gpu.log").write_text("[fidelity] report\n")
    env = dict(os.environ, FIDELITY_WORK=str(tmp_path), FIDELITY_LOG=str(tmp_path / "gpu.log"),
               FIDELITY_RECORDS=str(records), OUT=str(out))
    subprocess.run(["bash", str(script), "collect"], env=env, capture_output=True, text=True, check=True)
    with tarfile.open(out / "gpu.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"gpu.log", "train.log", "conv-prenorm-6-s1.json"} <= names, names
    assert not any(".pt" in n for n in names), names

    # FIDELITY_PRESET=cpu (python -m study --cuda): the records directory holds the committed records too;
    # only those written after the launch (its stamp) come back, into cpu.tgz
    (records / "conv-dlcl-24-s1.json").write_text("{}")  # committed
    (records / ".launched").touch()
    (records / "conv-postnorm-24-s2.json").write_text("{}")  # written by the launch
    os.utime(records / "conv-dlcl-24-s1.json", (1e9, 1e9))
    os.utime(records / "partial" / "conv-prenorm-6-s1.json", (1e9, 1e9))
    os.utime(records / "conv-postnorm-24-s2.json", (4e9, 4e9))
    subprocess.run(["bash", str(script), "collect"], env=dict(env, FIDELITY_PRESET="cpu"), capture_output=True,
                   text=True, check=True)
    with tarfile.open(out / "cpu.tgz") as tar:
        paths = tar.getnames()
    names = {Path(n).name for n in paths}
    assert {"gpu.log", "train.log", "conv-postnorm-24-s2.json"} <= names, names
    assert not names & {"conv-dlcl-24-s1.json", "conv-prenorm-6-s1.json"}, names
    # the runs' logs unpack beside the work directory's runs/, never into it
    assert [n for n in paths if n.endswith("train.log")] == [
        str(tmp_path / "lease-runs" / "conv-prenorm-6-s1" / "train.log").lstrip("/")], paths

    # launch refuses a work directory without the carried data (setup run for another preset)
    res = subprocess.run(["bash", str(script), "launch", "1", "1"], env=dict(env, FIDELITY_PRESET="cpu"),
                         capture_output=True, text=True)
    assert res.returncode == 2 and "run setup with the same FIDELITY_PRESET (cpu)" in res.stderr
    # with the data there, it starts the study: the cpu preset with --cuda, the gpu preset without
    (tmp_path / "data-bin").mkdir()
    (tmp_path / "data-bin" / ".done").touch()
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$@" > "$FIDELITY_ARGS"\n')
    fake.chmod(0o755)
    for preset, cuda in (("cpu", True), ("gpu", False)):
        args = tmp_path / f"args-{preset}"
        subprocess.run(["bash", str(script), "launch", "3", "8.5", "conv-deepnorm-24-s*"], check=True,
                       capture_output=True, env=dict(env, FIDELITY_PRESET=preset, PYTHON=str(fake),
                                                     FIDELITY_ARGS=str(args)))
        for _ in range(100):  # launched in the background
            if args.exists() and args.read_text():
                break
            time.sleep(0.05)
        argv = args.read_text().split()
        assert argv[argv.index("--preset") + 1] == preset and ("--cuda" in argv) == cuda, argv
        assert argv[argv.index("--runs") + 1] == "conv-deepnorm-24-s*" and argv[argv.index("--jobs") + 1] == "3"


def test_prepare_only_builds_the_data_and_trains_nothing(tmp_path):
    """``--prepare-only`` (what study/lease.sh pack carries to a machine without network): the
    binarized splits and the training sample, no run and no report."""
    from study import cli as study_cli
    from study import plan

    work, report = tmp_path / "work", tmp_path / "fidelity.md"
    assert study_cli.main(["--preset", "tiny", "--work-dir", str(work), "--report", str(report), "--prepare-only"]) == 0
    for split in ("train", "valid", "test", "trainsample"):
        assert (work / "data-bin" / f"{split}.en-de.de.bin").stat().st_size > 0, split
    assert len((work / "tok" / "trainsample.raw.de").read_text().splitlines()) == plan.PRESETS["tiny"].train_sample
    assert not (work / "runs").exists() and not report.exists()


def test_rebuilt_data_is_checked_against_the_records_fingerprint(tmp_path):
    """The records' runs were trained on the data their directory's ``data.json`` names: a second work
    directory rebuilds the same data (tokenization, BPE and binarization are deterministic) and passes
    the check; data that differs stops the study before it trains, naming the files that differ, and
    leaves the stamp as it was.  Files fairseq does not read (the preprocessing log) are not part of it."""
    from study import cli as study_cli

    records = tmp_path / "records"
    argv = lambda work: ["--preset", "tiny", "--work-dir", str(work), "--report", str(tmp_path / "r.md"),
                         "--records", str(records), "--prepare-only"]
    assert study_cli.main(argv(tmp_path / "a")) == 0
    stamp = json.loads((records / "data.json").read_text())
    assert {"dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "valid.en-de.de.idx",
            "trainsample.en-de.de.bin"} <= set(stamp["files"]) and "preprocess.log" not in stamp["files"]
    assert study_cli.main(argv(tmp_path / "b")) == 0  # rebuilt from scratch: the same bytes
    assert json.loads((records / "data.json").read_text()) == stamp
    (tmp_path / "b" / "data-bin" / "preprocess.log").write_text("another log\n")
    assert study_cli.main(argv(tmp_path / "b")) == 0
    dict_de = tmp_path / "b" / "data-bin" / "dict.de.txt"
    dict_de.write_text(dict_de.read_text().replace(" ", "  ", 1))
    with pytest.raises(SystemExit, match=r"files that differ: dict\.de\.txt\)"):
        study_cli.main(argv(tmp_path / "b"))
    with pytest.raises(SystemExit, match="dict.de.txt"):  # a training command stops there too
        study_cli.main(argv(tmp_path / "b")[:-1] + ["--only", "ssl"])
    assert not (tmp_path / "b" / "runs").exists()
    assert json.loads((records / "data.json").read_text()) == stamp


def test_the_committed_records_name_their_data():
    """Each committed preset with records has its data stamp (a fresh clone checks its rebuilt data against it)."""
    from study import plan

    for preset in ("cpu",):
        stamp = json.loads((plan.REPO / plan.RECORDS / preset / "data.json").read_text())
        assert len(stamp["sha256"]) == 64 and len(stamp["files"]) == 18, stamp.get("files")


def test_only_the_committed_presets_write_into_the_repository_by_default(tmp_path):
    """`--preset cpu` and `--preset gpu` keep their records and reports apart (the GPU report
    must not overwrite docs/fidelity.md, the CPU one); a tiny or --work-dir study keeps both in
    its work directory, so that trying the pipeline never overwrites the committed evidence."""
    from study import plan

    repo = plan.REPO
    cpu, gpu = plan.outputs("cpu", None, None, None), plan.outputs("gpu", None, None, None)
    assert cpu[1:] == (repo / "benchmarks/results/fidelity/cpu", repo / "docs/fidelity.md")
    assert gpu[1:] == (repo / "benchmarks/results/fidelity/gpu", repo / "docs/fidelity-gpu.md")
    work, records, report = plan.outputs("tiny", None, None, None)
    assert work == repo / "work/fidelity/tiny" and records == work / "records" and report == work / "report.md"
    work, records, report = plan.outputs("cpu", str(tmp_path), None, None)
    assert (work, records, report) == (tmp_path, tmp_path / "records", tmp_path / "report.md")
    assert plan.outputs("cpu", str(tmp_path), "r", "x.md")[1:] == (Path("r").resolve(), Path("x.md").resolve())


def _stopped_then_finished(work):
    """A stand-in for ``Launcher.run``: each call does ``work(log_file)``; the first is then stopped by
    the deadline (:class:`study.launcher.Deadline`), the second ends with exit code 0."""
    from study import launcher as launcher_mod

    segments = iter([launcher_mod.Deadline(), 0])

    def segment(cmd, out, err=None, tick=None):
        work(out)
        step = next(segments)
        if isinstance(step, Exception):
            raise step
        return step
    return segment


def test_train_seconds_of_a_stopped_and_resumed_run_counts_every_segment(tmp_path):
    """A run stopped at a deadline and resumed by the next command reports the wall time of both
    segments, not only of the last."""
    import time

    from study import launcher as launcher_mod
    from study import plan
    from study import run as runner

    p = plan.PRESETS["tiny"]
    study = runner.Study(p, tmp_path, tmp_path / "no-data", tmp_path / "tok", fork=False)
    study.evaluate = lambda *a, **k: {}
    run = plan.baseline(p, [1])[0]
    study.launch.run = _stopped_then_finished(lambda out: time.sleep(0.3))
    with pytest.raises(launcher_mod.Deadline):
        study.train(run)
    assert not (study.dir(run.name) / ".trained").exists()
    out = study.train(run)
    assert out["returncode"] == 0 and 0.6 <= out["train_seconds"] < 5


def test_a_run_is_a_train_stage_then_an_evaluate_stage_on_the_job_runner(tmp_path, monkeypatch):
    """Issue 80, part 2: a run's training and its evaluation are stages that the one job runner
    (deepnmt_fairseq.jobs.runner.Runner) executes, each command started through the study's launcher;
    the run directory keeps its layout: ``.trained`` (the training's done-marker, its seconds),
    ``train.log``, ``eval.out``/``eval.log``, ``done.json``.  A directory trained before (``.trained``
    there, no ``done.json``) is evaluated without training again; a finished one starts nothing."""
    import json
    import sys

    from deepnmt_fairseq.jobs import runner as job_runner
    from study import plan
    from study import run as runner

    p = plan.PRESETS["tiny"]
    study = runner.Study(p, tmp_path, tmp_path / "no-data", tmp_path / "tok", fork=False)
    monkeypatch.setattr(runner.Study, "losses", staticmethod(lambda save: [(1, 5.0), (2, 4.0)]))
    monkeypatch.setattr(runner.Study, "machine", lambda self: {"cpu": "test"})
    stages, started = [], []
    real = job_runner.Runner.run

    def run_stages(self, st):
        st = list(st)
        assert self.start is not None  # every stage's command goes through the launcher
        stages.extend((s.kind, s.done_file().name, s.is_done()) for s in st)
        return real(self, st)

    monkeypatch.setattr(job_runner.Runner, "run", run_stages)

    def launched(cmd, out, err=None, tick=None):
        started.append((Path(str(cmd[1])).name if str(cmd[0]) == sys.executable else Path(str(cmd[0])).name,
                        Path(out).name, err and Path(err).name))
        with open(out, "a") as f:
            f.write(json.dumps({"valid_nll": 3.5, "bleu": 1.5, "train_bleu": 2.5}) + "\n"
                    if str(cmd[0]) == sys.executable else "trained\n")
        return 0

    study.launch.run = launched
    run = plan.baseline(p, [1])[0]
    out = study.train(run)
    save = study.dir(run.name)
    assert started == [("fairseq-train", "train.log", None), ("evaluate.py", "eval.out", "eval.log")]
    assert stages == [("train", ".trained", False), ("evaluate", "eval.out", False)]
    assert float((save / ".trained").read_text()) == out["train_seconds"] and out["bleu"] == 1.5
    assert json.loads((save / "done.json").read_text())["bleu"] == 1.5
    assert " study/evaluate.py --data " in out["eval_command"]  # as a reader of the record types it

    started.clear(), stages.clear()
    assert study.train(run) == json.loads(json.dumps(out)) and started == [] and stages == []  # finished
    (save / "done.json").unlink()  # trained by an earlier study command, not yet evaluated
    (save / ".trained").write_text("12.5\n")
    again = study.train(run)
    assert stages == [("train", ".trained", True), ("evaluate", "eval.out", False)]
    assert started == [("evaluate.py", "eval.out", "eval.log")] and again["train_seconds"] == 12.5


def test_the_findings_live_in_the_cpu_report_and_the_gpu_report_points_to_them(tmp_path, monkeypatch):
    from study import plan
    from study import report as study_report

    findings = tmp_path / "findings.md"
    findings.write_text("## Findings\n\nthe measured story\n")
    monkeypatch.setattr(study_report, "FINDINGS", findings)
    results = {r["name"]: r for r in (_run("prenorm-6", 1, 30.0), _run("prenorm-6", 2, 31.0))}
    text = {}
    for preset in ("cpu", "gpu", "tiny"):
        report = tmp_path / preset / "fidelity.md"
        report.parent.mkdir()
        study_report.write_report(results, plan.PRESETS[preset], report, tmp_path)
        text[preset] = report.read_text()
    assert "the measured story" in text["cpu"] and "[docs/fidelity.md](fidelity.md#findings)" not in text["cpu"]
    assert "the measured story" not in text["gpu"] and "[docs/fidelity.md](fidelity.md#findings)" in text["gpu"]
    assert "the measured story" not in text["tiny"] and "fidelity.md#findings" not in text["tiny"]
    assert "- none yet: the systems compared with a baseline have not finished" in text["gpu"]


def test_the_committed_cpu_report_embeds_the_committed_findings():
    """The findings are edited by hand after the report is generated; a report committed without
    `--report-only` after the edit would show readers the findings' previous text."""
    from study import plan
    from study import report as study_report

    report = plan.outputs("cpu", None, None, None)[2]
    assert study_report.FINDINGS.read_text().strip() in report.read_text(), (
        "docs/fidelity.md embeds an older study/findings.md: run "
        "`python -m study --preset cpu --report-only`")


def test_runs_selects_the_matching_planned_runs_in_the_patterns_order(tmp_path):
    """--runs trains only the runs whose names match, the first matching pattern deciding the
    order (every 12-layer system's seed 1 before any seed 2), whatever --order says."""
    from study import plan
    from study import run as runner

    p = plan.PRESETS["cpu"]
    runs = plan.converged_runs(p, [1, 2])
    started = []
    study = object.__new__(runner.Study)
    study.p, study.short_first = p, True
    study.train = lambda r: started.append(r.name) or {"name": r.name}
    # a finished run that is not selected is returned, not trained (later phases read it)
    study.result = lambda name: {"name": name, "stored": True} if name == "conv-msc-6-s1" else None
    study.select = ["conv-dlcl-12-s1", "conv-*-12-s1", "conv-*-12-s2"]
    out = study.run_all(runs, jobs=1)
    assert out["conv-msc-6-s1"] == {"name": "conv-msc-6-s1", "stored": True}
    assert "conv-msc-6-s1" not in started and "conv-msc-6-s2" not in out
    fams = [f for f in plan.FAMILIES]
    assert started[0] == "conv-dlcl-12-s1"
    assert sorted(started[1:len(fams)]) == sorted(f"conv-{f}-12-s1" for f in fams if f != "dlcl")
    assert sorted(started[len(fams):]) == sorted(f"conv-{f}-12-s2" for f in fams)
    study.select, started[:] = [], []
    study.run_all(runs, jobs=1)  # no --runs: every run, the cheapest (6 layers) first
    assert len(started) == len(runs) and started[0].endswith(f"-{p.depths[0]}-s1")


def test_runs_pattern_that_matches_no_planned_run_is_refused(tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "study", "--preset", "tiny",
                          "--work-dir", str(tmp_path / "w"), "--runs", "conv-msc-*-s1", "conv-nosuch-*"],
                         capture_output=True, text=True, cwd=repo)
    assert out.returncode == 2
    assert "--runs 'conv-nosuch-*' matches none of the study's" in out.stderr
    assert not (tmp_path / "w" / "runs").exists()  # nothing trained


def test_the_run_order_covers_every_planned_run_middle_depth_converged_first():
    import fnmatch

    from study import plan

    p = plan.PRESETS["cpu"]
    order = [pat for _, pat in plan.run_order(p)]
    names = plan.planned(p, [1, 2])
    assert all(any(fnmatch.fnmatchcase(n, pat) for pat in order) for n in names)
    first = [n for n in names if fnmatch.fnmatchcase(n, order[0])]
    assert first and all(n.startswith("conv-") and n.endswith(f"-{p.depths[1]}-s1") for n in first)


def test_curve_table_gives_the_mean_at_every_budget_and_the_seeds_that_reached_it():
    """Section 1b's curve table: one column per curve point, the mean over the seeds whose run
    reached it, their number where a seed had stopped earlier; the sd column is the sample sd."""
    import statistics

    from study import report

    def conv(system, seed, curve):
        return _run(system, seed, curve[-1][1], curve=[{"updates": u, "bleu": b} for u, b in curve])

    systems = {"conv-a-12": [conv("conv-a-12", 1, [(800, 10.0), (1600, 14.0)]),
                             conv("conv-a-12", 2, [(800, 12.0)])],  # seed 2 stopped before 1600
               "conv-b-12": [conv("conv-b-12", 1, [(800, 5.0), (1600, 9.0), (2400, 11.0)]),
                             conv("conv-b-12", 2, [(800, 7.0), (1600, 11.0), (2400, 13.0)])]}
    lines = report.curve_table(systems, ["conv-a-12", "conv-b-12"])
    assert lines[0] == "| system | 800 | 1600 | 2400 |"
    assert lines[2] == "| conv-a-12 | 11.00 | 14.00 (1) | - |"
    assert lines[3] == "| conv-b-12 | 6.00 | 10.00 | 12.00 |"
    assert report.sd(systems["conv-b-12"]) == f"{statistics.stdev([11.0, 13.0]):.2f} (n=2)"
    assert report.sd(systems["conv-a-12"][:1]) == "-"


def test_weights_table_reads_transparent_rows_and_dlcls_output_row_from_the_records():
    """The mixing-weight analysis is generated from the records' ``layer_weights``: transparent
    attention's every decoder row, DLCL's output row only; min - max over rows and seeds."""
    from study import report

    s1 = [[0.4, 0.2, 0.1, 0.1, 0.2], [0.3, 0.3, 0.2, 0.1, 0.1]]  # 2 decoder rows over y_0 .. y_4
    s2 = [[0.2, 0.2, 0.2, 0.2, 0.2]]
    w = [[1.0], [0.5, 0.5], [0.3, 0.3, 0.4], [0.2, 0.2, 0.3, 0.3], [0.5, 0.1, 0.0, -0.1, 0.5]]
    systems = {"conv-transparent-pre-4": [_run("conv-transparent-pre-4", 1, 9.0, layer_weights={"transparent_s": s1}),
                                          _run("conv-transparent-pre-4", 2, 9.0, layer_weights={"transparent_s": s2})],
               "conv-dlcl-4": [_run("conv-dlcl-4", 1, 9.0, layer_weights={"dlcl_w": w})],
               "conv-prenorm-4": [_run("conv-prenorm-4", 1, 9.0)]}
    lines = report.weights_table(systems)
    assert len(lines) == 4 and not any("prenorm" in line for line in lines)
    assert lines[2] == "| conv-dlcl-4 | 1 | DLCL W (output row) | 0.60 | 0.50 | -0.10 to 0.50 | 0.200 |"
    assert lines[3] == ("| conv-transparent-pre-4 | 2 | transparent s (decoder rows) | 0.40 to 0.60 | "
                        "0.10 to 0.20 | 0.10 to 0.20 | 0.200 |")
    assert report.weights_table({"conv-prenorm-4": systems["conv-prenorm-4"]}) == []


def test_curve_points_include_epoch_checkpoints_and_the_rest_are_pruned(tmp_path):
    """An epoch that ends on a curve point is saved by fairseq only as an epoch checkpoint
    (checkpoint{E}.pt): it is a curve point too (the CPU corpus's 200-update epochs end on every
    800th update); epoch checkpoints that are no curve point go once the run is evaluated, but
    for the newest."""
    from study import run as runner

    save = tmp_path / "run"
    save.mkdir()
    epoch_updates = {"checkpoint2.pt": 8, "checkpoint3.pt": 10, "checkpoint4.pt": 14}
    for name in ["checkpoint_1_4.pt", "checkpoint_3_12.pt", "checkpoint_last.pt", "checkpoint_best.pt",
                 *epoch_updates]:
        (save / name).write_text("")
    study = object.__new__(runner.Study)
    study.updates_of = lambda ckpt: epoch_updates[ckpt.name]
    evaluated = []
    study.evaluate = lambda ckpt, train_sample: evaluated.append(ckpt.name) or {"valid_nll": 1.0, "bleu": 2.0}
    curve = study.curve(save, every=4)
    assert [pt["updates"] for pt in curve] == [4, 8, 12]
    assert evaluated == ["checkpoint_1_4.pt", "checkpoint2.pt", "checkpoint_3_12.pt"]
    assert not (save / "checkpoint3.pt").exists()  # no curve point, not the newest epoch checkpoint
    assert (save / "checkpoint2.pt").exists() and (save / "checkpoint4.pt").exists()
    assert study.curve(save, every=4) == curve and len(evaluated) == 3  # cached: nothing evaluated again
    (save / "checkpoint3.pt").write_text("")  # a diverged run: nothing evaluated, pruned all the same
    assert study.curve(save, every=4, evaluate=False) == [] and not (save / "checkpoint3.pt").exists()


def test_a_training_curve_run_keeps_only_its_newest_epochs_and_curve_points(tmp_path, monkeypatch):
    """fairseq keeps every epoch checkpoint of a curve run (it cannot use --keep-last-epochs): 3.1 GB
    a run after 2700 updates on the GPU preset.  While the run trains, the study deletes every
    minute those that are neither among the 3 newest epochs (what the average of the last 3 by
    update and the checkpoint being written need) nor on a curve point; each is loaded once to
    read its update.  The training command gets that pruning as the launcher's tick."""
    from pathlib import Path

    from study import plan
    from study import run as runner

    save = tmp_path / "run"
    save.mkdir()
    updates = {f"checkpoint{e}.pt": 3 * e for e in range(1, 9)}  # epochs of 3 updates; 12 and 24 are curve points
    for name in ["checkpoint_2_5.pt", "checkpoint_last.pt", "checkpoint_best.pt", *updates]:
        (save / name).write_text("")
    study = object.__new__(runner.Study)
    loaded = []
    study.updates_of = lambda ckpt: loaded.append(ckpt.name) or updates[ckpt.name]
    study.prune_epochs(save, every=12, keep=3)
    left = sorted(p.name for p in save.glob("checkpoint*.pt"))
    assert left == sorted(["checkpoint_2_5.pt", "checkpoint_last.pt", "checkpoint_best.pt",
                           "checkpoint4.pt", "checkpoint6.pt", "checkpoint7.pt", "checkpoint8.pt"]), left
    assert sorted(loaded) == sorted(f"checkpoint{e}.pt" for e in range(1, 6))  # never the newest 3
    (save / "checkpoint9.pt").write_text("")  # one more epoch (27 updates): checkpoint6 (18) goes now
    updates["checkpoint9.pt"] = 27
    study.prune_epochs(save, every=12, keep=3)
    assert not (save / "checkpoint6.pt").exists() and (save / "checkpoint4.pt").exists()
    assert loaded.count("checkpoint4.pt") == 1  # read once, then from the cache

    # the training command runs with that pruning as its tick; a run without curve points, without
    ticks = {}

    class Launch:
        threads = 1

        def check(self):
            pass

        def run(self, cmd, out, err=None, tick=None):
            ticks[Path(out).parent.name] = tick
            raise runner.Deadline()

    study = runner.Study.__new__(runner.Study)
    study.launch = Launch()
    study.records = None  # no records directory: no partial record to look for
    monkeypatch.setattr(runner.Study, "result", lambda self, name, work_only=False: None)
    monkeypatch.setattr(runner.Study, "train_command", lambda self, r: ["fairseq-train"])
    monkeypatch.setattr(runner.Study, "_keep_partial", lambda self, *a: None)
    pruned = []
    monkeypatch.setattr(runner.Study, "prune_epochs", lambda self, save, every, keep: pruned.append((save.name, every, keep)))
    for r in (plan.Run("conv-x", "conv-x", 1, [], curve_every=4), plan.Run("x", "x", 1, [])):
        (tmp_path / r.name).mkdir()
        with pytest.raises(runner.Deadline):
            study._train(r, tmp_path / r.name)
    assert ticks["x"] is None
    ticks["conv-x"]()
    assert pruned == [("conv-x", 4, 3)]


def test_order_budget_counts_each_missing_run_once_in_its_first_step():
    """The status line's per-step budget: every missing run lands in the first step whose pattern it
    matches (the last step, ``*``, gets only the rest), and the hours add up to the total."""
    from study import plan
    from study import report

    p = plan.PRESETS["cpu"]
    results = {"prenorm-12-s1": {"train_seconds": 1000.0, "losses": [[1600, 3.0]]},
               "prenorm-6-s1": {"train_seconds": 500.0, "losses": [[1600, 3.0]]}}
    missing = ["conv-dlcl-12-s1", "conv-msc-12-s1", "prenorm-6-matched-s1", "conv-dlcl-12-s2",
               "conv-dlcl-24-s1", "postnorm-12-s3"]
    steps = report.order_budget(p, missing, results)
    counts = {pat: n for _, pat, n, _ in steps}
    assert counts["conv-*-12-s1"] == 2 and counts["*-matched-s*"] == 1 and counts["conv-*-12-s2"] == 1
    assert counts["conv-*-24-s*"] == 1 and counts["*"] == 1  # postnorm-12-s3 only, not counted twice
    assert sum(n for _, _, n, _ in steps) == len(missing)
    total = report.remaining_hours(p, missing, results)
    assert abs(sum(h for *_, h in steps) - total) < 1e-9
    # a 12-layer run at the cap costs twice a 6-layer one per update (1000 s against 500 s per 1600)
    h12 = report.remaining_hours(p, ["conv-dlcl-12-s1"], results)
    assert h12 > report.remaining_hours(p, ["prenorm-6-matched-s1"], results)


def test_a_run_stopped_by_the_deadline_keeps_its_valid_curve_until_its_record_replaces_it(tmp_path):
    """A machine lent for minutes loses a stopped run's checkpoints: the stop keeps what the run's
    log says (``<records>/partial/<run>.json``: the valid NLL of every validation, the train loss and
    speed), the report shows it in section 1c without a call, and the finished run's record replaces it."""
    from study import launcher as launcher_mod
    from study import plan
    from study import report as study_report
    from study import run as runner

    p = plan.PRESETS["tiny"]
    records = tmp_path / "records"
    # --threads 3: kept in both records' machine (the speed of a 2-thread and a 1-thread run differ)
    # --cuda: both records say where they ran (machine.device)
    study = runner.Study(p, tmp_path, tmp_path / "no-data", tmp_path / "tok", threads=3, fork=False, records=records,
                         cuda=True)
    study.evaluate = lambda *a, **k: {}
    run = plan.baseline(p, [1])[0]

    def line(tag, stats):
        return f"2026-11-26 23:42:34 | INFO | {tag} | {json.dumps(stats)}\n"

    log = "".join([line("train_inner", {"epoch": 1, "loss": "9.0", "ups": "4.5", "num_updates": "2"}),
                   line("valid", {"epoch": 1, "valid_loss": "8.1", "valid_nll_loss": "7.654",
                                  "valid_num_updates": "2"}),
                   line("train_inner", {"epoch": 1, "loss": "7.0", "ups": "5.25", "num_updates": "4"}),
                   line("valid", {"epoch": 1, "valid_loss": "6.2", "valid_nll_loss": "5.4321",
                                  "valid_num_updates": "4"})])
    study.launch.run = _stopped_then_finished(lambda out: Path(out).write_text(log))
    with pytest.raises(launcher_mod.Deadline):
        study.train(run)
    part = json.loads((records / "partial" / f"{run.name}.json").read_text())
    assert part["unfinished"] and part["updates"] == 4 and part["updates_per_second"] == 5.25
    assert part["valid_log"] == [[2, 7.654], [4, 5.432]] and part["final_train_loss"] == 8.0
    assert part["command"].startswith("fairseq-train ") and part["system"] == run.system
    assert part["machine"]["threads"] == 3 and part["machine"]["device"] == "cuda"

    report = tmp_path / "report.md"
    study_report.write_report({}, p, report, tmp_path, planned=[run.name], records=records)
    text = report.read_text()
    assert "Of the others, 1 was stopped part-way by a deadline (its valid curve: section 1c)." in text
    assert "## 1c. Unfinished runs" in text and f"- `{run.name}` (unfinished, section 1c;" in text
    row = next(r for r in text.splitlines() if r.startswith(f"| {run.name} |"))
    assert row.endswith("| 4 | 8.000 | 5.25 | - | 7.65 | - | 5.43 | 5.43 (4) |")  # every validation step: 1

    out = study.train(run)  # resumed to the end: the record replaces the partial one
    assert out["returncode"] == 0 and not (records / "partial" / f"{run.name}.json").exists()
    assert out["machine"]["threads"] == 3 and out["machine"]["device"] == "cuda"
    study_report.write_report(plan.finished(tmp_path, records), p, report, tmp_path, records=records)
    assert "## 1c. Unfinished runs" not in report.read_text()


def test_a_deadline_during_the_evaluation_records_the_trained_run_and_the_same_command_only_evaluates_it(
        tmp_path, capsys):
    """The deadline can stop a run after its training finished, while its checkpoints are evaluated: the
    partial record then says how far the training got (not the previous segment's updates) and that it
    trained, the log says so, and the next command evaluates it without training again."""
    from study import launcher as launcher_mod
    from study import plan
    from study import run as runner

    p = plan.PRESETS["tiny"]
    records = tmp_path / "records"
    run = plan.baseline(p, [1])[0]
    study = runner.Study(p, tmp_path, tmp_path / "no-data", tmp_path / "tok", threads=1, fork=False, records=records)
    trainings = []

    def train(cmd, out, err=None, tick=None):
        trainings.append(cmd)
        Path(out).write_text("".join(
            f"2026-12-06 09:27:00 | INFO | train_inner | "
            f"{json.dumps({'epoch': 1, 'loss': '6.0', 'ups': '2.0', 'num_updates': str(u)})}\n" for u in (2, 4, 6)))
        return 0

    def stopped(*a, **k):
        raise launcher_mod.Deadline()

    study.launch.run, study.evaluate = train, stopped
    with pytest.raises(launcher_mod.Deadline):
        study.train(run)
    part = json.loads((records / "partial" / f"{run.name}.json").read_text())
    assert part["trained"] is True and part["updates"] == 6 and part["unfinished"]
    said = capsys.readouterr()
    assert f"{run.name}: trained (6 updates), its evaluation stopped by the deadline" in said.out + said.err
    from study import report as study_report
    row = next(r for r in study_report.partial_table({run.name: part}, 2) if r.startswith(f"| {run.name} |"))
    assert "| 6 (trained, not yet evaluated) | 6.000 | 2.00 |" in row

    study.evaluate = lambda *a, **k: {"valid_nll": 5.0}
    out = study.train(run)
    assert out["valid_nll"] == 5.0 and len(trainings) == 1  # evaluated, not trained again
    assert not (records / "partial" / f"{run.name}.json").exists()

    # the same where the deadline stops a converged run's curve points, after its average was evaluated
    import dataclasses
    conv = dataclasses.replace(run, name="conv-curve-s1", curve_every=2)
    study.curve = stopped
    with pytest.raises(launcher_mod.Deadline):
        study.train(conv)
    assert json.loads((records / "partial" / "conv-curve-s1.json").read_text())["trained"] is True
    study.curve = lambda *a, **k: [{"updates": 2, "bleu": 1.0}]
    assert study.train(conv)["curve"] == [{"updates": 2, "bleu": 1.0}] and len(trainings) == 2


def test_a_segment_that_restarted_without_the_checkpoints_never_overwrites_a_further_partial_record(
        tmp_path, capsys):
    """A new machine (a fresh work directory) lacks the checkpoints of a run that an earlier machine
    stopped part-way: the run trains from update 0, says so, and its partial record (further on) is
    kept when this segment stops behind it; a segment that passes it replaces it."""
    from study import launcher as launcher_mod
    from study import plan
    from study import run as runner

    p = plan.PRESETS["tiny"]
    records = tmp_path / "records"
    run = plan.baseline(p, [1])[0]

    def log_of(*updates):
        return "".join(f"2026-11-29 08:00:00 | INFO | train_inner | "
                       f"{json.dumps({'epoch': 1, 'loss': '7.0', 'ups': '1.0', 'num_updates': str(u)})}\n"
                       for u in updates)

    def segment(work, text):
        study = runner.Study(p, tmp_path / work, tmp_path / "no-data", tmp_path / "tok", threads=1, fork=False,
                             records=records)
        study.launch.run = _stopped_then_finished(lambda out: Path(out).write_text(text))
        with pytest.raises(launcher_mod.Deadline):
            study.train(run)
        return json.loads((records / "partial" / f"{run.name}.json").read_text())

    assert segment("machine-1", log_of(2, 4, 6))["updates"] == 6
    capsys.readouterr()
    assert segment("machine-2", log_of(2))["updates"] == 6  # behind: the further record stays
    err = capsys.readouterr()
    said = err.out + err.err
    assert "its partial record (6 updates) has no checkpoint" in said and "trains from update 0" in said
    assert "behind its partial record (6 updates" in said
    assert segment("machine-3", log_of(2, 4, 6, 8))["updates"] == 8  # passes it: replaced
    (records / "partial" / f"{run.name}.json").write_text('{"unfinished": tr')  # cut short by a kill
    assert segment("machine-4", log_of(2))["updates"] == 2  # an unreadable record is replaced, no crash
    assert not list((records / "partial").glob(".*.tmp"))  # written whole (a temporary file, renamed)


def test_the_status_line_names_finished_records_the_plan_no_longer_holds(tmp_path):
    """The header counts every record, the status line the planned ones: a record outside the plan
    (e.g. of a deep-decoder depth the valid-set choice no longer picks) is named, so the two counts agree."""
    from study import plan
    from study import report as study_report

    p = plan.PRESETS["tiny"]
    run = plan.baseline(p, [1])[0]
    report = tmp_path / "report.md"
    study_report.write_report({"old-run-s1": {"name": "old-run-s1", "system": "old-run", "seed": 1}}, p, report, tmp_path,
                                 planned=[run.name], records=tmp_path / "records")
    text = report.read_text()
    assert "from 1 finished runs" in text and "**Status: 0 of 1 planned runs finished.**" in text
    assert "The other 1 of the 1 finished records (old-run-s1) are of runs the plan no longer holds" in text
    study_report.write_report({}, p, report, tmp_path, planned=[run.name], records=tmp_path / "records")
    assert "the plan no longer holds" not in report.read_text()


def test_a_step_of_the_order_with_no_planned_run_says_so_instead_of_done(tmp_path):
    """The status line's order: a step whose planned runs all finished reads "done"; one whose pattern
    no planned run matches (the GPU preset plans no sweep, no diagnostics) reads "none planned"."""
    from study import plan
    from study import report as study_report

    p = plan.PRESETS["cpu"]
    rec = {"train_seconds": 1000.0, "losses": [[1600, 3.0]]}
    results = {n: dict(rec, name=n, system=n[:-3], seed=1) for n in ("prenorm-12-s1", "prenorm-6-matched-s1")}
    report = tmp_path / "report.md"
    for matched, says in ((["prenorm-6-matched-s1"], "done"), ([], "none planned")):
        study_report.write_report(results, p, report, tmp_path, planned=["conv-prenorm-12-s1"] + matched,
                                  records=tmp_path / "records")
        text = report.read_text()
        assert "(`conv-*-12-s1`: 1 run" in text
        assert f"(`*-matched-s*`): {says};" in text
        assert "(`diag-*`): none planned;" in text and "(`diag-*`): done" not in text


@pytest.mark.parametrize("after", ["deadline", "error", "finished"])
def test_a_signal_to_the_study_command_writes_the_report_and_exits_128_plus_the_signal(tmp_path, monkeypatch, after):
    """study/cli.py runs the study under ``Launcher.stopping_on_signals``: a SIGTERM in the
    middle of it stops it as the deadline does (nothing new starts), the report is still written
    from what has finished, the exit code is 128 + the signal, and the study's own handlers are
    restored afterwards.  An error after the signal (a command it ended before the handler ran) is
    a stop too; a signal as the study ended stops nothing (exit 0).  (The real signal, its command
    and children: test_fidelity_launcher.py.)"""
    import signal

    from study import cli as study_cli

    before = signal.getsignal(signal.SIGTERM)
    started = []

    def study_interrupted(study, *args):
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # what the signal's arrival calls
        started.append(study.launch.left())
        if after == "error":
            raise RuntimeError("a command ended by the signal failed")
        if after == "deadline":
            study.launch.check()  # the next command would start here
            started.append("a command")

    monkeypatch.setattr(study_cli, "prepare", lambda p, work: (work / "data-bin", work / "tok"))
    checked = []  # the data check (its own test: test_rebuilt_data_is_checked_...) sees the prepared data
    monkeypatch.setattr(study_cli, "check_data", lambda data, records: checked.append(data.name))
    monkeypatch.setattr(study_cli, "run_study", study_interrupted)
    work, report = tmp_path / "work", tmp_path / "fidelity.md"
    code = study_cli.main(["--preset", "tiny", "--work-dir", str(work), "--report", str(report), "--exec"])
    assert code == (0 if after == "finished" else 128 + signal.SIGTERM)
    assert started == [0.0] and report.exists() and checked == ["data-bin"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_cuda_flag_reaches_the_study_and_is_refused_without_a_gpu(tmp_path, monkeypatch):
    """``python -m study --cuda`` builds the study with ``cuda=True`` (its commands without ``--cpu``);
    where torch sees no CUDA device it stops with an error naming the flag, before any run."""
    import torch

    from study import cli as study_cli

    seen = []
    monkeypatch.setattr(study_cli, "prepare", lambda p, work: (work / "data-bin", work / "tok"))
    monkeypatch.setattr(study_cli, "check_data", lambda data, records: None)
    monkeypatch.setattr(study_cli, "run_study", lambda study, *a: seen.append(study.cuda))
    argv = ["--preset", "tiny", "--work-dir", str(tmp_path / "work"), "--report", str(tmp_path / "r.md"), "--exec"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert study_cli.main(argv + ["--cuda"]) == 0 and study_cli.main(argv) == 0
    assert seen == [True, False]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        study_cli.main(argv + ["--cuda"])
    assert e.value.code == 2 and seen == [True, False]


# ------------------------------------------------------------------ evidence round 3 (issue 69)
def _sentences(seed=5, n=80):
    import random

    rng = random.Random(seed)
    words = "der die das haus ist gut ein mann frau kind und oder nicht".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(n)]
    noisy = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(n)]
    return refs, noisy


def _system(refs, noisy, good_every):
    """Sentence statistics of a system that gets every ``good_every``-th sentence right (0: none)."""
    from study.stats import sentence_stats

    hyps = [r if good_every and i % good_every == 0 else h for i, (r, h) in enumerate(zip(refs, noisy))]
    return sentence_stats(hyps, refs)


def test_the_seed_level_test_finds_a_difference_every_seed_shows_and_not_a_one_seed_outlier():
    """Three seeds a side.  Every seed of A gets more sentences right than every seed of B: the
    seed-level bootstrap finds it (p < 0.05).  Only one seed of A does (the other two are B's): the
    paired bootstrap over sentences, which averages the seeds, still finds a difference, but the
    seed-level one does not, since the resamples without that seed have none."""
    from study.stats import ALPHA, paired_bootstrap, seed_bootstrap

    refs, noisy = _sentences()
    b = [_system(refs, noisy[k:] + noisy[:k], 0) for k in range(3)]
    every = [_system(refs, noisy[k:] + noisy[:k], 3) for k in range(3)]
    res = seed_bootstrap(every, b, samples=400)
    assert res["delta"] > 5 and res["p"] < ALPHA and res["low"] > 0 and res["seeds"] == (3, 3)
    assert res == seed_bootstrap(every, b, samples=400)  # deterministic
    outlier = [_system(refs, noisy, 2)] + b[1:]
    assert paired_bootstrap(outlier, b, samples=400)["p"] < ALPHA  # the sentence-level test alone calls it
    # about (2/3)^3 of the resamples draw no outlier, and about half of those have the other sign
    assert seed_bootstrap(outlier, b, samples=400)["p"] > 0.1
    # without sentence statistics, the seeds' scores alone are resampled
    assert seed_bootstrap(None, None, scores=([20.0, 10.0, 10.0], [10.0, 10.0, 10.0]))["p"] > 0.2
    assert seed_bootstrap(None, None, scores=([11.0, 11.2, 11.1], [10.0, 10.1, 10.2]))["p"] < ALPHA
    assert seed_bootstrap(None, None, scores=([11.0], [10.0, 10.1])) is None


def test_a_thin_call_is_labelled_narrow_by_the_rule_and_a_wide_one_is_not():
    from study.report import NARROW_MARGIN, call, changed_calls, round2_label

    a = [_run("a", s, v) for s, v in ((1, 22.0), (2, 22.1), (3, 22.2))]
    b = [_run("b", s, v) for s, v in ((1, 21.0), (2, 21.4), (3, 21.9))]  # spread 0.9, diff 0.67: within
    thin = [_run("b", s, v) for s, v in ((1, 20.9), (2, 21.0), (3, 21.6))]  # diff 0.93, 0.23 beyond spread 0.7
    wide = [_run("b", s, v) for s, v in ((1, 19.0), (2, 19.1), (3, 19.3))]
    assert call("a", a, "b", b)["label"] == "no difference"
    c = call("a", a, "b", thin)
    assert c["label"] == "narrowly better" and 0 < c["margin"] < NARROW_MARGIN and "narrow" in c["text"]
    assert call("a", a, "b", wide)["label"] == "better"
    assert round2_label(a, thin) == "better"
    assert changed_calls([dict(c, old=round2_label(a, thin))]) == [
        f"- a vs b (bleu): better → **narrowly better** ({c['margin']:.2f} BLEU beyond the larger spread, under "
        f"{NARROW_MARGIN:g}: narrow)"]


def test_a_call_whose_sides_ran_on_different_cpu_types_is_marked_confounded():
    from study.report import call, cpu_type, machine_of

    xeon = {"cpu": "Intel(R) Xeon(R) Processor", "kernels": "AVX512", "threads": 1}
    epyc = {"cpu": "AMD EPYC", "kernels": "AVX512", "threads": 2}
    a = [_run("a", s, 20.0 + s / 10, machine=xeon) for s in (1, 2, 3)]
    b = [_run("b", s, 15.0 + s / 10, machine=epyc) for s in (1, 2, 3)]
    assert cpu_type(a[0]) == "Intel Xeon AVX512" and machine_of(b[0])["threads"] == "2"
    c = call("a", a, "b", b)
    assert c["label"] == "better" and c["machine"][0] == "confounded"
    assert "[confounded with the machine: 3× Intel Xeon AVX512 against 3× AMD EPYC AVX512]" in c["text"]
    mixed = [_run("b", s, 15.0 + s / 10, machine=epyc if s > 1 else xeon) for s in (1, 2, 3)]
    assert call("a", a, "b", mixed)["machine"][0] == "confounded"  # a different mix is a different machine
    same = [_run("b", s, 15.0 + s / 10, machine=xeon) for s in (1, 2, 3)]
    assert call("a", a, "b", same)["machine"] == ("", "") and "confounded" not in call("a", a, "b", same)["text"]
    unknown = [_run("b", s, 15.0 + s / 10) for s in (1, 2, 3)]  # a record without its machine
    assert machine_of(unknown[0]) == {"cpu": "unknown", "isa": "unknown", "threads": "unknown"}
    assert call("a", a, "b", unknown)["machine"][0] == "unknown" and "machine unknown" in call("a", a, "b", unknown)["text"]


def test_a_still_improving_run_is_marked_in_the_table_and_in_its_calls():
    from study.report import IMPROVING_K, call, still_improving, table

    def conv(seed, nlls, bleu):
        return _run("conv-x-24", seed, bleu, curve=[{"updates": 800 * (i + 1), "valid_nll": v, "bleu": 1.0}
                                                     for i, v in enumerate(nlls)], stopped_at=800 * len(nlls) + 800)

    falling = conv(1, [5.0, 4.6, 4.4, 4.3], 18.0)
    flat = conv(2, [5.0, 4.6, 4.3, 4.3], 18.5)  # its last step did not fall
    tiny = conv(3, [5.0, 4.6, 4.305, 4.3], 18.2)  # fell by under IMPROVING_MIN_FALL
    assert IMPROVING_K == 3 and still_improving(falling) and not still_improving(flat) and not still_improving(tiny)
    assert not still_improving(conv(4, [4.4, 4.3], 18.0))  # fewer than K kept validations
    rows = table({"conv-x-24": [falling, flat, tiny]}, ["conv-x-24"])
    assert "| conv-x-24 | 1,2,3 (still improving: 1) |" in rows[2]
    ref = [_run("conv-y-24", s, 10.0 + s / 10) for s in (1, 2, 3)]
    c = call("conv-x-24", [falling, flat, tiny], "conv-y-24", ref)
    assert c["improving"] == {"conv-x-24": [1]} and "[conv-x-24 still improving (seed 1 of 3)]" in c["text"]


def test_every_committed_record_says_its_cpu_isa_and_threads():
    """Round 3 backfilled the machine of every record ("unknown" where nothing says it)."""
    from study.plan import NOT_RUNS, RECORDS, REPO

    files = [f for f in (REPO / RECORDS).rglob("*.json") if f.name not in NOT_RUNS]
    assert len(files) > 150
    for f in files:
        m = json.loads(f.read_text()).get("machine") or {}
        assert all(m.get(k) not in (None, "") for k in ("cpu", "kernels", "threads")), f


def test_readmes_evidence_table_is_the_one_the_records_make(tmp_path):
    """README's evidence table (issue 72) is generated from the committed records between two
    markers; it and docs/evidence-table.md must equal what the records make now, so a record that
    changes without the table failing here cannot happen."""
    from study import plan
    from study import report

    results = plan.finished(tmp_path / "no-work", plan.REPO / plan.RECORDS / "cpu")
    p = plan.PRESETS["cpu"]
    table = report.evidence_table(results, p)
    block = report.readme_evidence_block()
    assert block is not None, (
        f"README.md has no evidence table: add the lines {report.EVIDENCE_START} and {report.EVIDENCE_END} where it "
        "belongs, then run `python -m study --preset cpu --report-only`, which writes it between them")
    assert block == table, "README's evidence table differs from the records: run `python -m study --preset cpu --report-only`"


def test_the_evidence_table_page_is_the_one_the_records_make(tmp_path):
    """docs/evidence-table.md (the same table, its links from docs/) equals what the committed records
    make, and a record that changes changes the table."""
    from study import plan
    from study import report

    results = plan.finished(tmp_path / "no-work", plan.REPO / plan.RECORDS / "cpu")
    p = plan.PRESETS["cpu"]
    assert report.EVIDENCE_TABLE.read_text() == "# The evidence, in one table\n\n" + report.evidence_table(results, p, "../"), (
        "docs/evidence-table.md differs from the records: run `python -m study --preset cpu --report-only`")
    table = report.evidence_table(results, p)
    assert "| pre-norm | 24 | 18.58 ± 1.71 (3 seeds), still improving: 2 of 3 | worse than pre-norm-6 (-3.66); confounded with the CPU type; both sides still improving |" in table
    name = "conv-msc-24-s1"
    changed = dict(results, **{name: dict(results[name], bleu=results[name]["bleu"] + 3)})
    assert report.evidence_table(changed, p) != table


def test_write_evidence_table_replaces_only_the_block_between_the_markers(tmp_path):
    from study import plan
    from study import report

    results = {r["name"]: r for r in (_run("conv-prenorm-2", 1, 3.0), _run("conv-prenorm-2", 2, 3.5),
                                      _run("conv-msc-2", 1, 5.0), _run("conv-msc-2", 2, 5.4))}
    p, readme, page = plan.PRESETS["tiny"], tmp_path / "README.md", tmp_path / "evidence-table.md"
    readme.write_text("# title\n")
    assert not report.write_evidence_table(results, p, readme, page) and readme.read_text() == "# title\n"
    assert "| MSC | 2 | 5.20 ± 0.40 (2 seeds) | better than pre-norm-2 (+1.95)" in page.read_text()
    readme.write_text(f"# title\n{report.EVIDENCE_START}\nold\n{report.EVIDENCE_END}\nrest\n")
    assert report.write_evidence_table(results, p, readme, page)
    text = readme.read_text()
    assert text.startswith("# title\n") and text.endswith(f"{report.EVIDENCE_END}\nrest\n") and "old" not in text
    assert report.readme_evidence_block(readme) == report.evidence_table(results, p)


def test_the_findings_give_the_figures_the_records_make():
    """Figures of the findings that the records make (issue 72 found two stale)."""
    from study import plan
    from study import report

    systems = plan.by_system(plan.finished(Path("/nonexistent"), plan.REPO / plan.RECORDS / "cpu"))
    text = " ".join(report.FINDINGS.read_text().split())
    admin = plan.stat(systems["admin-12"], "bleu")
    assert f"{admin[0]:.2f} ± {admin[1]:.2f} (3 seeds)" in text
    lo, hi = (plan.stat(systems[f"conv-prenorm-{n}"], "train_bleu")[0] for n in (6, 24))
    assert f"plain pre-norm {lo - hi:.2f}, {lo:.2f} → {hi:.2f} (three seeds at 24" in text


def test_the_findings_use_no_adjective_the_rule_does_not_give():
    """Issue 69 found words beyond the records: a system called "the best" by its mean alone, a
    one-seed curve that "reproduces", a thin call called plainly.  The adjectives now come from the
    rule (`call`'s labels); these phrases must not come back."""
    from study import report

    text = " ".join(report.FINDINGS.read_text().split())
    for phrase in ("It is the best 24-layer system", "*does* reproduce in the setting closest",
                   "**MSC-24 is better than pre-norm-24", "**MSC-6 is worse than plain pre-norm-6",
                   "It is a narrow call", "so no choice changes when made on valid"):
        assert phrase not in text, phrase
    assert "the 1600-update budget and the post-norm schedule were chosen on test BLEU" in text


def test_the_committed_report_is_what_the_committed_records_regenerate(tmp_path):
    """docs/fidelity.md is generated, never edited: the report regenerated from the committed records
    (``--report-only`` into a scratch work directory) equals the committed one but for the date of its
    'Generated by' line (issue 80, part 2: every call regenerates identically)."""
    import re

    from study import cli as study_cli

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "report.md"
    assert study_cli.main(["--preset", "cpu", "--report-only", "--work-dir", str(tmp_path / "work"), "--records",
                          str(repo / "benchmarks" / "results" / "fidelity" / "cpu"), "--report", str(out)]) == 0

    def undated(text):
        return re.sub(r"(Generated by `python [^`]+`) \(\d{4}-\d{2}-\d{2}\)", r"\1",
                      text, count=1)

    committed, regenerated = undated((repo / "docs" / "fidelity.md").read_text()), undated(out.read_text())
    assert regenerated == committed, "docs/fidelity.md differs from what the records regenerate: run " \
                                     "python -m study --preset cpu --report-only"
