"""Every repository path that the code and the documentation cite exists.

Code (``*.py``, ``*.sh``, ``*.toml``) and documentation (``*.md``) name files of this repository
in prose, comments and messages: ``docs/<name>.md``, ``tests/test_<name>.py::test_<case>``,
``scripts/<name>.py``, ``deepnmt_fairseq/<module>.py``, ``benchmarks/results/<file>``,
``configs/<name>.yaml``.  A file that moves leaves such references dangling; this test fails with
``file:line: path`` for each one that names nothing.  Markdown links (``[text](target)``, images
included) are checked too, relative to the document that holds them.

Templates are not paths: a reference followed by ``{``, ``<``, ``*``, ``$`` or ``[`` (an
f-string, a placeholder, a glob) is skipped, and so is a path that is a suffix of a longer one
(``../x``, ``/abs/x``, ``work/data``, ``pkg.mod/x``).  ``tests/<module>.<name>`` names an attribute
of ``tests/<module>.py``, and a path right after the word "removed" names a file on purpose gone.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".sh", ".toml", ".md"}
# the top-level folders whose files are cited by repository-relative paths
ROOTS = ("docs", "tests", "scripts", "deepnmt_fairseq", "deepnmt_deploy", "deepnmt_data", "benchmarks", "configs",
         "study")
PATH = re.compile(r"(?<![\w./\-])((?:%s)/[\w.\-/]*)(.?)" % "|".join(ROOTS))
TEMPLATE_NEXT = set("{<*$[")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SKIP_DIRS = {"work", "__pycache__", "node_modules", "build", "dist"}


def _files():
    """The repository's files (git's view when it has one: tracked and untracked, not ignored)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO, capture_output=True, check=True).stdout.decode()
        names = sorted({n for n in out.split("\0") if n})
    except (OSError, subprocess.CalledProcessError):  # not a checkout: walk it
        names = []
        for root, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")]
            names += [os.path.relpath(os.path.join(root, f), REPO) for f in files]
    return [REPO / n for n in names if Path(n).suffix in SUFFIXES and (REPO / n).is_file()]


def dangling_paths(path: Path, text: str):
    """(line, cited path) for each repository-relative path in ``text`` that does not exist."""
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in PATH.finditer(line):
            cited, after = m.group(1).rstrip(".-"), m.group(2)
            if after in TEMPLATE_NEXT or re.search(r"\bremoved\s+$", line[: m.start()]):
                continue
            if (REPO / cited).exists():
                continue
            head, _, tail = cited.rpartition("/")
            module = head + "/" + tail.split(".", 1)[0] + ".py"
            if "." in tail and not tail.endswith(".py") and (REPO / module).is_file():  # tests/x.attr
                continue
            yield lineno, cited


def dangling_links(path: Path, text: str):
    """(line, target) for each relative markdown link in ``text`` whose file does not exist."""
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"[a-zA-Z][\w+.-]*:|#", target):  # a URL or an anchor in this document
                continue
            file = target.split("#", 1)[0]
            if not (path.parent / file).exists():
                yield lineno, target


def test_every_cited_repository_path_exists():
    problems = []
    files = [f for f in _files() if f != Path(__file__).resolve()]  # its examples name nothing
    assert any(f.name == "README.md" for f in files), "the scan found no README.md"
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        rel = f.relative_to(REPO)
        problems += [f"{rel}:{n}: {p}" for n, p in dangling_paths(f, text)]
        if f.suffix == ".md":
            problems += [f"{rel}:{n}: link {t}" for n, t in dangling_links(f, text)]
    assert not problems, f"{len(problems)} references to nothing:\n" + "\n".join(problems)


@pytest.mark.parametrize("text, found", [
    ("see docs/no-such-file.md.", ["docs/no-such-file.md"]),
    ("`tests/test_no_such.py::test_x` fails", ["tests/test_no_such.py"]),
    ("deepnmt_fairseq/no_such_module.py and docs/reliability.md", ["deepnmt_fairseq/no_such_module.py"]),
    ("f'docs/{name}.md', benchmarks/results/fidelity/<preset>/x.json, docs/data*.md", []),
    ("../shared/papers/x.md, /work/main/docs/x.md, work/data/x", []),
    ("records `benchmarks/results/no-such/dd-*-6-12.json`, the removed scripts/no_such.py", []),
    ("tests/fairseq_helpers.make_parallel_text, tests/no_such.attr", ["tests/no_such.attr"]),
    ("scripts/no_such/ and scripts/slurm/.", ["scripts/no_such/"]),
])
def test_the_scan_finds_paths_that_name_nothing(text, found):
    assert [p for _, p in dangling_paths(REPO / "README.md", text)] == found


def test_the_scan_finds_dangling_links():
    doc = REPO / "docs" / "reliability.md"
    text = "[a](mechanisms.md#x) [b](../README.md) [c](https://x.org/y) [d](#top) ![e](img/nothing.png) [f](layout.md)"
    assert [t for _, t in dangling_links(doc, text)] == ["img/nothing.png", "layout.md"]
