#!/usr/bin/env python
"""The whole GPKD recipe (Li et al. 2021, Fig. 1) in one command, run the way the paper runs it.

    python scripts/gpkd_pipeline.py --work-dir work/gpkd [--data DATA_BIN] \
        --teacher-arch rpr_deep_48_6 --encoder-group-size 8 [--decoder-group-size 1] \
        [--ssl-rate 0.4] [--plain-baseline] [--teacher-args "..."] [--student-args "..."]

Stages (each skipped when its output exists; an interrupted stage resumes):

  0. (--plain-baseline) the same deep model trained without GP: the paper's baseline row
     (Deep-RPR-24L/48L in Tables 1-5), scored next to the others;
  1. teacher, stage 1: fairseq-train with group permutation (--gp-group-size h, and
     --gp-decoder-group-size for the decoder), early-stopped when the validation loss
     has not improved for --patience validations ("we train the model as usual but early
     stop it when the model converges on the validation set", 'Two-stage Training');
  2. teacher, stage 2 (only with --ssl-rate > 0): the skipping sub-layer switched on,
     GP kept, continued from stage 1's *averaged* model (last --average epoch
     checkpoints) with stage 1's Adam state, learning-rate schedule and update count
     (deepnmt-average-checkpoints --keep-training-state, then --continue-once): the
     inverse-sqrt schedule goes on where stage 1 stopped instead of warming up to the
     peak rate again; --restart-schedule asks for the warm-up again (fresh optimizer,
     --finetune-from-model).  --ssl-from-scratch is Table 4's "Scratch" instead: one
     stage with skipping from update 0;
  3. the teacher model: the average of the last --average checkpoints of its last stage;
  4. SKD data: deepnmt-skd (the averaged teacher translates the training set, beam 4,
     lenpen 0.6);
  5. student: deepnmt-extract-student with the h the teacher was GP-trained with (one
     layer per group; the CLI refuses any other h);
  6. student training on the SKD data from the extracted weights (--finetune-from-model:
     a new training run with its own warm-up, "we begin optimizing the student network");
  7. evaluation: fairseq-generate on the test split for (baseline,) teacher and student,
     BLEU written to results.json.

Where the paper is silent (docs/reproduction.md, "GPKD procedure"): the patience (3
validations, one per epoch), the cap of each stage (--teacher-updates for stage 1,
--stage2-updates in all), averaging 5 checkpoints, early stopping on fairseq's
validation loss (label-smoothed), the student schedule.

Without --data the embedded LibreOffice-help corpus is prepared (as in the
quickstart).  ``--tiny`` shrinks everything to a CPU smoke test (about a minute).
For WMT, pass the reproduction scripts' settings through --teacher-args and
--student-args (see docs/reproduction.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# --user-dir of every command: the installed package (found without importing fairseq here)
USER_DIR = list(importlib.util.find_spec("deepnmt_fairseq").submodule_search_locations)[0]

TINY_MODEL = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
              "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


def log(msg):
    print(f"[gpkd {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, **kw):
    """``cmd``: a console script of this environment by name (``fairseq-train``...), then its arguments."""
    # exe: the script beside this interpreter; child_env: the known-harmless warnings of fairseq's children
    from deepnmt_fairseq.console import child_env, exe

    cmd = [exe(str(cmd[0]))] + [str(c) for c in cmd[1:]]
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True, env=child_env(), **kw)


def tool(cmd):
    """One of the package's own console scripts, run in this process (no second interpreter start):
    ``cmd[0]`` = (script name, module in deepnmt_fairseq.cli)."""
    import importlib

    (name, module), args = cmd[0], [str(c) for c in cmd[1:]]
    log("$ " + " ".join(shlex.quote(c) for c in [name, *args]))
    rc = importlib.import_module(f"deepnmt_fairseq.cli.{module}").main(args)
    if rc:
        raise SystemExit(f"{name} failed (exit {rc})")


def train(data, save: Path, arch, flags, max_update, common, extra=()):
    if (save / ".done").exists():
        log(f"{save.name}: trained earlier")
        return
    save.mkdir(parents=True, exist_ok=True)
    try:
        with open(save / "train.log", "a", encoding="utf-8") as logf:
            run(["fairseq-train", data, "--user-dir", USER_DIR, "--arch", arch, *flags,
                 "--max-update", max_update, "--save-dir", save, *common, *extra], stdout=logf,
                stderr=subprocess.STDOUT)
    except subprocess.CalledProcessError as err:
        tail = (save / "train.log").read_text(encoding="utf-8", errors="replace")[-4000:]
        raise SystemExit(f"{save.name}: fairseq-train failed (exit {err.returncode}); end of {save / 'train.log'}:\n"
                         f"{tail}") from None
    (save / ".done").write_text("ok\n")


def averaged(stage_dir: Path, k: int, keep_training_state: bool = False) -> Path:
    """The stage's model: the average of its last k checkpoints, epoch or interval (checkpoint_last.pt for k <= 1).
    ``keep_training_state``: also the newest checkpoint's optimizer state and update count, for
    ``--continue-once`` (``checkpoint_avgK.resume.pt``)."""
    if k <= 1:
        return stage_dir / "checkpoint_last.pt"
    out = stage_dir / (f"checkpoint_avg{k}.resume.pt" if keep_training_state else f"checkpoint_avg{k}.pt")
    if not out.exists():
        tool([("deepnmt-average-checkpoints", "average_checkpoints"), "--inputs", stage_dir, "--num-checkpoints", k,
              "--output", out, *(["--keep-training-state"] if keep_training_state else [])])
    return out


def bleu(data, ckpt: Path, out: Path, gen_args, cpu):
    if not out.exists():
        with open(out.with_suffix(".partial"), "w") as f:
            run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", ckpt,
                 "--gen-subset", "test", "--required-batch-size-multiple", "1", "--remove-bpe",
                 *gen_args, *(["--cpu"] if cpu else [])], stdout=f)
        out.with_suffix(".partial").replace(out)
    import sacrebleu

    from deepnmt_fairseq.generate_output import parse_generate

    parsed = parse_generate(out.read_text(encoding="utf-8"))
    hyps, refs = parsed["hyps"], parsed["refs"]
    ids = sorted(refs)
    if sorted(hyps) != ids:
        raise SystemExit(f"{out}: {len(hyps)} hypotheses for {len(ids)} references")
    score = sacrebleu.corpus_bleu([hyps[i] for i in ids], [[refs[i] for i in ids]], tokenize="none", force=True)
    return round(score.score, 2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default=str(REPO / "work" / "gpkd"))
    p.add_argument("--data", help="binarized data (default: the embedded corpus, prepared here)")
    p.add_argument("--teacher-arch", default="rpr_deep_48_6")
    p.add_argument("--student-arch", default=None, help="default: the teacher's arch with the new depths")
    p.add_argument("--encoder-group-size", type=int, default=8,
                   help="h: the teacher's GP group size and the extraction group size (the paper: 4 for 24, "
                        "8 for 48 layers; 2 for each step of progressive compression)")
    p.add_argument("--decoder-group-size", type=int, default=1, help="h for the decoder (DESDAR students)")
    p.add_argument("--select", default="random", choices=["random", "first", "last"])
    p.add_argument("--ssl-rate", type=float, default=0.0,
                   help="skipping sub-layer phi (paper: 0.4) in the teacher's second stage; 0 = one stage, no skipping")
    p.add_argument("--ssl-from-scratch", action="store_true",
                   help="Table 4 'Scratch': skipping from update 0 in a single stage (the paper finds it worse)")
    p.add_argument("--restart-schedule", action="store_true",
                   help="stage 2 starts a fresh optimizer and warm-up (--finetune-from-model) instead of "
                        "continuing stage 1's schedule")
    p.add_argument("--plain-baseline", action="store_true",
                   help="also train the teacher architecture without GP (the paper's baseline row) and score it")
    p.add_argument("--patience", type=int, default=3,
                   help="early stopping: validations without improvement of the validation loss (stages 1 and 2)")
    p.add_argument("--average", type=int, default=5, help="last K checkpoints averaged for every model used")
    p.add_argument("--teacher-updates", type=int, default=50000, help="cap of teacher stage 1 (and the baseline)")
    p.add_argument("--stage2-updates", type=int, default=50000,
                   help="cap of the teacher's stage 2, updates in all (stage 1's count goes on): Table 3 gives the "
                        "two-stage model the same 50K updates as the plain one, as the registry does")
    p.add_argument("--student-updates", type=int, default=50000)
    p.add_argument("--teacher-args", default="", help="extra fairseq-train flags for the teacher (and baseline)")
    p.add_argument("--student-args", default="", help="extra fairseq-train flags for the student")
    p.add_argument("--train-args", default="--optimizer adam --adam-betas (0.9,0.997) --lr 0.002 "
                   "--lr-scheduler inverse_sqrt --warmup-updates 16000 --warmup-init-lr 1e-07 "
                   "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 "
                   "--update-freq 2 --share-all-embeddings --attention-dropout 0.1 --activation-dropout 0.1",
                   help="flags shared by every training run (the paper: Wang et al. 2019 settings; the registry's "
                        "GPKD recipe)")
    p.add_argument("--gen-args", default="--beam 4 --lenpen 0.6 --batch-size 64")
    p.add_argument("--no-eval", action="store_true", help="train only: no decoding of the test set")
    p.add_argument("--skd-shards", type=int, default=1)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test on the embedded corpus")
    a = p.parse_args(argv)
    if a.ssl_from_scratch and a.ssl_rate <= 0:
        p.error("--ssl-from-scratch needs --ssl-rate > 0")

    work = Path(a.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model_args = []
    t1_updates, t2_updates, student_updates = a.teacher_updates, a.stage2_updates, a.student_updates
    train_args = shlex.split(a.train_args)
    gen_args = shlex.split(a.gen_args)
    if a.tiny:
        a.cpu = True
        model_args = TINY_MODEL
        t1_updates, t2_updates, student_updates = min(t1_updates, 4), min(t2_updates, 8), min(student_updates, 4)
        a.average = min(a.average, 2)
        train_args = [*train_args, "--warmup-updates", "4", "--max-tokens", "2048", "--update-freq", "1",
                      "--save-interval-updates", "2", "--keep-interval-updates", "2"]  # checkpoints to average
        gen_args = ["--beam", "2", "--batch-size", "128", "--max-len-a", "0", "--max-len-b", "8"]
    if a.data:
        data = Path(a.data)
    else:
        import quickstart  # scripts/quickstart.py, next to this script

        data = quickstart.prepare(work, 500 if a.tiny else 4000, 600 if a.tiny else None)
    # epoch checkpoints are kept: the models used downstream are averages of the last --average of them
    common = [*train_args, "--seed", "1", "--keep-last-epochs", str(max(a.average, 1)), "--log-format", "simple",
              "--log-interval", "20", *(["--cpu", "--num-workers", "0"] if a.cpu else [])]
    early_stop = ["--patience", str(a.patience)] if a.patience > 0 else []
    depth = []
    if a.tiny:
        depth = ["--encoder-layers", str(2 * a.encoder_group_size), "--decoder-layers",
                 str(max(1, a.decoder_group_size))]
    base_flags = [*model_args, *shlex.split(a.teacher_args), *depth]
    gp = ["--gp-group-size", str(a.encoder_group_size)] if a.encoder_group_size > 1 else []
    if a.decoder_group_size > 1:
        gp += ["--gp-decoder-group-size", str(a.decoder_group_size)]
    ssl = ["--ssl-rate", str(a.ssl_rate)] if a.ssl_rate > 0 else []
    results = {}

    if a.plain_baseline:  # 0. the paper's baseline row: the deep model without GP, the Deep schedule
        b_dir = work / "baseline"
        train(data, b_dir, a.teacher_arch, base_flags, t1_updates, common)
        results["baseline_model"] = str(averaged(b_dir, a.average))
        if not a.no_eval:
            results["baseline_bleu"] = bleu(data, Path(results["baseline_model"]), work / "generate-baseline.txt",
                                            gen_args, a.cpu)

    # 1. teacher stage 1: GP on, no skipping, early-stopped on the validation set
    # (--ssl-from-scratch: skipping from update 0, Table 4 "Scratch", single stage)
    s1_dir = work / "teacher-stage1"
    s1_flags = [*base_flags, *gp, *(ssl if a.ssl_from_scratch else [])]
    train(data, s1_dir, a.teacher_arch, s1_flags, t1_updates, common, early_stop)
    t_dir = s1_dir
    if ssl and not a.ssl_from_scratch:
        # 2. teacher stage 2: skipping on (and GP), from stage 1's averaged model; the schedule goes on
        t_dir = work / "teacher-stage2"
        if a.restart_schedule:
            init = ["--finetune-from-model", averaged(s1_dir, a.average)]
        else:
            init = ["--continue-once", averaged(s1_dir, a.average, keep_training_state=True)]
        train(data, t_dir, a.teacher_arch, [*base_flags, *gp, *ssl], t2_updates, common, [*early_stop, *init])
    teacher = averaged(t_dir, a.average)  # 3. the teacher model

    # 4. SKD data from the averaged teacher
    skd = work / "skd-bin"
    run(["deepnmt-skd", "--data", data, "--teacher", teacher, "--output", skd, "--shards", a.skd_shards,
         *(["--cpu"] if a.cpu else []),
         *(["--max-len-a", "0", "--max-len-b", "8", "--batch-size", "128"] if a.tiny else [])])

    # 5. one layer per group, with the h the teacher was GP-trained with
    student = work / "student-init.pt"
    if not student.exists():
        extra = ["--decoder-group-size", str(a.decoder_group_size)] if a.decoder_group_size > 1 else []
        tool([("deepnmt-extract-student", "extract_student"), "--teacher", teacher, "--encoder-group-size",
              a.encoder_group_size, *extra, "--select", a.select, "--output", student])
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    s_cfg = load_checkpoint(str(student))["cfg"]["model"]
    # the student is a plain model of the new depth (no GP, no skipping), as the registry's students
    student_flags = [*model_args, "--encoder-layers", str(s_cfg.encoder_layers), "--decoder-layers",
                     str(s_cfg.decoder_layers), *shlex.split(a.student_args)]
    s_dir = work / "student"
    # 6. the student: a new training run on the SKD data from the extracted weights
    train(skd, s_dir, a.student_arch or a.teacher_arch, student_flags, student_updates, common,
          ["--finetune-from-model", student])

    # 7. evaluation
    student_model = averaged(s_dir, a.average)
    if not a.no_eval:
        results["teacher_bleu"] = bleu(data, teacher, work / "generate-teacher.txt", gen_args, a.cpu)
        results["student_bleu"] = bleu(data, student_model, work / "generate-student.txt", gen_args, a.cpu)
    results.update({
        "student_model": str(student_model),
        "student_layers": [s_cfg.encoder_layers, s_cfg.decoder_layers],
        "group_size": [a.encoder_group_size, a.decoder_group_size],
        "teacher_stages": [str(s1_dir)] + ([str(t_dir)] if t_dir != s1_dir else []),
        "teacher_model": str(teacher),
    })
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"results: {results} -> {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
