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
import sys
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
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
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
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


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
DOC_INTRO = """\
# Reproducing the papers' tables

<!-- GENERATED by `deepnmt-repro table --docs` from the registry in
deepnmt_fairseq/repro/registry/; edit the registry (or DOC_INTRO in deepnmt_fairseq/repro/tables.py),
not this file. -->

Every row of the four papers' tables has an entry in the registry `deepnmt_fairseq/repro/registry/`
(one module per paper, part of the installed package; `deepnmt-repro list`), which `deepnmt-repro` turns into exact commands.
`scripts/train.sh` and `scripts/evaluate.sh` are the same commands from a checkout:

```bash
python scripts/prepare_data.py iwslt14-en-de                   # data (docs/data-preparation.md)
deepnmt-repro train msc-iwslt14-ende-72L-l2 --dry-run --gpus 8 # print the commands
deepnmt-repro train msc-iwslt14-ende-72L-l2 [--fp16]           # train (every stage, resumable)
deepnmt-repro evaluate msc-iwslt14-ende-72L-l2                 # average, decode, score -> results.json
deepnmt-repro table                                            # paper vs ours, every table
# the same from a checkout: scripts/train.sh NAME ..., scripts/evaluate.sh NAME
```

## How the commands are built

* **Data**: `$DEEPNMT_DATA/<dataset>/bin` (default `work/data` under the current directory; the scripts
  default to `<repo>/work/data`), references for scoring in
  `$DEEPNMT_DATA/<dataset>/tok/test.<tgt>` (Moses-tokenized) and `raw/` (untokenized, per test-set part as
  `scripts/prepare_data.py` writes them). `--data DIR` replaces the binarized data.
* **Checkpoints**: `$DEEPNMT_CHECKPOINTS/<name>` (default `work/checkpoints`, likewise; `--save-dir` for one
  experiment); stage `S` of a multi-stage experiment in `<name>/S`. GPKD students find their teacher under
  the same root, so run the teacher first (`scripts/train.sh gpkd-wmt14-ende-48L-teacher`); a missing input
  is a clear error naming the experiment to run.
* **Stages**: `train.sh` runs every stage in order and skips finished ones (`.done` markers; a re-run
  resumes an interrupted fairseq-train from `checkpoint_last.pt`). GPKD: teacher (`fairseq-train` with group
  permutation) → SKD data (`deepnmt-skd` on the teacher's averaged model, beam 4, length penalty 0.6,
  resumable shards) → one layer per group (`deepnmt-extract-student` on the teacher's averaged model, with the
  group size the teacher was GP-trained with) → student (`--finetune-from-model`, on the SKD data).
  Skipping sub-layer two-stage training: stage 1 early-stopped (`--patience`), stage 2 with the method on
  continues stage 1's averaged weights *and* its optimizer state, schedule and update count
  (`deepnmt-average-checkpoints --keep-training-state`, then `--continue-once`; a restart resumes from the
  stage's own checkpoint). See "GPKD and deep-decoder procedure" below.
* **Tokens per update** are the paper's on any number of GPUs W: `--update-freq = ceil(T / (max_tokens·W))`
  with `max_tokens` 4096 per GPU (lowered when W·4096 alone exceeds T, e.g. 1024 on 64 GPUs for 65,536).
  W comes from `--gpus`, `CUDA_VISIBLE_DEVICES`/`nvidia-smi`, or the launcher's world size.
* **DDP backend**: `--ddp-backend legacy_ddp` (fairseq's `no_c10d`, gradients all-reduced after the backward
  pass) for the `collapse_reducing` criterion — it calls `model.encoder`/`model.decoder` itself, i.e. around
  the DDP wrapper, so c10d would not synchronise its gradients — and for stochastic structure (CAD with
  0 < p < 1, skipping sub-layer, stochastic layers, LayerDrop, group permutation): the plugin keeps skipped
  parameters in the graph so c10d would work there too, but legacy_ddp does not rely on it (and is what the
  GPKD authors used). Plain models keep fairseq's `c10d` (overlaps communication with the backward pass).
* **Multi-GPU / multi-node** through fairseq's own distributed engine: one node — `train.sh` lets fairseq
  spawn one worker per visible GPU; Slurm — `sbatch --nodes N scripts/slurm/train.sbatch NAME` (one task per
  GPU, `--distributed-rank` from `SLURM_PROCID`, `--device-id` from `SLURM_LOCALID`,
  `--distributed-init-method tcp://<first node>:PORT`); torchrun — `scripts/torchrun_example.sh NAME`
  (c10d rendezvous, `env://`). Non-training stages run on rank 0; the other ranks wait for its done markers
  before they look at a stage's inputs (at most `$DEEPNMT_RANK0_TIMEOUT` seconds, default one day; a
  failed rank-0 step ends them with its error). A torchrun / Slurm rank that sees no GPU, or `--fp16` /
  `--bf16` without one, is an error unless `--cpu` asks for the CPU on purpose; a missing dataset is an
  error naming `deepnmt-prepare-data NAME`. SKD uses every GPU of rank 0's node (`deepnmt-skd --jobs`).
* **fairseq-hydra-train**: `configs/<name>.yaml` (`<name>__<stage>.yaml` for multi-stage experiments) are
  generated from the same registry (`deepnmt-repro write-configs`; a test checks they are in
  sync): `fairseq-hydra-train --config-dir configs --config-name <name>` from the repository root. They
  assume 8 GPUs for `update_freq` (the header says how to change it) and run one stage only.

## Evaluation (`scripts/evaluate.sh`)

1. The last K checkpoints are averaged with `deepnmt-average-checkpoints` (K and epoch vs interval
   checkpoints per paper: MSC 5 (base) / 20 (big) epoch checkpoints; deep-decoder (Vaswani) 5 / 20 interval
   checkpoints; GPKD 5 epoch checkpoints; Bapna et al.: the *mean score* of the last 21 checkpoints, each
   decoded on its own). `--average 1` uses `checkpoint_last.pt`.
2. `fairseq-generate` on the test split with the paper's beam and length penalty (IWSLT 5 / 1.0, WMT 4 / 0.6)
   and `--required-batch-size-multiple 1` (fairseq otherwise drops the last partial batch); every sentence id
   is checked.
3. Scores in `<save-dir>/results.json`: `tok_bleu` (tokenized, case-sensitive, as `multi-bleu.perl`:
   sacrebleu with `tokenize='none'`, no smoothing — tested equal to a port of multi-bleu.perl's algorithm),
   `tok_bleu_lc` (`multi-bleu.perl -lc`, the IWSLT metric), `tok_bleu_compound_split` for En→De (both sides
   `s/(\\S)-(\\S)/\\1 ##AT##-##AT## \\2/g`, fairseq's `compound_split_bleu.sh`, applied to the aggressive-hyphen
   tokenization of the data), `sacrebleu` + `sacrebleu_signature` (hypotheses detokenized with sacremoses,
   13a; lowercased for IWSLT, whose training data are lowercased), `tokens_per_s` (fairseq-generate's
   "Translated … tokens/s"), and from the training log `params`, `train_hours`, `valid_ppl`. `bleu` is the
   metric the paper reports (`primary_metric`). `fairseq-score --sacrebleu` is broken in fairseq 0.12 and is
   not used.

## Rows that cannot be reproduced here

* GPKD Tables 1 and 3, NIST Zh-En and WMT19 Zh-En columns: NIST OpenMT12 (LDC) and the CWMT/UN Zh-En data
  are not freely available; only the WMT En-De columns have commands.
* Rows of other papers' systems (Vaswani, Ott, Wu, Zhang, Dou, He, Li 2020, DLCL, AAN, …) are cited only; where
  this plugin implements the method the row points at our run (e.g. Wei et al. → the MSC runs; MSC Table 4's
  Wang et al. (2019a) → DLCL 30-6 trained with their released run script).
* Approximations: MSC Table 3's "Wang et al. (2019a)" rows are pre-norm DLCL on MSC's own recipe (its caption:
  "the same Transformer backbone as well as model settings"), not Wang et al.'s WMT script; the
  deep-decoder paper's "+R-Drop" is DDR with R-Drop's α = 5 sharing one encoder pass between the two
  predictions (R-Drop runs the whole model twice).

## Settings the papers do not give

Each experiment's notes (`deepnmt-repro show NAME`, and below) say where a value comes from.
The main choices: Vaswani's learning-rate formula `lr = d^-0.5 · warmup^-0.5` at the peak (MSC,
deep-decoder; Bapna: ×3.0) with fairseq's `inverse_sqrt`; Adam ε 1e-9, no clipping, no weight decay
(Vaswani); 4096 tokens per GPU and pass; Bapna et al.'s batch (8 × 4096 tokens) and 100K updates; the
deep-decoder paper's checkpoint averaging (Vaswani: last 5 / 20); GPKD's optimizer (Adam (0.9, 0.997),
lr 0.002, 16K warm-up: Wang et al. 2019a / the authors' scripts), student training lengths (the Base
schedule); the collapse-reducing weights α_DDR = α_ALD = 1 (the unweighted sum, our reading of "joint model
optimization"; α_ALD 0.5 is a variant row), p_ALD 0.3, τ 0.1 and CAD drop depth round(21/27·L), ratio 0.5;
Bapna et al.'s Transformer norm placement (not stated: post-norm, the reading under which "the deeper
Transformer encoders completely fail to train" can reproduce; the pre-norm reading as variant rows).

## GPKD and deep-decoder procedure: our choices next to the papers' text

GPKD (Li et al. 2021):

| what | the paper | what we do |
|---|---|---|
| extraction group size | "the stacking layers are first divided into M groups and every adjacent h = N/M layers form a group"; "One can compress a 48-layer teacher into a 6-layer network by setting h = 8, or progressively achieve this goal with h = 2 for three times of compression" | a student is extracted with the h its teacher was GP-trained with; `deepnmt-extract-student` refuses another h (the teacher's checkpoint records `gp_group_size` / `gp_decoder_group_size`) unless `--allow-group-size-mismatch`, which is written into the student (`extra_state.gpkd_student.group_size_override`) |
| Table 6 teachers | one "Skipping Sub-Layer + GP" 48-6 system; students 24-3, 24-1, 6-6, 6-3 | silent on the GP h: a teacher per student's (encoder h, decoder h) where the h rule needs one, three in all (3× the paper's teacher cost): (2, 2) for 24-3, (2, 6) for 24-1, (8, 2) for 6-3 and 6-6 (which keeps the whole decoder, decoder h = 1); the (8, 2) one stands for the 30.59 row; the table names each student's teacher |
| baselines | Table 1 lists Deep-RPR-24L/48L apart from the students; Table 3 "+Skipping Sub-Layer" (30.49) and Table 6 "Skipping Sub-Layer + GP" (30.59) are different systems | plain Deep-RPR-24L/48L/Big-12L without GP are the baseline rows of Tables 1-5 and the start of the skipping runs; GP teachers are rows of their own |
| +SKD students | "SKD uses the translation results of the teacher network as the gold" | silent on which teacher: the plain deep model of the rows above |
| progressive compression | "progressively ... with h = 2 for three times" | 48L teacher GP-trained with h = 2; the 24- and 12-layer students are GP-trained with h = 2 on its SKD data before each extraction; the 6-layer student trains without GP; Base schedule per stage |
| two-stage training, stage 1 | "we train the model as usual but early stop it when the model converges on the validation set" | `--patience 3` (validations, one per epoch) on fairseq's validation loss, within 50K updates |
| stage 2 | "apply our Skipping Sub-Layer method to the model and continue training until the model converges again"; Table 3: 50K updates | starts from stage 1's averaged model (last 5 epoch checkpoints: the model the paper evaluates) with stage 1's newest Adam state, learning-rate schedule and update count, `--patience 3`, to the same 50K updates in all as Deep-RPR-48L (Table 3 gives both 50K; stage 1's early stop decides the split). A matched control (`gpkd-wmt14-ende-48L-continued`) runs the same stage 2 without skipping, so a finetune gain is the method's, not more training. fairseq's `--finetune-from-model` (and `--reset-optimizer`) restart the update count at 0, so `inverse_sqrt` warms up again to the peak rate; `--reset-lr-scheduler` alone keeps the count (the schedule is a function of it). We continue (`--continue-once` on an average written with `--keep-training-state`); `scripts/gpkd_pipeline.py --restart-schedule` gives the warm-up when asked |
| SKD data | "the teacher network translates the source inputs" | from the teacher's averaged model (registry and `scripts/gpkd_pipeline.py`), beam 4, length penalty 0.6 |
| student training | "we begin optimizing the student network" | a new run from the extracted weights (`--finetune-from-model`: its own warm-up), Base/Big schedule |
| DESDAR greedy claim | "can achieve a 3.2× speedup with no performance sacrifice with the greedy search" | the same trained DESDAR 48-1 (SKD/GPKD) and Deep 48-6 decoded with beam 1 (`evaluate NAME --beam 1`); the speedup is read as relative to Deep 48-6 with beam 4 (table `gpkd-desdar-greedy`) |
| Fig. 2, 4, 6 | PPL / training loss over training | x = updates; Fig. 4 with the 48-layer teacher's students; Fig. 6's "after" curve = stage 1 then stage 2. The paper has no figure over the skipping rate φ: φ = 0.4 throughout |
| Fig. 5 | "BLEU scores and translation speed against decoder depth" | decoder depths 1, 2, 3, 6, 9, 12 on the 6-layer encoder; 1, 3, 6 (Table 2's systems) on the 48-layer one |
| headline metric | "case-sensitive tokenized BLEU ... multi-bleu.perl", compound splitting for En-De | `tok_bleu_compound_split`; sacreBLEU beside it |

Deep decoder (CAD/CRT):

| what | the paper | what we do |
|---|---|---|
| CRT weights | Sec. 3.4 defines J_DDR and J_ALD but prints no weights; Sec. 1 adds them "for joint model optimization" | the unweighted sum, α_DDR = α_ALD = 1 (the criterion's defaults); our earlier α_ALD 0.5 is the variant row `dd-wmt14-ende-base-15-15-cad-crt-ald0.5` |
| p_ALD, τ | "0 < p_ALD < 0.5"; Fig. 3: "τ = 0.05 is slightly lower than that with τ = 0.1" | p_ALD 0.3, τ 0.1 |
| CAD drop depth / ratio | Fig. 2: peak "at the 21st layer" of 27; "with a greater drop depth, a smaller p_net ... will achieve better results" | depth round(21/27 · L_dec), ratio 0.5 (`cad_defaults`) |
| CAD at p_net = 1.0 | "with probability p_net^l, only self-attention is used ... During the inference stage, both attentions are used" | layers 1..L_dr are built without cross-attention, so they have none at inference either: at p_net = 1 it would never be trained (our reading; `modules/cross_attention_drop.py`) |
| HIERTRANS (MSC Table 6) | "both a sentence-level and a document-level transformer encoders, as well as a standard transformer decoder ... (each of them have L = 18, emb=512, ffn=1024, head=8)", no citation | `--arch hiertrans_cnndm_36l`: sentences end at `. ! ?` and EOS; the sentence-level encoder attends within each sentence, positions counted per sentence; a sentence's vector is its end token's state (as HIBERT, cited in Table 6); the document-level encoder runs over sentence vectors plus sentence positions; the 6-layer decoder (TRANSFORMER's and MSC's) attends to token and sentence states concatenated (our readings; `models/hiertrans.py`) |
| CAD above the drop depth | "we adopted a same fixed p_net for layers 1 ≤ l ≤ L_dr ..., while set p_net^l = 1.0 for layers l > L_dr"; Sec. 4.3: too large a drop depth leaves "insufficient cross-attention" | p^l = 0 above L_dr (our reading, `--cad-reading consistent`, the default), the only one that agrees with Sec. 4.3; the letter (p^l = 1.0 above L_dr, every cross-attention used at inference) is `--cad-reading literal`, run by the `dd-fig2-literal` variant (no p_net = 1.0 line: under the letter no cross-attention would ever be trained) |
| Fig. 1 | "training perplexity ... and BLEU score ... with different decoder depths after 200K training steps" | 6-layer pre-norm encoder, decoder depths 6..27 step 3, without and with CAD + CRT; training PPL = the last logged one |
| Fig. 2 / 3 / 4 grids | only the peak (21), ratio 1.0 and τ 0.05 / 0.1 are named | depths 3..27 step 3 × ratios 0.25-1.0; p_ALD 0.1-0.4 at τ 0.1 and τ 0.05-0.5 at p_ALD 0.3; encoder / decoder depths 1..24 with the other at 15 |
| headline metric | "We used multi-bleu.perl and detokenized sacreBLEU" (no compound splitting mentioned) | `tok_bleu` (multi-bleu.perl on the tokenized output); compound-split BLEU and sacreBLEU beside it |
| marking | — | the deep-decoder tables print each run's CAD/CRT values with `*` on every value the paper does not print and `†` on our readings of its words (loss weights 1, p_net 1) |

Headline metric of the other papers, by the same rule (the metric the paper states; others beside it): MSC
WMT14 En→De "tokenized case-sensitive BLEU ... multi-bleu.perl" (no compound splitting mentioned) → `tok_bleu`;
IWSLT "tokenized case-insensitive BLEU" → `tok_bleu_lc`; Bapna et al. "BLEU on tokenized, true-case output" →
`tok_bleu`.

Plots: `deepnmt-repro plot KEY` (`--list` for the keys) writes `KEY.png` and `KEY.csv` from the runs'
`train.log` (curves) or `results.json` (sweeps) under the checkpoint root.
RNMT+ rows (Bapna Tables 3-4): Chen et al.'s (2018) warm-up / hold / exponential-decay schedule with
n = 8 replicas (fairseq `tri_stage`), Adam (0.9, 0.98) ε 1e-6, dropout 0.3 and 200K updates (the
authors' lingvo En-De configuration; `deepnmt_fairseq/models/rnmt.py` lists the model's choices).

## Tables
"""


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
    out = [DOC_INTRO]
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
