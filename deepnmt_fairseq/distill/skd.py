"""Sequence-level knowledge distillation data (Kim & Rush 2016; GPKD stage 2).

The library behind ``deepnmt-skd`` (its arguments: :mod:`deepnmt_cli.skd`).  The teacher
translates the whole training split with ``fairseq-generate`` (beam 4, length penalty 0.6 as in the paper) in shards
(fairseq-generate's ``--distributed-world-size/--distributed-rank``
batch sharding, without starting any distributed process), ``--jobs`` of them at a time (one
fairseq-generate each: on CPU with the cores split between them unless ``OMP_NUM_THREADS`` is set;
on several GPUs one GPU each); each finished shard is kept, so an interrupted run resumes with the
unfinished shards.  The SKD corpus is the training
sources with the teacher's outputs, in the original order, binarized with the
teacher's dictionaries; valid and test keep their references (copied as they
are).  Nothing is dropped: ``--required-batch-size-multiple 1``, no size
filtering, and the script checks that every sentence id came back exactly once.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from queue import Queue
from typing import Dict, List, Optional, Tuple

from deepnmt_data.preprocess import fairseq_preprocess, preprocess_argv

from .. import generate_output
from ..console import child_env
from ..jobs.decode import GenerateError, Search, complete_or_nothing, generate, generate_command
from ..jobs.stage import make_log


log = make_log("skd")  # the project's one log line, on stderr


def language_pair(data: str) -> Tuple[str, str]:
    """(src, tgt) from the binarized training files ``train.S-T.S.idx``."""
    idx = sorted(glob.glob(os.path.join(data, "train.*-*.*.idx")))
    if not idx:
        raise ValueError(f"no binarized training split (train.SRC-TGT.*.idx) in {data}")
    pair = os.path.basename(idx[0]).split(".")[1]
    src, tgt = pair.split("-")
    return src, tgt


def dataset_size(data: str, src: str, tgt: str) -> int:
    from fairseq.data import data_utils

    ds = data_utils.load_indexed_dataset(os.path.join(data, f"train.{src}-{tgt}.{src}"), None)
    if ds is None:
        raise ValueError(f"cannot read the training split of {data}")
    return len(ds)


def job_envs(jobs: int, cpu: bool, env: Optional[Dict[str, str]] = None) -> List[Dict[str, str]]:
    """The environment of each of ``jobs`` concurrent fairseq-generate processes.  On CPU the
    cores are split between them (``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` = cores // jobs, at
    least 1) unless the caller set ``OMP_NUM_THREADS`` (the study sets its ``--threads``); on GPU,
    with several visible devices (``CUDA_VISIBLE_DEVICES``, else every device torch sees), one
    device each, round robin; with one GPU they share it."""
    base = child_env(env)
    out = [dict(base) for _ in range(jobs)]
    if jobs == 1:
        return out
    if cpu:
        if "OMP_NUM_THREADS" not in base:
            threads = str(max(1, (os.cpu_count() or 1) // jobs))
            for e in out:
                e["OMP_NUM_THREADS"] = e["MKL_NUM_THREADS"] = threads
        return out
    visible = base.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        import torch

        devices = [str(i) for i in range(torch.cuda.device_count())]
    if len(devices) > 1:
        for k, e in enumerate(out):
            e["CUDA_VISIBLE_DEVICES"] = devices[k % len(devices)]
    return out


def translate_shard(a, shard: int, out_path: str, env: Optional[Dict[str, str]] = None) -> None:
    """The teacher's translations of shard ``shard`` of ``a.shards`` of the training split into
    ``out_path`` (there only when complete: :func:`deepnmt_fairseq.jobs.decode.generate`)."""
    batch = {"max_tokens": a.max_tokens} if a.max_tokens else {"batch_size": a.batch_size}
    search = Search(beam=a.beam, lenpen=a.lenpen, max_len_a=a.max_len_a, max_len_b=a.max_len_b, nbest=1, **batch)
    # fairseq-generate shards its batches by the (otherwise unused) distributed rank
    cmd = generate_command(a.data, a.teacher, search, "train", shard=(shard, a.shards), cpu=a.cpu, fp16=a.fp16,
                           resolve=True)
    try:
        generate(cmd, out_path, stderr=None, env=env or child_env())
    except GenerateError as e:
        raise RuntimeError(f"fairseq-generate failed on shard {shard} (exit {e.returncode}); "
                           f"re-run to resume from this shard") from None


def run(a) -> int:
    """``deepnmt-skd`` (arguments: :mod:`deepnmt_cli.skd`): translate the training split in shards,
    check every sentence came back once, binarize the SKD corpus with the teacher's dictionaries."""
    jobs = min(a.jobs, a.shards)
    if os.path.exists(os.path.join(a.output, ".done")):
        log(f"{a.output} is complete; nothing to do (remove it to rebuild)")
        return 0
    if os.path.isdir(a.output) and os.listdir(a.output):
        print(f"error: {a.output} exists and is not a finished SKD dataset; remove it or choose another --output",
              file=sys.stderr)
        return 1
    try:
        src, tgt = language_pair(a.data)
        n = dataset_size(a.data, src, tgt)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    work = a.work_dir or a.output.rstrip("/") + ".work"
    os.makedirs(work, exist_ok=True)
    log(f"teacher {a.teacher} translates {n} training sentences ({src}->{tgt}) in {a.shards} shard(s)"
        + (f", {jobs} at a time" if jobs > 1 else ""))
    start = time.time()
    outs = [os.path.join(work, f"shard{shard:04d}-of-{a.shards:04d}.txt") for shard in range(a.shards)]
    todo = [shard for shard in range(a.shards) if not os.path.exists(outs[shard])]
    for shard in sorted(set(range(a.shards)) - set(todo)):
        log(f"shard {shard + 1}/{a.shards}: done earlier, reusing {outs[shard]}")
    free: "Queue[Dict[str, str]]" = Queue()
    for env in job_envs(jobs, a.cpu):
        free.put(env)
    done_now: List[int] = []
    lock = threading.Lock()

    def translate(shard: int) -> None:
        env = free.get()  # one job slot (its threads or GPU) per running shard
        try:
            t0 = time.time()
            translate_shard(a, shard, outs[shard], env)
            with lock:
                done_now.append(shard)
                left = len(todo) - len(done_now)
                eta = (time.time() - start) / len(done_now) * left
                log(f"shard {shard + 1}/{a.shards}: translated in {time.time() - t0:.0f} s "
                    f"({a.shards - left}/{a.shards} shards done, ~{eta:.0f} s left)")
        finally:
            free.put(env)

    with ThreadPoolExecutor(jobs) as pool:  # every shard runs even if one fails; the finished are kept
        errors = [f.exception() for f in [pool.submit(translate, shard) for shard in todo]]
    failed = [str(e) for e in errors if e is not None]
    if failed:
        print("error: " + "; ".join(failed), file=sys.stderr)
        return 1
    srcs: Dict[int, str] = {}
    hyps: Dict[int, str] = {}
    for shard, out in enumerate(outs):
        with open(out, encoding="utf-8") as f:
            parsed = generate_output.parse_generate(f.read())
        s, h = parsed["srcs"], parsed["hyps"]
        dup = set(h) & set(hyps)
        if dup:
            print(f"error: sentence ids {sorted(dup)[:5]} appear in more than one shard", file=sys.stderr)
            return 1
        srcs.update(s)
        hyps.update(h)
    log(f"progress: {len(hyps)}/{n} sentences translated")
    missing = sorted(set(range(n)) - set(hyps))
    if missing or set(srcs) != set(hyps):
        print(f"error: {len(missing)} of {n} sentences were not translated (first ids: {missing[:10]})",
              file=sys.stderr)
        return 1

    text = os.path.join(work, "text")
    os.makedirs(text, exist_ok=True)
    for lang, table in ((src, srcs), (tgt, hyps)):
        with open(os.path.join(text, f"train.{lang}"), "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(table[i] + "\n")
    try:  # a.output: there only when complete (it is empty or absent: checked above)
        with complete_or_nothing(a.output) as tmp_out:
            try:
                fairseq_preprocess(preprocess_argv(src, tgt, tmp_out, trainpref=os.path.join(text, "train"),
                                                   srcdict=os.path.join(a.data, f"dict.{src}.txt"),
                                                   tgtdict=os.path.join(a.data, f"dict.{tgt}.txt"),
                                                   workers=a.workers), env=child_env(), log=log)
            except subprocess.CalledProcessError:
                raise RuntimeError("fairseq-preprocess failed") from None
            for split in ("valid", "test"):
                for path in glob.glob(os.path.join(a.data, f"{split}*.{src}-{tgt}.*")):
                    shutil.copy2(path, tmp_out)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    with open(os.path.join(a.output, ".done"), "w") as f:
        f.write(f"teacher={os.path.abspath(a.teacher)} beam={a.beam} lenpen={a.lenpen} sentences={n}\n")
    log(f"SKD data in {a.output} ({n} sentences, {time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
