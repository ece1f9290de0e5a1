"""Console scripts as users expect (issue 72): every ``deepnmt-*`` command answers ``--help``
without importing torch or fairseq, every option has a help text, choices written in a
description are the parser's, help texts are plain text (no RST), and ``--help`` is honoured
everywhere."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def _parser_of(target: str) -> argparse.ArgumentParser:
    module = importlib.import_module(target.split(":")[0])
    for name in ("build_parser", "parser"):
        if callable(getattr(module, name, None)):
            return getattr(module, name)()
    raise AssertionError(f"{target}: no build_parser()")


def _all_parsers(p: argparse.ArgumentParser, prefix: str):
    yield prefix, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_parsers(sub, f"{prefix} {name}")


def test_every_console_script_has_a_parser_module_without_heavy_imports():
    assert len(SCRIPTS) >= 15
    code = ("import importlib, sys\n"
            "for target in sys.argv[1:]:\n"
            "    mod, fn = target.split(':')\n"
            "    m = importlib.import_module(mod)\n"
            "    try:\n"
            "        getattr(m, fn)(['--help'])\n"
            "    except SystemExit as e:\n"
            "        assert e.code == 0, (target, e.code)\n"
            "    else:\n"
            "        raise AssertionError(target + ': --help did not exit')\n"
            "heavy = sorted(k for k in ('torch', 'fairseq', 'deepnmt_fairseq', 'ctranslate2') if k in sys.modules)\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code, *SCRIPTS.values()], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY []" in out.stdout, out.stdout[-500:]
    for name in SCRIPTS:  # each help names its own program in the usage line
        assert f"usage: {name}" in out.stdout, name


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_texts_are_complete_plain_and_consistent(name):
    for prog, p in _all_parsers(_parser_of(SCRIPTS[name]), name):
        assert p.prog.startswith(name), (name, p.prog)
        text = p.format_help()
        for rst in ("``", ":mod:", ":func:", ":class:", ":data:"):
            assert rst not in text, f"{prog}: RST markup {rst!r} in --help"
        assert not re.search(r"^\s*\.\. [a-z-]+::", text, re.M), f"{prog}: an RST directive in --help"
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{prog}: {'/'.join(action.option_strings) or action.dest} has no help text"
        # a synopsis that lists choices ("--flag a|b|c") lists the parser's
        choices = {o: set(a.choices) for a in p._actions if a.choices and not isinstance(
            a, argparse._SubParsersAction) for o in a.option_strings}
        for flag, listed in re.findall(r"(--[a-z0-9-]+)[ =]([a-z0-9_]+(?:\|[a-z0-9_]+)+)", p.description or ""):
            if flag in choices:
                assert set(listed.split("|")) == choices[flag], (prog, flag, listed, sorted(choices[flag]))


def test_help_is_honoured_by_the_user_dir_commands():
    out = subprocess.run([sys.executable, "-m", "deepnmt_cli.user_dir", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: deepnmt-user-dir"), out
    plain = subprocess.run([sys.executable, "-m", "deepnmt_cli.user_dir"], capture_output=True, text=True)
    assert Path(plain.stdout.strip(), "__init__.py").is_file(), plain
    module = subprocess.run([sys.executable, "-m", "deepnmt_fairseq", "--help"], capture_output=True, text=True)
    assert module.returncode == 0 and "usage: python -m deepnmt_fairseq" in module.stdout, module


def test_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path):
    """A user's mistake ends in one line naming the problem, not a traceback."""
    bad = tmp_path / "random.pt"
    bad.write_bytes(bytes(range(256)) * 4)
    for argv in (["deepnmt_cli.export_ct2", str(bad), str(tmp_path / "out")],
                 ["deepnmt_cli.extract_student", "--teacher", str(bad), "--output", str(tmp_path / "s.pt")],
                 ["deepnmt_cli.average_checkpoints", "--inputs", str(tmp_path / "missing"), "--num-checkpoints", "2",
                  "--output", str(tmp_path / "avg.pt")]):
        out = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=300)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode != 0, argv
        assert "Traceback" not in out.stderr, out.stderr[-1500:]
        errors = [line for line in lines if ": error: " in line]
        assert len(errors) == 1 and errors[0].startswith("deepnmt-"), out.stderr[-1500:]


def test_the_same_thing_has_the_same_flag_across_commands():
    """An output location is --output everywhere (--out stays as the short form where it was), a
    work directory --work-dir, a beam --beam: a user who learned one command knows the others."""
    spellings = {"output": {"--output", "--out", "--output-dir", "--out-dir", "--outdir"},
                 "work": {"--work-dir", "--workdir", "--work"}, "beam": {"--beam", "--beam-size"}}
    canonical = {"output": "--output", "work": "--work-dir", "beam": "--beam"}
    for name in sorted(SCRIPTS):
        for prog, p in _all_parsers(_parser_of(SCRIPTS[name]), name):
            for action in p._actions:
                opts = set(action.option_strings)
                for thing, variants in spellings.items():
                    if opts & variants:
                        assert canonical[thing] in opts, f"{prog}: {sorted(opts)} should be spelled {canonical[thing]}"
