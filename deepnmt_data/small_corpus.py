"""A small parallel corpus of ``{train,valid,test}.{src,tgt}.gz`` files, prepared for fairseq: the
one data preparation of the quickstart (``deepnmt_fairseq/quickstart.py``), the evidence study
(``study/run.py``) and ``scripts/gpkd_pipeline.py``.

    WORK/tok/{split}.raw.L   the text as shipped (``train_pairs``: the first N training pairs)
    WORK/tok/{split}.tok.L   Moses-tokenized (sacremoses, no escaping)
    WORK/tok/bpe.codes       a joint BPE learned on both sides of the training split (subword-nmt)
    WORK/tok/{split}.bpe.L   the BPE text
    WORK/data-bin/           ``fairseq-preprocess --joined-dictionary`` (``.done`` when complete)

Done once: a ``data-bin`` with its ``.done`` is reused; an unfinished attempt is redone from the
start.  Nothing here imports torch or fairseq (``fairseq-preprocess`` runs as a process).
"""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path
from typing import Callable, List, Optional

from .preprocess import fairseq_preprocess, preprocess_argv  # noqa: F401 - fairseq_preprocess: the default binarize

#: the LibreOffice help corpus (en->de) that a checkout of the repository ships
EMBEDDED = Path(__file__).resolve().parents[1] / "data" / "libreoffice-help" / "en-de"
SPLITS = ("train", "valid", "test")


def done(path: Path) -> bool:
    return (path / ".done").exists()


def mark(path: Path) -> None:
    (path / ".done").write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))


def fresh_dir(path: Path) -> Path:
    """An empty directory for a step whose previous attempt did not finish."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def prepare(work: Path, bpe_merges: int, data: Path = EMBEDDED, train_pairs: Optional[int] = None,
            src: str = "en", tgt: str = "de", log: Callable[[str], None] = print,
            binarize: Optional[Callable[[List[str]], None]] = None) -> Path:
    """Tokenize, BPE and binarize the corpus directory ``data`` into ``work/data-bin`` (once); the
    binarized directory.  ``train_pairs`` keeps only the first N training pairs (smoke tests);
    ``binarize(argv)`` runs ``fairseq-preprocess argv`` (default :func:`fairseq_preprocess`)."""
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    work, data = Path(work), Path(data)
    bin_dir = work / "data-bin"
    if done(bin_dir):
        log(f"data ready: {bin_dir}")
        return bin_dir
    tok = fresh_dir(work / "tok")
    for split in SPLITS:
        for lang in (src, tgt):
            gz = data / f"{split}.{lang}.gz"
            if not gz.exists():
                raise SystemExit(f"missing data file {gz}" + (" (the embedded corpus ships with a checkout of the "
                                                                "repository; or pass another corpus directory)"
                                                                if data == EMBEDDED else ""))
            mt = MosesTokenizer(lang=lang)
            with gzip.open(gz, "rt", encoding="utf-8") as f:
                lines = [ln.rstrip("\n") for ln in f]
            if split == "train" and train_pairs:
                lines = lines[:train_pairs]
            (tok / f"{split}.raw.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
            toks = [mt.tokenize(ln, escape=False, return_str=True) for ln in lines]
            (tok / f"{split}.tok.{lang}").write_text("\n".join(toks) + "\n", encoding="utf-8")
            log(f"tokenized {split}.{lang}: {len(lines)} lines")
    codes = tok / "bpe.codes"
    joint = [ln for lang in (src, tgt) for ln in (tok / f"train.tok.{lang}").read_text(encoding="utf-8").splitlines()]
    with open(codes, "w", encoding="utf-8") as out:
        learn_bpe(joint, out, bpe_merges, min_frequency=2)
    log(f"learned {bpe_merges} joint BPE merges")
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)
    for split in SPLITS:
        for lang in (src, tgt):
            lines = (tok / f"{split}.tok.{lang}").read_text(encoding="utf-8").splitlines()
            (tok / f"{split}.bpe.{lang}").write_text(
                "\n".join(bpe.process_line(ln) for ln in lines) + "\n", encoding="utf-8"
            )
    fresh_dir(bin_dir)
    argv = preprocess_argv(src, tgt, bin_dir, trainpref=tok / "train.bpe", validpref=tok / "valid.bpe",
                           testpref=tok / "test.bpe", joined=True, workers=2)
    (binarize or (lambda a: fairseq_preprocess(a, log=log)))(argv)
    mark(bin_dir)
    return bin_dir
