"""No import cycle among the project's own modules (issue 33).

Reads every module of the packages (deepnmt_fairseq, deepnmt_deploy, deepnmt_data, deepnmt_cli, and the
evidence study's room, study) and of benchmarks/ with :mod:`ast` (no import is executed), takes every import statement, at module
level and inside functions alike, resolves it to a project module (``from .x import y`` is the
submodule ``x.y`` when that is a module, else ``x``), and fails on a cycle, naming it.  A module's
implicit import of its own parent package (Python imports ``a`` before ``a.b``) is not an edge:
it is not something the code chose.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("deepnmt_fairseq", "deepnmt_deploy", "deepnmt_data", "deepnmt_cli", "study")


def _modules() -> Dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    for f in (REPO / "benchmarks").glob("*.py"):  # run as scripts: their directory is on the path
        mods[f.stem] = f
    return mods


def _resolve(name: str, mods: Dict[str, Path]) -> str:
    """The longest prefix of ``name`` that is a project module ('' if none)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in mods:
            return cand
        parts.pop()
    return ""


def import_graph(mods: Dict[str, Path]) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [f"{prefix}.{a.name}" if prefix else a.name for a in node.names]
            for t in targets:
                hit = _resolve(t, mods)
                if hit and hit != mod and not mod.startswith(hit + "."):  # not the implicit parent import
                    edges.add(hit)
        graph[mod] = edges
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_cycle_and_the_function_level_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    mods = _modules()
    graph = import_graph(mods)
    # a function-level import is an edge (deepnmt_fairseq.analysis.param_counts imports the
    # architectures inside default_vocab)
    assert "deepnmt_fairseq.models.architectures" in graph["deepnmt_fairseq.analysis.param_counts"]
    # the study's modules import each other relatively (study/report.py: from .plan import ...)
    assert "study.plan" in graph["study.report"]


def test_no_import_cycle_among_the_projects_modules():
    cycles = find_cycles(import_graph(_modules()))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_serving_and_data_packages_do_not_import_the_training_package():
    graph = import_graph(_modules())
    for mod, edges in graph.items():
        if mod.startswith(("deepnmt_deploy", "deepnmt_data")):
            bad = sorted(e for e in edges if e.startswith("deepnmt_fairseq"))
            assert not bad, f"{mod} imports {bad}"


#: a module name of the command-line layer inside a string ("deepnmt_cli.x", "deepnmt_cli.x:main"): what
#: importlib.import_module, runpy.run_module, ``python -m`` or an entry-point table would be handed
CLI_NAME = re.compile(r"(?<![\w/.])deepnmt_cli(\.\w+)*(:\w+)?(?![\w/])")
LIBRARY = ("deepnmt_fairseq", "deepnmt_data", "deepnmt_deploy")


def _docstrings(tree: ast.AST) -> Set[int]:
    """ids of the docstring nodes (prose may name the command that parses a function's arguments)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


#: the study's room (study/) named in a string as a module: "study.plan", "study.run:main", or the bare
#: package name a ``python -m study`` or importlib would be handed (prose says "the study", never "study" alone)
STUDY_NAME = re.compile(r"^study$|(?<![\w/.])study(\.\w+)+(:\w+)?(?![\w/])")


def cli_names_in_strings(source: str, pattern: "re.Pattern[str]" = CLI_NAME) -> List[str]:
    """The strings (not docstrings) of ``source`` that name a module of deepnmt_cli (or what ``pattern``
    matches), with their line."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits = [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs and pattern.search(node.value)]
    return [f"line {node.lineno}: {node.value!r}" for node in sorted(hits, key=lambda n: (n.lineno, n.col_offset))]


def arrows_into_cli(mods: Dict[str, Path], room: str = "deepnmt_cli") -> List[str]:
    """Every way a module of the library rooms reaches ``room`` (deepnmt_cli, or the study): an import
    statement (at module level or in a function), or a module name in a string (importlib, runpy,
    ``python -m``)."""
    graph = import_graph(mods)
    pattern = CLI_NAME if room == "deepnmt_cli" else STUDY_NAME
    out = []
    for mod, path in sorted(mods.items()):
        if mod.split(".")[0] not in LIBRARY:
            continue
        out += [f"{mod} imports {e}" for e in sorted(graph[mod]) if e.split(".")[0] == room]
        out += [f"{mod} names {hit}" for hit in cli_names_in_strings(path.read_text(encoding="utf-8"), pattern)]
    return out


SAMPLE = '''"""Arguments: deepnmt_cli.repro (a docstring may say so)."""
import importlib, runpy, subprocess, sys
from deepnmt_cli import run
def f():
    """Parsed by deepnmt_cli/distill.py."""
    import deepnmt_cli.repro
    importlib.import_module("deepnmt_cli.average_checkpoints").main([])
    runpy.run_module("deepnmt_cli.repro")
    subprocess.run([sys.executable, "-m", "deepnmt_cli.repro", "list"])
    return {"deepnmt-skd": "deepnmt_cli.skd:main", "path": "see deepnmt_cli/skd.py"}
'''


def test_the_arrow_checker_finds_imports_and_module_names_in_strings(tmp_path):
    assert [h.split(":")[0] for h in cli_names_in_strings(SAMPLE)] == ["line 7", "line 8", "line 9", "line 10"]
    mods = {}
    for mod, text in {"deepnmt_fairseq": "", "deepnmt_fairseq.uses_cli": SAMPLE, "deepnmt_cli": "",
                      "deepnmt_cli.repro": ""}.items():
        package, _, name = mod.rpartition(".")
        path = tmp_path.joinpath(*package.split("."), name + ".py") if package else tmp_path / mod / "__init__.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        mods[mod] = path
    found = arrows_into_cli(mods)
    assert found[:2] == ["deepnmt_fairseq.uses_cli imports deepnmt_cli",
                         "deepnmt_fairseq.uses_cli imports deepnmt_cli.repro"]
    assert [f.split(":")[0] for f in found[2:]] == [f"deepnmt_fairseq.uses_cli names line {n}" for n in (7, 8, 9, 10)]


def test_library_code_never_reaches_the_console_scripts():
    """deepnmt_cli only parses arguments and calls the library; the library (and the data/serving
    packages) never reach up into it: not by an import (module level, in a function, in a package's
    __main__), nor by a module name handed to importlib, runpy or ``python -m`` (issues 68, 80)."""
    arrows = arrows_into_cli(_modules())
    assert not arrows, "arrows into the command-line layer (move what both need into the library):\n" + \
        "\n".join(arrows)


def test_library_code_never_reaches_the_study():
    """The evidence study (study/: plan, run, statistics, report) uses the library; the library
    (deepnmt_fairseq, deepnmt_data, deepnmt_deploy) never imports it, nor names one of its modules in
    a string (issue 80, part 2: the study in a room of its own)."""
    assert "study.run" in _modules() and "study.report" in _modules()  # the walk sees the study's room
    arrows = arrows_into_cli(_modules(), room="study")
    assert not arrows, "arrows from the library into the study:\n" + "\n".join(arrows)
    assert STUDY_NAME.search("study.plan") and STUDY_NAME.search("study") and not STUDY_NAME.search("the study.")


def test_the_study_modules_import_each_other_one_way():
    """The study's modules, each importing only those listed before it: plan, stats, launcher, report,
    run, cli (and evaluate, the evaluation command every run calls, reads the statistics only)."""
    graph = {m: {e for e in edges if e.startswith("study.")} for m, edges in import_graph(_modules()).items()
             if m.startswith("study.")}
    assert graph["study.plan"] == set() and graph["study.stats"] == set()  # the statistics read records only
    assert graph["study.report"] == {"study.plan", "study.stats"}
    assert graph["study.launcher"] == set()
    assert graph["study.evaluate"] == {"study.stats"}
    assert graph["study.run"] <= {"study.plan", "study.launcher"}
    assert not {"study.cli", "study.__main__"} & set().union(*(graph[m] for m in graph if m not in
                                                                ("study.cli", "study.__main__")))


def test_console_scripts_import_no_heavy_module_at_module_level():
    """A console script's module imports only the standard library, deepnmt_cli and the
    torch-free deepnmt_deploy at module level, so that --help answers at once (issue 72)."""
    import sys

    allowed = set(sys.stdlib_module_names) | {"deepnmt_cli", "deepnmt_deploy", "__future__"}
    for f in sorted((REPO / "deepnmt_cli").glob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only; function bodies import after parsing
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{f.name} imports {name} at module level"
