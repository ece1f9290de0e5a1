"""The reproduction registry as part of the installed package (deepnmt_fairseq.repro).

* the registry takes architecture names, CAD defaults and the papers' parameter counts
  from the model code (models/architectures.py), it does not copy or rebuild them;
* ``deepnmt-repro`` / ``python -m deepnmt_cli.repro``;
* several ranks of one multi-stage run (torchrun / Slurm): the non-zero ranks wait for
  rank 0's done markers instead of failing on inputs rank 0 is still writing;
* (slow) a wheel built from the checkout works in a fresh virtual environment, from a
  directory outside the checkout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from deepnmt_fairseq.jobs import runner as job_runner
from deepnmt_cli import repro as cli
from deepnmt_fairseq.repro import commands
from deepnmt_fairseq.repro import registry as reg
from deepnmt_fairseq.repro.spec import EvalSpec, Experiment, Recipe, Ref, TrainStage

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ one source of truth
def test_every_architecture_of_the_registry_is_a_registered_fairseq_architecture():
    from fairseq.models import ARCH_MODEL_REGISTRY

    from deepnmt_fairseq.models import architectures

    used = {s.arch for e in reg.EXPERIMENTS.values() for s in e.train_stages}
    assert len(used) > 40
    missing = sorted(a for a in used if a not in ARCH_MODEL_REGISTRY)
    assert not missing, f"registry names unregistered architectures: {missing}"
    # every named architecture of the plugin, and every family lookup, is a fairseq architecture
    assert set(architectures.PAPER_ROWS) <= set(ARCH_MODEL_REGISTRY)
    assert set(architectures.ARCHS.values()) <= set(architectures.PAPER_ROWS)
    assert architectures.ARCHS[("dd", "base", 15, 15, True)] == "dd_base_15_15_cad"
    # the named architectures the papers' rows need all have experiments
    assert {a for a, (_, _, params) in architectures.PAPER_ROWS.items() if params is not None} <= used
    with pytest.raises(KeyError, match="ARCHS"):
        reg.arch_name("dd", "base", 99, 99, False)
    assert reg.arch_key("dd_base_15_15_cad") == ("dd", "base", 15, 15, True)
    assert reg.arch_key("deep_transformer") is None


def test_registry_does_not_rebuild_architecture_names_or_copy_cad_defaults():
    from deepnmt_fairseq.models import architectures

    files = {p.name: p.read_text(encoding="utf-8") for p in sorted(Path(reg.__file__).parent.glob("*.py"))}
    assert {"msc.py", "bapna.py", "deep_decoder.py", "gpkd.py", "common.py"} <= set(files)
    src = "\n".join(files.values())
    # the family table is read in one place, common.arch_name / arch_key (tables.dd_settings uses arch_key)
    readers = {n for n, text in files.items() if re.search(r"\bARCHS\s*[\[.]|import[^\n]*\bARCHS\b", text)}
    assert readers == {"common.py"}, readers
    families = r"(msc|prenorm|postnorm|transparent|dd|rpr|desdar|gpkd_student)_"
    built = re.findall(r'f"' + families + r"[^\"]*\{", src)
    assert not built, f"architecture names built by string formatting in the registry: {built}"
    assert reg.cad_defaults is architectures.cad_defaults
    assert "21 / 27" not in src and "def cad_defaults" not in src
    # the runner's DDP choice for a named CAD architecture uses the same defaults
    stage = TrainStage(arch=architectures.ARCHS[("dd", "base", 27, 27, True)], recipe=reg.DD_BASE)
    assert commands.named_cad_ratio(stage.arch) == architectures.cad_defaults(27)[1]
    assert commands.ddp_backend(stage) == "legacy_ddp"
    assert commands.named_cad_ratio("dd_base_27_27") == 0.0


def test_registry_paper_parameter_counts_are_the_architectures():
    from deepnmt_fairseq.models.architectures import PAPER_ROWS

    checked = 0
    differing = set()
    for t in reg.TABLES:
        for r in t.rows:
            params = r.paper.get("params_m")
            if r.experiment is None or not isinstance(params, (int, float)):
                continue
            arch = reg.EXPERIMENTS[r.experiment].eval_stage.arch
            own = reg.OWN_PARAM_COUNTS.get((t.key, r.label)) or reg.OWN_PARAM_COUNTS.get((t.key, None))
            if own:
                if params != PAPER_ROWS[arch][2]:
                    differing.add((t.key, r.label))
                continue
            assert PAPER_ROWS[arch][2] is not None, (t.key, r.label, arch)
            assert params == PAPER_ROWS[arch][2], (t.key, r.label, arch, params, PAPER_ROWS[arch][2])
            checked += 1
    assert checked > 60
    # every exception names a table (and row) that exists and really differs from the architecture's count
    for key, label in reg.OWN_PARAM_COUNTS:
        assert any(k == key and (label is None or lab == label) for k, lab in differing), (key, label)


def test_console_script_is_declared_and_works_outside_a_checkout(capsys, tmp_path, monkeypatch):
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'deepnmt-repro = "deepnmt_cli.repro:main"' in text
    assert cli.main(["list", "--names"]) == 0
    names = capsys.readouterr().out.split()
    assert names == list(reg.EXPERIMENTS)
    with pytest.raises(SystemExit) as exit_:  # a usage error: argparse's exit 2 naming the commands
        cli.main(["frobnicate"])
    assert exit_.value.code == 2 and "invalid choice: 'frobnicate'" in capsys.readouterr().err
    assert cli.main([]) == 2 and "deepnmt-repro train NAME" in capsys.readouterr().err
    # repository-only files: a clear error outside a checkout
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check-configs"]) == 1 and "no configs directory" in capsys.readouterr().err
    # the flags of the removed scripts/experiments.py are gone
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--check-configs"])
    assert exit_.value.code == 2 and "COMMAND" in capsys.readouterr().err
    assert cli.main(["table", "--check-docs"]) == 1 and "repository root" in capsys.readouterr().err
    # defaults: ./work under the current directory, unless the environment says otherwise
    paths = commands.Paths.from_env(env={})
    assert (paths.data_root, paths.checkpoint_root) == (tmp_path / "work" / "data", tmp_path / "work" / "checkpoints")
    paths = commands.Paths.from_env(env={"DEEPNMT_DATA": "/d", "DEEPNMT_CHECKPOINTS": "/c"})
    assert (paths.data_root, paths.checkpoint_root) == (Path("/d"), Path("/c"))
    import deepnmt_fairseq

    assert commands.USER_DIR == Path(deepnmt_fairseq.USER_DIR)


# ------------------------------------------------------------------------------ multi-rank runs
def _two_train_stages() -> dict:
    """train 'a', then train 'b' continuing a's checkpoint_last.pt (an input rank 0 marks done)."""
    recipe = Recipe(lr=1e-3, warmup_updates=10, max_update=20, tokens_per_update=8192)
    exp = Experiment(name="two-stage", paper="test", dataset="wmt14-en-de",
                     stages=(TrainStage(arch="rpr_base_6_6", recipe=recipe, name="a"),
                             TrainStage(arch="rpr_base_6_6", recipe=recipe, name="b",
                                        init=("continue", Ref(None, "a", "last")))),
                     eval=EvalSpec(beam=4, lenpen=0.6, average=1, primary="tok_bleu"))
    return {exp.name: exp}


def fake_dataset(data_root: Path, exp) -> Path:
    """The files of a binarized dataset that the check before any step looks for (empty)."""
    src, tgt = exp.lang_pair
    bin_dir = data_root / exp.dataset / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in (f"dict.{src}.txt", f"dict.{tgt}.txt", f"train.{src}-{tgt}.{src}.idx"):
        (bin_dir / name).write_text("")
    return bin_dir


@pytest.mark.parametrize("name", ["gpkd-wmt14-ende-48L-teacher", "two-stage"])
def test_non_zero_rank_waits_for_rank_0_at_stage_boundaries(name, tmp_path, monkeypatch):
    """Two ranks (torchrun's WORLD_SIZE / RANK / LOCAL_RANK) run the same multi-stage experiment.
    Rank 0 finishes its training step later than rank 1 (it also writes the .done marker);
    rank 1 must wait for rank 0's markers - the GPKD teacher's averaged model and SKD data
    (rank-0-only steps), or the first stage's .done (input of the second) - not fail with
    'missing input(s)'."""
    registry = reg.EXPERIMENTS if name in reg.EXPERIMENTS else _two_train_stages()
    exp = registry[name]
    ran, waits = [], []
    monkeypatch.setattr(job_runner, "WAIT_POLL", 0.02)
    monkeypatch.setattr(job_runner, "make_log", lambda prefix, echo=None: lambda msg: waits.append(msg)
                        if msg.startswith("waiting for rank 0") else None)

    def fake_tee(argv, logfile):
        if "--distributed-rank" in argv:  # fairseq-train, on every rank
            rank = int(argv[argv.index("--distributed-rank") + 1])
            save = Path(argv[argv.index("--save-dir") + 1])
            ran.append((rank, "train", save.name))
            time.sleep(1.0 if rank == 0 else 0.0)  # rank 0 is the slow one
            save.mkdir(parents=True, exist_ok=True)
            if rank == 0:
                (save / "checkpoint_last.pt").write_bytes(b"model")
            return 0
        out = Path(argv[argv.index("--output") + 1])
        if argv[0].endswith("deepnmt-skd"):  # rank 0 only
            ran.append((0, "skd", out.name))
            out.mkdir(parents=True, exist_ok=True)
            (out / ".done").write_text("")
            return 0
        ran.append((0, "run", out.name))  # deepnmt-average-checkpoints / extract: rank 0 only
        out.write_bytes(b"averaged")
        return 0

    monkeypatch.setattr(job_runner.Runner, "tee", lambda self, argv, logfile: fake_tee(argv, logfile))
    results, errors = {}, {}

    def rank_main(rank: int):
        env = {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "CUDA_VISIBLE_DEVICES": ""}
        try:
            launch = commands.make_launch("torchrun", cpu=True, env=env)
            opts = commands.RunOptions(paths=commands.Paths(tmp_path / "data", tmp_path / "ck"), launch=launch)
            results[rank] = commands.run_steps(commands.Planner(registry, exp, opts).plan(), launch)
        except Exception as err:  # noqa: BLE001 - reported below
            errors[rank] = err

    fake_dataset(tmp_path / "data", exp)
    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, f"ranks failed: {errors}"
    assert results == {0: 0, 1: 0}
    assert waits, "rank 1 never had to wait: the test did not exercise the race"
    trains = [r for r in ran if r[1] == "train"]
    assert len(trains) == 2 * len(exp.train_stages)  # training on both ranks
    assert all(rank == 0 for rank, kind, _ in ran if kind != "train")  # the rest on rank 0, once each
    last = exp.stages[-1]
    root = tmp_path / "ck" / name
    if last.kind == "skd":
        assert (root / "skd" / "bin" / ".done").exists()
    else:
        assert (root / last.name / ".done").exists()


def test_non_zero_rank_fails_at_once_on_inputs_no_rank_will_write(tmp_path, monkeypatch):
    """A GPKD student whose teacher was never trained: rank 1 says so instead of waiting for rank 0."""
    monkeypatch.setattr(job_runner, "WAIT_POLL", 0.02)
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": ""}
    launch = commands.make_launch("torchrun", cpu=True, env=env)
    opts = commands.RunOptions(paths=commands.Paths(tmp_path / "data", tmp_path / "ck"), launch=launch)
    steps = commands.Planner(reg.EXPERIMENTS, reg.EXPERIMENTS["gpkd-wmt14-ende-24-1"], opts).plan()
    outcome = {}

    def rank1():
        try:
            commands.run_steps(steps, launch)
        except commands.ReproError as err:
            outcome["error"] = str(err)

    t = threading.Thread(target=rank1, daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "rank 1 waits for an input that no rank of this run writes"
    assert "missing input" in outcome["error"] and "gpkd-wmt14-ende-48L-ssl-gp-e2-d6-teacher" in outcome["error"]


# ------------------------------------------------------------------------------ wheel (slow)
PER_PAPER = ["msc-iwslt14-ende-72L-l2", "transparent-wmt14-ende-16L", "dd-wmt14-ende-base-15-15-cad-crt",
             "gpkd-wmt14-ende-24-1"]


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    """pip wheel from (a copy of) the checkout, installed alone into a fresh virtual
    environment that borrows torch/fairseq/... from this one (a .pth line to its
    site-packages, which holds no copy of deepnmt_fairseq), run from outside the checkout."""
    import sysconfig

    src = tmp_path / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / f, src / f)
    for pkg in ("deepnmt_fairseq", "deepnmt_data", "deepnmt_cli", "deepnmt_deploy"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(dist)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = dist.glob("deepnmt_fairseq-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "deepnmt_fairseq/repro/registry/__init__.py" in names and "deepnmt_fairseq/repro/registry/gpkd.py" in names
    for mod in ("spec", "commands", "evaluate", "hydra_config", "tables", "cli"):
        assert f"deepnmt_fairseq/repro/{mod}.py" in names, mod
    assert "deepnmt_fairseq/scoring.py" in names  # the one scorer (issue 80)
    assert "deepnmt_fairseq/quickstart_times.json" in names  # the quickstart estimate's record
    assert "deepnmt-repro = deepnmt_cli.repro:main" in entry_points
    assert "deepnmt_cli/repro.py" in names
    assert "deepnmt_fairseq/repro/templates/reproduction.md" in names  # docs/reproduction.md's prose
    # the data preparation (deepnmt_data, no torch) travels with the wheel, with its command
    assert {"deepnmt_data/corpora.py", "deepnmt_data/cnndm.py", "deepnmt_data/prepare/cli.py"} <= names
    assert "deepnmt-prepare-data = deepnmt_data.prepare.cli:main" in entry_points

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    vpy = venv / "bin" / "python"
    vsite = Path(subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    # torch, fairseq, ... (a path line: the .pth files there, e.g. an editable install's finder, are not run;
    # the fresh venv's own site-packages comes first on the import path in any case)
    (vsite / "borrowed_deps.pth").write_text(str(ours) + "\n")
    res = subprocess.run([str(vpy), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "DEEPNMT_CHECKPOINTS": str(outside / "ck")}

    def run(*argv):
        r = subprocess.run(list(argv), capture_output=True, text=True, cwd=outside, env=env, timeout=600)
        assert r.returncode == 0, f"{argv}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        return r.stdout

    where = run(str(vpy), "-c", "import deepnmt_fairseq, fairseq; print(deepnmt_fairseq.__file__); "
                                "print(deepnmt_fairseq.USER_DIR)").split()
    assert Path(where[0]).is_relative_to(venv) and Path(where[1]) == vsite / "deepnmt_fairseq"
    assert not Path(where[0]).is_relative_to(REPO)
    names = run(str(venv / "bin" / "deepnmt-repro"), "list", "--names").split()
    assert set(PER_PAPER) <= set(names) and len(names) == len(reg.EXPERIMENTS)
    for i, name in enumerate(PER_PAPER):
        cmd = [str(vpy), "-m", "deepnmt_cli.repro"] if i == 0 else [str(venv / "bin" / "deepnmt-repro")]
        out = run(*cmd, "train", name, "--dry-run", "--gpus", "8")
        trains = [ln for ln in out.splitlines() if "fairseq-train" in ln]
        assert trains, out
        for ln in trains:
            assert f"--user-dir {vsite / 'deepnmt_fairseq'} " in ln  # the installed package, not the checkout
            assert str(REPO) not in ln
        assert str(outside / "ck" / name) in out
        if name.startswith("gpkd"):  # the student trains on its teacher's SKD data
            assert str(outside / "ck" / "gpkd-wmt14-ende-48L-ssl-gp-e2-d6-teacher" / "skd" / "bin") in out
        else:  # default data root: ./work under the current directory
            assert f" {outside / 'work' / 'data'}/" in trains[0]
    # docs/reproduction.md from the installed package alone (its prose is package data)
    run(str(venv / "bin" / "deepnmt-repro"), "table", "--docs", "--output", str(outside / "reproduction.md"))
    assert (outside / "reproduction.md").read_text(encoding="utf-8") == (REPO / "docs" / "reproduction.md").read_text(
        encoding="utf-8")
    # one data preparation, planned (--dry-run) by the installed command, where deepnmt-repro reads the data
    out = run(str(venv / "bin" / "deepnmt-prepare-data"), "iwslt14-de-en", "--dry-run")
    assert f"output: {outside / 'work' / 'data' / 'iwslt14-de-en'}\n" in out, out
    assert "iwslt14-de-en.tgz: download http" in out and "bin  [to do] fairseq-preprocess" in out, out
    run(str(vpy), "-c", "import sys, deepnmt_data.prepare.cli as c; assert c.__file__.startswith(sys.prefix), "
                        "c.__file__; assert 'torch' not in sys.modules and 'fairseq' not in sys.modules")


def test_show_prints_each_recipes_own_optimizer(capsys):
    """deepnmt-repro show names the optimizer the row trains with (RAdam for the Admin rows, Adam
    elsewhere), not one fixed name."""
    assert cli.main(["show", "admin-wmt14-enfr-6L-6L"]) == 0
    assert "), radam (0.9, 0.98)" in capsys.readouterr().out
    assert cli.main(["show", "msc-iwslt14-ende-72L-l2"]) == 0
    assert "), adam (0.9, 0.98)" in capsys.readouterr().out
