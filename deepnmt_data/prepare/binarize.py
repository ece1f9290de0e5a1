"""The last step: ``fairseq-preprocess --joined-dictionary`` on the subword text, then a check
that every binarized split holds as many sentences as its text.

fairseq (and with it torch) is imported only when this step runs, so the rest of the package,
and its worker processes, never load them."""

from __future__ import annotations

from pathlib import Path

from ..preprocess import preprocess_argv
from .common import SPLITS, DataPrepError, Log


def binarize(bpe: Path, out: Path, s: str, t: str, workers: int, want: dict, log: Log) -> dict:
    """Binarize ``bpe/{train,valid,test}.{s,t}`` into ``out``; ``want``: split -> sentence count."""
    argv = preprocess_argv(s, t, out, trainpref=bpe / "train", validpref=bpe / "valid", testpref=bpe / "test",
                           joined=True, workers=workers)
    log("bin: fairseq-preprocess " + " ".join(argv))
    from fairseq import options
    from fairseq.data import Dictionary, data_utils
    from fairseq_cli import preprocess as fp
    args = options.get_preprocessing_parser().parse_args(argv)
    before = list(fp.logger.handlers)
    try:
        fp.main(args)
    finally:
        for h in list(fp.logger.handlers):
            if h not in before:
                fp.logger.removeHandler(h)
                h.close()
    d = Dictionary.load(str(out / f"dict.{s}.txt"))
    stats = {"dictionary": len(d)}
    for split in SPLITS:
        for lang in (s, t):
            ds = data_utils.load_indexed_dataset(str(out / f"{split}.{s}-{t}.{lang}"), d)
            if ds is None or len(ds) != want[split]:
                raise DataPrepError(f"fairseq-preprocess wrote {0 if ds is None else len(ds)} {split}.{lang} "
                                    f"sentences, expected {want[split]}")
        stats[split] = want[split]
    return stats
