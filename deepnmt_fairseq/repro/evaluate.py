"""evaluate.sh: average checkpoints, decode the test set, score as the paper does.

Steps (each reuses its output when it is already there and up to date):

1. the model: the average of the last K checkpoints of the experiment's evaluation stage
   (``deepnmt-average-checkpoints``; K and epoch/update checkpoints from the registry),
   or - Bapna et al.'s "mean over a window of checkpoints" - each of the last K on its own;
2. ``fairseq-generate`` on the test split with the paper's beam and length penalty,
   ``--required-batch-size-multiple 1`` (fairseq otherwise drops the last partial batch);
   every sentence id is checked to come back exactly once;
3. scores: tokenized BLEU (as multi-bleu.perl; lowercased too), compound-split BLEU for an
   English->German task, detokenized sacreBLEU with its signature, decoding speed
   (tokens/s from fairseq-generate's log), parameters / training time / best validation
   perplexity from the training log; written to ``<save-dir>/results.json`` (an existing
   results file with other content is kept as ``results.old-N.json``).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from ..analysis.logs import parse_train_log
from ..generate_output import parse_generate
from ..jobs.decode import Search, generate, generate_command
from .. import scoring
from .commands import (
    Paths,
    ReproError,
    average_count,
    checkpoint_pattern,
    exe,
    log,
    set_aside,
    stale_average,
)
from .spec import Experiment


@dataclass
class EvalOptions:
    paths: Paths
    checkpoint_dir: Optional[Path] = None
    checkpoint: Optional[Path] = None
    average: Optional[int] = None
    subset: str = "test"
    beam: Optional[int] = None
    lenpen: Optional[float] = None
    batch_size: Optional[int] = None
    cpu: Optional[bool] = None
    fp16: bool = False
    remove_bpe: Optional[str] = None  # default: from the dataset (segmentation())
    tag: Optional[str] = None
    extra: List[str] = field(default_factory=list)
    dry_run: bool = False
    max_len_b: Optional[List[int]] = None  # summarization: the maximum lengths tried on valid (default: registry)
    allow_unfinished: bool = False  # score a training stage without its .done marker (issue 82)


def raw_reference_files(dataset_dir: Path, dataset: str, subset: str, lang: str) -> List[Path]:
    """The untokenized reference: ``raw/<subset>.<lang>``, or the concatenation of the
    per-part files ``raw/<subset>.<part>.<lang>`` that scripts/prepare_data.py writes, in
    the order of its recipe (:mod:`deepnmt_data.corpora`); [] when there is none."""
    from deepnmt_data.corpora import RECIPES

    raw = dataset_dir / "raw"
    single = raw / f"{subset}.{lang}"
    if single.exists():
        return [single]
    recipe = RECIPES.get(dataset)
    if recipe is None:  # not one of the registry's corpora: nothing to concatenate safely
        return []
    parts = {"train": recipe.train, "valid": recipe.valid, "test": recipe.test}.get(subset, ())
    files = [raw / f"{subset}.{p.name}.{lang}" for p in parts]
    return files if files and all(f.exists() for f in files) else []


def segmentation(dataset_dir: Path) -> str:
    """fairseq-generate --remove-bpe for the dataset: ``sentencepiece`` when prepare_data.py
    used --spm (CONFIG.json), else ``subword_nmt``."""
    cfg = dataset_dir / "CONFIG.json"
    try:
        seg = json.loads(cfg.read_text(encoding="utf-8")).get("segmenter", "")
    except (OSError, ValueError):
        seg = ""
    return "sentencepiece" if str(seg).startswith("sentencepiece") or (dataset_dir / "bpe" / "spm.model").exists() \
        else "subword_nmt"


def _numbered(directory: Path, pattern: str) -> List[Path]:
    rx = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$" if pattern == "update" else r"^checkpoint(\d+)\.pt$")
    found = []
    for p in directory.glob("checkpoint*.pt"):
        m = rx.match(p.name)
        if m:
            found.append((int(m.group(m.lastindex)), p))
    return [p for _, p in sorted(found)]


class Evaluator:
    def __init__(self, exp: Experiment, registry: Dict[str, Experiment], opts: EvalOptions):
        self.exp, self.registry, self.opts = exp, registry, opts
        stage = exp.eval_stage
        self.stage = stage
        self.ckdir = opts.checkpoint_dir or opts.paths.stage_dir(exp, stage.name, exp)
        self.out_dir = opts.paths.save_dir or (opts.checkpoint_dir or opts.paths.exp_dir(exp, exp))
        self.k = average_count(exp, opts.average)
        self.pattern = checkpoint_pattern(stage.recipe)
        self.beam = opts.beam or exp.eval.beam
        self.lenpen = exp.eval.lenpen if opts.lenpen is None else opts.lenpen
        self.batch = opts.batch_size or exp.eval.batch_size
        tag = opts.tag
        if tag is None and (opts.beam or opts.lenpen is not None):
            tag = f"beam{self.beam}-lenpen{self.lenpen:g}"
        if tag is None and opts.subset != "test":
            tag = opts.subset
        self.tag = tag
        self.cpu = opts.cpu if opts.cpu is not None else self._no_gpu()
        self.remove_bpe = opts.remove_bpe or segmentation(opts.paths.dataset_dir(exp))
        self.commands: List[List[str]] = []

    def _no_gpu(self) -> bool:
        """No ``--cpu``: decode on the GPU the job's own torch sees; with none, the CPU only when no GPU
        was asked for (a Slurm allocation with GPUs, DEEPNMT_REQUIRE_GPU, --fp16 make it an error)."""
        from ..jobs import cluster

        if cluster.torch_gpus() > 0:
            return False
        why = cluster.gpus_requested() or ("--fp16" if self.opts.fp16 else "")
        if why and not self.opts.dry_run:
            raise ReproError(f"GPUs were requested ({why}) but the job's own {cluster.describe_torch()} sees none "
                             f"(the node: {cluster.describe_detection()}); not decoding on the CPU instead. Fix the "
                             "environment (a CUDA build of torch), or pass --cpu to decode on the CPU on purpose")
        return True

    def check_finished(self) -> None:
        """The training stage's ``.done`` (issue 82): an evaluation that starts when training did not
        finish (an ``afterok`` job after a requeued or failed run) would score a half-trained model."""
        o = self.opts
        if o.checkpoint or o.allow_unfinished or o.dry_run:
            return
        done = self.ckdir / ".done"
        if not done.exists():
            raise ReproError(f"{done} is missing: training stage {self.stage.name} of {self.exp.name} has not "
                             f"finished (fairseq-train's run writes it when it ends), so its checkpoints are not "
                             f"the final model. Finish it (deepnmt-repro train {self.exp.name}), or pass "
                             "--allow-unfinished to score the checkpoints as they are")

    # ---------------------------------------------------------------- models
    def average_argv(self) -> List[str]:
        which = "--num-update-checkpoints" if self.pattern == "update" else "--num-epoch-checkpoints"
        return [exe("deepnmt-average-checkpoints"), "--inputs", str(self.ckdir), which, str(self.k),
                "--output", str(self.ckdir / f"checkpoint_avg{self.k}.pt")]

    def models(self) -> List[Path]:
        """Checkpoints to decode (averaging first where needed)."""
        o = self.opts
        if o.checkpoint:
            return [o.checkpoint]
        if self.exp.eval.mode == "mean":
            if self.k <= 1:
                return [self.ckdir / "checkpoint_last.pt"]
            if o.dry_run:
                return [self.ckdir / f"<each of the last {self.k} checkpoint_*_*.pt>"]
            found = _numbered(self.ckdir, self.pattern)
            if len(found) < self.k:
                raise ReproError(f"{self.ckdir}: the paper's score is the mean over {self.k} checkpoints but "
                                 f"{len(found)} are there (train longer, or pass --average {max(1, len(found))})")
            return found[-self.k:]
        if self.k <= 1:
            return [self.ckdir / "checkpoint_last.pt"]
        avg = self.ckdir / f"checkpoint_avg{self.k}.pt"
        argv = self.average_argv()
        self.commands.append(argv)
        if o.dry_run:
            return [avg]
        if stale_average(avg, self.ckdir):
            old = set_aside(avg)
            log(f"{avg.name} predates the newest checkpoint; kept the old one as {old.name}")
        if not avg.exists():
            found = _numbered(self.ckdir, self.pattern)
            if len(found) < self.k:
                kind = "checkpoint_E_U.pt" if self.pattern == "update" else "checkpointE.pt"
                raise ReproError(f"{self.ckdir}: asked to average the last {self.k} checkpoints but found "
                                 f"{len(found)} {kind} (is training finished? --average N changes K; "
                                 f"--average 1 takes checkpoint_last.pt)")
            log("$ " + " ".join(argv))
            if subprocess.run(argv).returncode != 0 and not avg.exists():
                raise ReproError("deepnmt-average-checkpoints failed")
        return [avg]

    # ---------------------------------------------------------------- decode
    def generate_argv(self, model: Path) -> List[str]:
        src, tgt = self.exp.lang_pair
        data = self.opts.paths.dataset_bin(self.exp, self.exp)
        search = Search(beam=self.beam, lenpen=f"{self.lenpen:g}", batch_size=self.batch, remove_bpe=self.remove_bpe)
        return generate_command(data, model, search, self.opts.subset,
                                task=["--task", "translation", "--source-lang", src, "--target-lang", tgt],
                                cpu=self.cpu, fp16=self.opts.fp16, extra=self.opts.extra, resolve=True)

    def decode(self, model: Path) -> Path:
        suffix = f"-{self.tag}" if self.tag else ""
        out = self.ckdir / f"generate-{self.opts.subset}-{model.stem}{suffix}.txt"
        argv = self.generate_argv(model)
        self.commands.append(argv)
        if self.opts.dry_run:
            return out
        if not model.exists():
            raise ReproError(f"no model {model}: train first (deepnmt-repro train {self.exp.name}) or pass "
                             f"--checkpoint-dir / --checkpoint")
        if out.exists() and out.stat().st_mtime >= model.stat().st_mtime:
            log(f"reusing {out}")
            return out
        if out.exists():
            old = set_aside(out)
            log(f"{out.name} is older than {model.name}; kept it as {old.name}")
        log("$ " + " ".join(argv))
        t0 = time.time()
        generate(argv, out)  # fairseq's log in the output too; a failure raises (a ReproError) naming it
        log(f"decoded with {model.name} in {time.time() - t0:.0f} s -> {out}")
        return out

    # ---------------------------------------------------------------- score
    def references(self, n_fallback: Dict[int, str]):
        _, tgt = self.exp.lang_pair
        ddir = self.opts.paths.dataset_dir(self.exp)
        tok = ddir / "tok" / f"{self.opts.subset}.{tgt}"
        info = {}
        if tok.exists():
            tok_refs = tok.read_text(encoding="utf-8").splitlines()
            info["reference_tok"] = str(tok)
        else:
            tok_refs, missing = scoring.ordered(n_fallback)
            info["reference_tok"] = "fairseq-generate T- lines (BPE removed; rare words may be <unk>)"
            log(f"warning: {tok} not found; scoring against fairseq's T- lines")
        raw_files = raw_reference_files(ddir, self.exp.dataset, self.opts.subset, tgt)
        raw_refs = None
        if raw_files:
            raw_refs = [ln for f in raw_files for ln in f.read_text(encoding="utf-8").splitlines()]
        info["reference_raw"] = " + ".join(map(str, raw_files)) if raw_files else None
        return tok_refs, raw_refs, info

    def score(self, gen: Path) -> Dict[str, object]:
        ev = self.exp.eval
        _, tgt = self.exp.lang_pair
        parsed = parse_generate(gen.read_text(encoding="utf-8", errors="replace"))
        hyps_by_id: Dict[int, str] = parsed["hyps"]  # type: ignore[assignment]
        tok_refs, raw_refs, info = self.references(parsed["refs"])  # type: ignore[arg-type]
        n = len(tok_refs)
        hyps, missing = scoring.ordered(hyps_by_id, n)
        extra = sorted(set(hyps_by_id) - set(range(n)))
        if missing or extra:
            raise ReproError(f"{gen}: {len(hyps_by_id)} hypotheses for {n} references (missing ids "
                             f"{missing[:10]}, unexpected {extra[:10]}); was --required-batch-size-multiple 1 "
                             "dropped, or do the references belong to another split?")
        res: Dict[str, object] = {"sentences": n, **info}
        cs = scoring.tokenized_bleu(hyps, tok_refs, lowercase=False)
        lc = scoring.tokenized_bleu(hyps, tok_refs, lowercase=True)
        res["tok_bleu"] = round(cs.score, 2)
        res["tok_bleu_lc"] = round(lc.score, 2)
        res["tok_bleu_detail"] = str(lc if ev.lowercase else cs)
        if tgt == "de":
            split = scoring.tokenized_bleu([scoring.compound_split(h) for h in hyps],
                                           [scoring.compound_split(r) for r in tok_refs], lowercase=ev.lowercase)
            res["tok_bleu_compound_split"] = round(split.score, 2)
        if raw_refs is not None:
            if len(raw_refs) != n:
                raise ReproError(f"{info['reference_raw']} has {len(raw_refs)} lines, the tokenized reference {n}")
            sb, sig, detok = scoring.detok_sacrebleu(hyps, raw_refs, tgt, lowercase=ev.lowercase)
            res["sacrebleu"] = round(sb.score, 2)
            res["sacrebleu_signature"] = sig
            hyp_file = gen.with_suffix(".detok." + tgt)
            hyp_file.write_text("\n".join(detok) + "\n", encoding="utf-8")
            res["detokenized_hypotheses"] = str(hyp_file)
        else:
            res["sacrebleu"] = None
            res["sacrebleu_note"] = "no raw reference (<data>/<name>/raw/<subset>.<tgt>)"
        for key in ("tokens_per_s", "sentences_per_s", "decode_seconds", "fairseq_bleu"):
            if key in parsed:
                res[key] = parsed[key]
        res["generate_output"] = str(gen)
        return res

    def train_stats(self) -> Dict[str, object]:
        out: Dict[str, object] = {}
        seconds = 0.0
        for stage in self.exp.train_stages:
            logfile = self.opts.paths.stage_dir(self.exp, stage.name, self.exp) / "train.log"
            if stage.name == self.stage.name and self.opts.checkpoint_dir:
                logfile = self.ckdir / "train.log"
            if not logfile.exists():
                continue
            stats = parse_train_log(logfile.read_text(encoding="utf-8", errors="replace"))
            seconds += stats["train_seconds"] or 0.0
            if stage.name == self.stage.name:
                out["params"] = stats["params"]
                out["params_m"] = stats["params_m"]
                out["valid_ppl"] = stats["valid_ppl"]
        if seconds:
            out["train_hours"] = round(seconds / 3600, 2)
        return out

    # ---------------------------------------------------------------- run
    def run(self) -> Dict[str, object]:
        ev = self.exp.eval
        self.check_finished()
        models = self.models()
        gens = [self.decode(m) for m in models]
        single_gen = None
        if ev.also_single and not self.opts.checkpoint:
            single_gen = self.decode(self.ckdir / "checkpoint_last.pt")
        if self.opts.dry_run:
            for argv in self.commands:
                print(" ".join(argv))
            return {}
        per = [self.score(g) for g in gens]
        res: Dict[str, object] = {
            "experiment": self.exp.name, "title": self.exp.title, "paper": self.exp.paper,
            "dataset": self.exp.dataset, "subset": self.opts.subset, "stage": self.stage.name,
            "checkpoint_dir": str(self.ckdir), "models": [str(m) for m in models],
            "averaged_checkpoints": self.k if ev.mode == "average" and not self.opts.checkpoint else 1,
            "mode": ev.mode if not self.opts.checkpoint else "single",
            "generation": {"beam": self.beam, "lenpen": self.lenpen, "batch_size": self.batch,
                           "remove_bpe": self.remove_bpe, "extra": self.opts.extra},
            "primary_metric": ev.primary,
            "bleu_definition": "tokenized BLEU = sacrebleu(tokenize='none', smooth_method='none'), equal to "
                               "multi-bleu.perl; *_lc lowercased; compound split = ##AT##-##AT##",
        }
        if len(per) == 1:
            res.update(per[0])
        else:  # mean over checkpoints (Bapna et al. 2018)
            res["per_checkpoint"] = per
            for key in ("tok_bleu", "tok_bleu_lc", "tok_bleu_compound_split", "sacrebleu", "tokens_per_s"):
                vals = [p.get(key) for p in per if isinstance(p.get(key), (int, float))]
                if vals:
                    res[key] = round(sum(vals) / len(vals), 2)
            res["sacrebleu_signature"] = per[-1].get("sacrebleu_signature")
            res["sentences"] = per[-1]["sentences"]
        res["bleu"] = res.get(ev.primary)
        if single_gen is not None:
            single = self.score(single_gen)
            res["single"] = single
            res["single_bleu"] = single.get(ev.primary)
        res.update(self.train_stats())
        res["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
        self.write(res)
        return res

    def write(self, res: Dict[str, object]) -> Path:
        name = f"results-{self.tag}.json" if self.tag else "results.json"
        path = self.out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                old = None
            same = old is not None and {k: v for k, v in old.items() if k != "time"} == \
                {k: v for k, v in res.items() if k != "time"}
            if not same:
                kept = set_aside(path)
                log(f"previous {path.name} kept as {kept.name}")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)
        primary = res.get("bleu")
        log(f"{self.exp.name}: {self.exp.eval.primary} = {primary}, sacreBLEU = {res.get('sacrebleu')} "
            f"({res.get('sacrebleu_signature')}), {res.get('tokens_per_s')} tokens/s -> {path}")
        return path
