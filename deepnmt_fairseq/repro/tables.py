"""Markdown tables of the papers' results next to ours, one per paper table.

    deepnmt-repro table [--table KEY] [--checkpoint-root DIR] [--output FILE]
    deepnmt-repro table --docs [--output docs/reproduction.md]   # regenerate the doc (from a checkout)
    deepnmt-repro table --check-docs                            # exit 1 if it drifted

Each row shows the paper's numbers, ours from ``<checkpoint-root>/<experiment>/results.json``
(written by ``deepnmt-repro evaluate``; "—" until it exists) and the command that produces
it (``deepnmt-repro train NAME && deepnmt-repro evaluate NAME``; in docs/reproduction.md
the checkout's ``scripts/train.sh NAME && scripts/evaluate.sh NAME``).  Rows of systems
from other papers that the plugin does not implement have no command and say why.
"""

from __future__ import annotations

import json
import os
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Dict, List, Optional

from . import registry as experiments
from .commands import ddp_backend, default_work_dir
from .spec import Table

DOC = Path("docs") / "reproduction.md"  # relative to the repository root
CLI_COMMAND = "deepnmt-repro train {name} && deepnmt-repro evaluate {name}"
DOC_COMMAND = "scripts/train.sh {name} && scripts/evaluate.sh {name}"

METRICS = [  # results.json / Row.paper key, column title
    ("bleu", "BLEU"), ("rouge1", "R-1"), ("rouge2", "R-2"), ("rougeL", "R-L"),  # ROUGE: MSC Table 6
    ("sacrebleu", "sacreBLEU"), ("single_bleu", "single ckpt"), ("valid_ppl", "valid PPL"),
    ("params_m", "params (M)"), ("train_hours", "train h"), ("tokens_per_s", "tokens/s"),
    ("speedup_vs_base", "speedup vs Base"), ("speedup_vs_deep", "speedup vs Deep"),
]
# GPKD speedups: relative to Base-RPR-6L and to the plain Deep-RPR-48L (no GP), each with its paper's beam
RELATIVE = {"speedup_vs_base": "gpkd-wmt14-ende-base-6L", "speedup_vs_deep": "gpkd-wmt14-ende-48L"}


def result_key(name: str, results_file: str = "results.json") -> str:
    """Key of an evaluation in :func:`load_results`: the experiment name for its results.json, else
    ``name/<file>`` (a second evaluation of the same experiment, Row.results)."""
    return name if results_file == "results.json" else f"{name}/{results_file}"


def load_results(root: Path) -> Dict[str, dict]:
    out = {}
    files = {(name, "results.json") for name in experiments.EXPERIMENTS}
    files |= {(r.experiment, r.results) for t in experiments.TABLES for r in t.rows if r.experiment}
    for name, fname in sorted(files):
        path = root / name / fname
        if path.exists():
            try:
                out[result_key(name, fname)] = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                pass
    return out


def _fmt(v, paper: bool = False) -> str:
    if v is None or v == "":
        return "—"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if paper:
            return f"{v:g}"
        return f"{v:.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def measured(key: str, name: Optional[str], results: Dict[str, dict]):
    if not name or name not in results:
        return None
    res = results[name]
    if key in RELATIVE:
        ref = results.get(RELATIVE[key], {})
        if res.get("tokens_per_s") and ref.get("tokens_per_s"):
            return round(res["tokens_per_s"] / ref["tokens_per_s"], 2)
        return None
    return res.get(key)


# printed beside the headline BLEU (ours only): the other tokenized BLEU, so that a paper's own metric is
# the headline and the other convention is still visible (Row.paper["bleu"] is compared with the headline)
BESIDE = [("tok_bleu", "tok. BLEU"), ("tok_bleu_compound_split", "compound-split BLEU")]


def _flag_values(seq) -> Dict[str, str]:
    """{--flag: value ('' for a switch)} of a flag sequence."""
    return {k: (seq[i + 1] if i + 1 < len(seq) and not seq[i + 1].startswith("--") else "")
            for i, k in enumerate(seq) if k.startswith("--")}


DD_SETTINGS_HEAD = "CAD/CRT (* = not in the paper, † = our reading of it)"


def dd_settings(name: str) -> str:
    """The CAD / CRT values an experiment runs with, ``*`` marking each value that is our choice rather than
    the paper's (Sec. 3.3-4.3 print none of them; the text names drop depth 21 of 27, ratio 1.0, tau 0.05 and
    0.1 as points of its sweeps) and ``†`` a value that is our reading of the paper's words: loss weights of 1,
    the unweighted sum of its 'joint model optimization' (it gives no weights), and p_net 1, whose layers have no
    cross-attention at inference either (the paper: 'During the inference stage, both attentions are used').
    Empty for models without CAD or CRT."""
    st = experiments.EXPERIMENTS[name].eval_stage
    f, crit = _flag_values(st.model_flags), _flag_values(st.criterion_flags)
    depth, ratio = f.get("--cad-drop-depth"), f.get("--cad-drop-ratio")
    dec = int(f.get("--decoder-layers") or 0)
    key = experiments.arch_key(st.arch)
    if key is not None and key[0] == "dd":
        dec = dec or key[3]
        if key[-1]:  # a named CAD architecture: its cad_defaults unless the flags say otherwise
            d, r = experiments.cad_defaults(key[3])
            depth, ratio = depth or str(d), ratio or f"{r:g}"
    out = []
    if depth is not None:
        out.append(f"L_dr {depth}" + ("" if (depth == "21" and dec == 27) else "*"))
        out.append(f"p_net {ratio}" + ("†" if ratio in ("1", "1.0") else "*"))
    if st.criterion == experiments.CR and (crit.get("--ddr-alpha") not in (None, "0") or
                                           crit.get("--ald-alpha") not in (None, "0")):
        def weight(v):  # 1 = the unweighted sum (our reading); anything else is our choice
            return f"{float(v):g}" + ("†" if float(v) == 1.0 else "*")

        if crit.get("--ddr-alpha") not in (None, "0"):
            out.append(f"α_DDR {weight(crit['--ddr-alpha'])}")
        if crit.get("--ald-alpha") not in (None, "0"):
            out.append(f"α_ALD {weight(crit['--ald-alpha'])}")
            out.append(f"p_ALD {crit.get('--ald-p', '?')}*")
            tau = crit.get("--ald-tau", "?")
            out.append(f"τ {tau}" + ("" if tau in ("0.05", "0.1") else "*"))
    return ", ".join(out)


def _settings_column(t: Table) -> bool:
    """Deep-decoder tables show the CAD/CRT values of each run, '*' marking our choices."""
    return t.paper == experiments.DD


def markdown_table(head: List[str], rows: List[List[str]]) -> List[str]:
    """The lines of a markdown table (a ``|`` inside a cell escaped)."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |" for cells in rows)]


def render_table(t: Table, results: Dict[str, dict], with_measured: bool = True, command: str = CLI_COMMAND) -> str:
    keys = [(k, title) for k, title in METRICS if any(k in r.paper for r in t.rows)]
    primaries = {experiments.EXPERIMENTS[r.experiment].eval.primary for r in t.rows if r.experiment}
    beside = [(k, title) for k, title in BESIDE if with_measured and primaries & {b for b, _ in BESIDE}]
    head = ["row"]
    for _, title in keys:
        head += [f"{title} (paper)"] + ([f"{title} (ours)"] if with_measured else [])
    head += [f"{title} (ours)" for _, title in beside]
    if _settings_column(t):
        head.append(DD_SETTINGS_HEAD)
    head += ["command", "note"]
    lines = [f"### {t.title}", ""]
    if t.note:
        lines += [t.note, ""]
    rows = []
    for r in t.rows:
        cells = [r.label]
        for k, _ in keys:
            cells.append(_fmt(r.paper.get(k), paper=True))
            if with_measured:
                cells.append(_fmt(measured(k, r.experiment and result_key(r.experiment, r.results), results)))
        for k, _ in beside:
            cells.append(_fmt(measured(k, r.experiment and result_key(r.experiment, r.results), results)))
        if _settings_column(t):
            cells.append(dd_settings(r.experiment) if r.experiment else "")
        cmd = command.format(name=r.experiment) + (f" {r.eval_args}" if r.eval_args else "")
        cells.append(f"`{cmd}`" if r.experiment else "(no command)")
        cells.append(r.note)
        rows.append(cells)
    return "\n".join(lines + markdown_table(head, rows)) + "\n"


def render(root: Path, only: Optional[str] = None, command: str = CLI_COMMAND) -> str:
    results = load_results(root)
    out = [f"# Reproduction results ({len(results)} experiment(s) evaluated under {root})", ""]
    for t in experiments.TABLES:
        if only and t.key != only:
            continue
        out.append(f"## {t.paper}\n")
        out.append(render_table(t, results, command=command))
    return "\n".join(out)


# ------------------------------------------------------------------------------ docs
#: docs/reproduction.md's prose (package data); a line ``{{ procedure: NAME }}`` is registry
#: ``PROCEDURES[NAME]`` as a table, and the papers' tables follow it
TEMPLATE = "templates/reproduction.md"
PROCEDURE = re.compile(r"^\{\{ procedure: (\w+) \}\}$", re.M)
PROCEDURE_HEAD = ["what", "the paper", "what we do"]


def doc_intro() -> str:
    """The template with each procedure table built from the registry."""
    text = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    return PROCEDURE.sub(lambda m: "\n".join(markdown_table(
        PROCEDURE_HEAD, [[c.what, c.paper, c.ours] for c in experiments.PROCEDURES[m.group(1)]])), text)

def _stage_line(exp, stage) -> str:
    if stage.kind == "skd":
        return (f"`{stage.name}`: SKD data (deepnmt-skd: the averaged teacher translates the training set, beam "
                f"{stage.beam}, length penalty {stage.lenpen:g})")
    if stage.kind == "extract":
        src = f"{stage.teacher.experiment or exp.name}/{stage.teacher.stage}"
        return (f"`{stage.name}`: student extraction (deepnmt-extract-student from {src}'s averaged model, "
                f"encoder h={stage.encoder_group_size}, decoder h={stage.decoder_group_size}, {stage.select} layer "
                f"per group, seed {stage.seed})")
    r = stage.recipe
    flags = " ".join(stage.model_flags)
    crit = f"{stage.criterion} {' '.join(stage.criterion_flags)}".strip()
    init = f"; init: {stage.init[0]} from {stage.init[1].experiment or exp.name}/{stage.init[1].stage}" if stage.init else ""
    data = f"; data: SKD of {stage.data.experiment}" if stage.data else ""
    from .hydra_config import resolved_model

    return (f"`{stage.name}`: `--arch {stage.arch}{(' ' + flags) if flags else ''}` "
            f"({resolved_model(experiments.EXPERIMENTS, exp, stage)}), criterion `{crit}`, "
            f"lr {r.lr:g} ({'' if r.lr_scheduler == 'inverse_sqrt' else r.lr_scheduler + ', '}"
            f"warm-up {r.warmup_updates}), Adam {r.adam_betas}, {r.tokens_per_update:,} tokens/update, "
            f"{(f'{r.max_update:,} updates' if r.max_update else 'no update limit (--max-epoch)')}, save {r.save}, "
            f"ddp {ddp_backend(stage)}{data}{init}")


def render_docs() -> str:
    out = [doc_intro()]
    by_paper: Dict[str, List[Table]] = {}
    for t in experiments.TABLES:
        by_paper.setdefault(t.paper, []).append(t)
    for paper, tables in by_paper.items():
        out.append(f"## {paper}\n")
        for t in tables:
            out.append(render_table(t, {}, with_measured=False, command=DOC_COMMAND))
            if t.key in experiments.FIGURES:
                fig = experiments.FIGURES[t.key]
                out.append(f"Plot: `deepnmt-repro plot {fig.key}` ({fig.title}). Our choice: {fig.chosen}\n")
            names = []
            for r in t.rows:
                if r.experiment and r.experiment not in names:
                    names.append(r.experiment)
            notes: Dict[str, None] = {}
            out.append("<details><summary>settings of these experiments</summary>\n")
            for name in names:
                exp = experiments.EXPERIMENTS[name]
                e = exp.eval
                out.append(f"* **{name}** ({exp.dataset}): " + "; ".join(_stage_line(exp, s) for s in exp.stages)
                           + f"; evaluation: beam {e.beam}, lenpen {e.lenpen:g}, {e.mode} of last {e.average}, "
                             f"reports `{e.primary}`")
                for s in exp.train_stages:
                    for k, v in s.recipe.notes:
                        notes[f"{k}: {v}"] = None
                for n in exp.notes + e.notes:
                    notes[n] = None
            out.append("\nWhere values come from (notes of these experiments):\n")
            out += [f"* {n}" for n in notes]
            out.append("\n</details>\n")
    return "\n".join(out)


def main(a) -> int:
    """``deepnmt-repro table`` (arguments: :mod:`deepnmt_cli.repro`)."""
    if (a.docs or a.check_docs) and not a.output and not DOC.parent.is_dir():
        print(f"error: no {DOC.parent}/ here: run from the repository root or pass --output FILE", file=sys.stderr)
        return 1
    if a.check_docs:
        path = Path(a.output or DOC)
        ok = path.exists() and path.read_text(encoding="utf-8") == render_docs()
        print(f"{path}: {'up to date' if ok else 'differs from the registry: run deepnmt-repro table --docs'}",
              file=sys.stderr)
        return 0 if ok else 1
    root = Path(a.checkpoint_root) if a.checkpoint_root else default_work_dir() / "checkpoints"
    text = render_docs() if a.docs else render(root, a.table)
    if a.docs and not a.output:
        a.output = str(DOC)
    if a.output:
        path = Path(a.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text)
    return 0
