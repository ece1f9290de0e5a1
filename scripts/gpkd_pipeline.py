#!/usr/bin/env python
"""The whole GPKD recipe (Li et al. 2021, Fig. 1) in one command.

    python scripts/gpkd_pipeline.py --work-dir work/gpkd [--data DATA_BIN] \
        --teacher-arch rpr_deep_48_6 --encoder-group-size 8 [--decoder-group-size 1] \
        [--teacher-args "..."] [--student-args "..."] [--ssl-rate 0.4 --ssl-start-update K]

Stages (each skipped when its output exists; an interrupted stage resumes):
  1. teacher: fairseq-train with group permutation (--gp-group-size h) and, if
     --ssl-rate > 0, the skipping sub-layer switched on after --ssl-start-update
     (two-stage training);
  2. SKD data: deepnmt-skd (teacher translates the training set, beam 4, lenpen 0.6);
  3. student: deepnmt-extract-student (one layer per group);
  4. student training on the SKD data from the extracted weights
     (--finetune-from-model);
  5. evaluation: fairseq-generate on the test split for teacher and student,
     BLEU written to results.json.

Without --data the embedded LibreOffice-help corpus is prepared (as in the
quickstart).  ``--tiny`` shrinks everything to a CPU smoke test (a minute).
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


def exe(name):
    cand = Path(sys.executable).with_name(name)
    return str(cand) if cand.exists() else name


def run(cmd, **kw):
    cmd = [str(c) for c in cmd]
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    from deepnmt_fairseq.console import child_env  # the known-harmless warnings of fairseq's children

    subprocess.run(cmd, check=True, env=child_env(), **kw)


def train(data, save: Path, arch, flags, max_update, common, extra=()):
    if (save / ".done").exists():
        log(f"{save.name}: trained earlier")
        return
    save.mkdir(parents=True, exist_ok=True)
    run([exe("fairseq-train"), data, "--user-dir", USER_DIR, "--arch", arch, *flags,
         "--max-update", max_update, "--save-dir", save, *common, *extra])
    (save / ".done").write_text("ok\n")


def bleu(data, ckpt: Path, out: Path, gen_args, cpu):
    if not out.exists():
        with open(out.with_suffix(".partial"), "w") as f:
            run([exe("fairseq-generate"), data, "--user-dir", USER_DIR, "--path", ckpt,
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
    p.add_argument("--encoder-group-size", type=int, default=8, help="h (the paper: 4 for 24, 8 for 48 layers)")
    p.add_argument("--decoder-group-size", type=int, default=1)
    p.add_argument("--select", default="random", choices=["random", "first", "last"])
    p.add_argument("--ssl-rate", type=float, default=0.0, help="skipping sub-layer phi for the teacher")
    p.add_argument("--ssl-start-update", type=int, default=0)
    p.add_argument("--teacher-updates", type=int, default=50000)
    p.add_argument("--student-updates", type=int, default=50000)
    p.add_argument("--teacher-args", default="", help="extra fairseq-train flags for the teacher")
    p.add_argument("--student-args", default="", help="extra fairseq-train flags for the student")
    p.add_argument("--train-args", default="--optimizer adam --adam-betas (0.9,0.98) --lr 0.002 "
                   "--lr-scheduler inverse_sqrt --warmup-updates 8000 --criterion label_smoothed_cross_entropy "
                   "--label-smoothing 0.1 --max-tokens 4096 --update-freq 2 --share-all-embeddings",
                   help="flags shared by teacher and student (the paper: Wang et al. 2019 settings)")
    p.add_argument("--gen-args", default="--beam 4 --lenpen 0.6 --batch-size 64")
    p.add_argument("--skd-shards", type=int, default=1)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test on the embedded corpus")
    a = p.parse_args(argv)

    work = Path(a.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model_args, teacher_updates, student_updates = [], a.teacher_updates, a.student_updates
    train_args = shlex.split(a.train_args)
    gen_args = shlex.split(a.gen_args)
    if a.tiny:
        a.cpu = True
        model_args = TINY_MODEL
        teacher_updates, student_updates = min(teacher_updates, 6), min(student_updates, 4)
        train_args = [t for t in train_args] + ["--warmup-updates", "4", "--max-tokens", "2048", "--update-freq", "1"]
        gen_args = ["--beam", "2", "--batch-size", "128", "--max-len-a", "0", "--max-len-b", "8"]
    if a.data:
        data = Path(a.data)
    else:
        import quickstart  # scripts/quickstart.py, next to this script

        data = quickstart.prepare(work, 500 if a.tiny else 4000, 600 if a.tiny else None)
    common = [*train_args, "--seed", "1", "--no-epoch-checkpoints", "--log-format", "simple",
              "--log-interval", "20", *(["--cpu", "--num-workers", "0"] if a.cpu else [])]

    teacher_flags = [*model_args, "--gp-group-size", str(a.encoder_group_size)]
    if a.decoder_group_size > 1:
        teacher_flags += ["--gp-decoder-group-size", str(a.decoder_group_size)]
    if a.ssl_rate > 0:
        teacher_flags += ["--ssl-rate", str(a.ssl_rate), "--ssl-start-update", str(a.ssl_start_update)]
    teacher_flags += shlex.split(a.teacher_args)
    if a.tiny:
        teacher_flags += ["--encoder-layers", str(2 * a.encoder_group_size), "--decoder-layers",
                          str(max(1, a.decoder_group_size))]
    t_dir = work / "teacher"
    train(data, t_dir, a.teacher_arch, teacher_flags, teacher_updates, common)
    teacher = t_dir / "checkpoint_last.pt"

    skd = work / "skd-bin"
    run([exe("deepnmt-skd"), "--data", data, "--teacher", teacher, "--output", skd, "--shards", a.skd_shards,
         *(["--cpu"] if a.cpu else []),
         *(["--max-len-a", "0", "--max-len-b", "8", "--batch-size", "128"] if a.tiny else [])])

    student = work / "student-init.pt"
    if not student.exists():
        extra = ["--decoder-group-size", str(a.decoder_group_size)] if a.decoder_group_size > 1 else []
        run([exe("deepnmt-extract-student"), "--teacher", teacher, "--encoder-group-size", a.encoder_group_size,
             *extra, "--select", a.select, "--output", student])
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    s_cfg = load_checkpoint(str(student))["cfg"]["model"]
    student_flags = [*model_args, "--encoder-layers", str(s_cfg.encoder_layers), "--decoder-layers",
                     str(s_cfg.decoder_layers), *shlex.split(a.student_args)]
    s_dir = work / "student"
    train(skd, s_dir, a.student_arch or a.teacher_arch, student_flags, student_updates, common,
          ["--finetune-from-model", student])

    results = {
        "teacher_bleu": bleu(data, teacher, work / "generate-teacher.txt", gen_args, a.cpu),
        "student_bleu": bleu(data, s_dir / "checkpoint_last.pt", work / "generate-student.txt", gen_args, a.cpu),
        "student_layers": [s_cfg.encoder_layers, s_cfg.decoder_layers],
    }
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"results: {results} -> {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
