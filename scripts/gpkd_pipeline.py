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

The procedure is deepnmt_fairseq.distill.plan.gpkd_stages, the project's one GPKD planner
(docs/distill.md); this script parses its options, prepares the data and scores the models.

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
import json
import shlex
import sys
from pathlib import Path

from deepnmt_fairseq.jobs.decode import Search, generate, generate_command
from deepnmt_fairseq.jobs.stage import make_log

REPO = Path(__file__).resolve().parents[1]

TINY_MODEL = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
              "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


log = make_log("gpkd", stdout=True)


def bleu(data, ckpt: Path, out: Path, gen_args, cpu):
    if not out.exists():
        # the search settings are --gen-args (default: the paper's beam 4, lenpen 0.6, batch 64)
        cmd = generate_command(data, ckpt, Search(remove_bpe=True), "test", extra=gen_args, cpu=cpu, resolve=True)
        log("$ " + " ".join(shlex.quote(c) for c in cmd))
        generate(cmd, out, stderr=None)
    from deepnmt_fairseq.generate_output import parse_generate
    from deepnmt_fairseq.scoring import corpus_bleu

    parsed = parse_generate(out.read_text(encoding="utf-8"))
    hyps, refs = parsed["hyps"], parsed["refs"]
    ids = sorted(refs)
    if sorted(hyps) != ids:
        raise SystemExit(f"{out}: {len(hyps)} hypotheses for {len(ids)} references")
    score = corpus_bleu([hyps[i] for i in ids], [refs[i] for i in ids], tokenize="none", force=True)
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
    p.add_argument("--dry-run", action="store_true", help="print the stages and their commands, run nothing")
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
        from deepnmt_fairseq import quickstart

        data = quickstart.prepare(work, 500 if a.tiny else 4000, 600 if a.tiny else None)
    # epoch checkpoints are kept: the models used downstream are averages of the last --average of them
    common = [*train_args, "--seed", "1", "--keep-last-epochs", str(max(a.average, 1)), "--log-format", "simple",
              "--log-interval", "20", *(["--cpu", "--num-workers", "0"] if a.cpu else [])]
    depth = []
    if a.tiny:
        depth = ["--encoder-layers", str(2 * a.encoder_group_size), "--decoder-layers",
                 str(max(1, a.decoder_group_size))]
    base_flags = [*model_args, *shlex.split(a.teacher_args), *depth]
    results = {}
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint
    from deepnmt_fairseq.distill.plan import PlanError, average_stage, averaged_path, gpkd_stages, train_stage
    from deepnmt_fairseq.distill.run import RunError, Runner

    stages = []
    if a.plain_baseline:  # 0. the paper's baseline row: the deep model without GP, the Deep schedule
        b_dir = work / "baseline"
        stages.append(train_stage("baseline", data, b_dir, a.teacher_arch, base_flags, t1_updates, common))
        stages += [s for s in [average_stage("baseline-average", b_dir, a.average)] if s is not None]
    # 1-6: the GPKD procedure, written once in deepnmt_fairseq.distill.plan (docs/distill.md)
    try:
        gpkd, paths = gpkd_stages(
            work, data, a.teacher_arch, base_flags, a.encoder_group_size, a.decoder_group_size, common,
            stage1_updates=t1_updates, stage2_updates=t2_updates, student_updates=student_updates,
            average=a.average, ssl_rate=a.ssl_rate, ssl_from_scratch=a.ssl_from_scratch,
            restart_schedule=a.restart_schedule, patience=a.patience, select=a.select,
            device=["--cpu"] if a.cpu else [],
            skd_args=["--shards", str(a.skd_shards),
                      *(["--max-len-a", "0", "--max-len-b", "8", "--batch-size", "128"] if a.tiny else [])],
            student_args=shlex.split(a.student_args), student_arch=a.student_arch)
    except PlanError as err:
        p.error(str(err))
    if a.dry_run:
        for i, st in enumerate([*stages, *gpkd], 1):
            print(f"{i}. {st.name}{' (done)' if st.is_done() else ''}: {st.command_line()}")
        return 0
    from deepnmt_cli import in_process_commands

    in_process_commands()  # averaging and extraction run in this process
    try:
        Runner("gpkd").run([*stages, *gpkd])
    except RunError as err:
        raise SystemExit(str(err)) from None
    teacher, student_model = paths["teacher"], paths["student"]
    s_cfg = load_checkpoint(str(paths["student_init"]))["cfg"]["model"]
    if a.plain_baseline:
        results["baseline_model"] = str(averaged_path(work / "baseline", a.average))
        if not a.no_eval:
            results["baseline_bleu"] = bleu(data, Path(results["baseline_model"]), work / "generate-baseline.txt",
                                            gen_args, a.cpu)
    # 7. evaluation
    if not a.no_eval:
        results["teacher_bleu"] = bleu(data, teacher, work / "generate-teacher.txt", gen_args, a.cpu)
        results["student_bleu"] = bleu(data, student_model, work / "generate-student.txt", gen_args, a.cpu)
    s1_dir, t_dir = work / "teacher-stage1", Path(teacher).parent
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
