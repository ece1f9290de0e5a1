"""Learning the joint subword model on the tokenized training text: subword-nmt BPE codes or a
sentencepiece model (applied to every split by :mod:`.workers`)."""

from __future__ import annotations

import collections
import os
from pathlib import Path

from .common import DataPrepError, Log, Progress


def learn_bpe(tok: Path, langs, merges: int, out: Path, log: Log) -> Path:
    """``out/code``: ``merges`` joint subword-nmt merges learned on ``tok/train.<lang>`` of both languages."""
    from subword_nmt.learn_bpe import learn_bpe as _learn
    vocab = collections.Counter()
    prog = Progress(log, "bpe: counting words of train src+tgt")
    for lang in langs:
        with open(tok / f"train.{lang}", encoding="utf-8", newline="\n") as f:
            for line in f:
                vocab.update(line.split())
                prog.add()
    prog.done(f", {len(vocab):,} word types")
    if not vocab:
        raise DataPrepError("the training data are empty after tokenization and cleaning")
    log(f"bpe: learning {merges} joint merges (subword-nmt)")
    tmp = out / "code.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        _learn((f"{w} {c}" for w, c in vocab.most_common()), f, merges, min_frequency=2, is_dict=True)
    os.replace(tmp, out / "code")
    return out / "code"


def learn_spm(tok: Path, langs, vocab_size: int, model_type: str, input_sentences: int, threads: int,
              out: Path, log: Log) -> Path:
    """``out/spm.model``: a joint sentencepiece model trained on ``tok/train.<lang>`` of both languages."""
    import sentencepiece as spm
    log(f"bpe: training a joint sentencepiece {model_type} model, vocabulary {vocab_size}")
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(1)
    try:
        spm.SentencePieceTrainer.train(
            input=[str(tok / f"train.{lang}") for lang in langs],
            model_prefix=str(out / "spm"), vocab_size=vocab_size, model_type=model_type,
            character_coverage=1.0, input_sentence_size=input_sentences, shuffle_input_sentence=True,
            hard_vocab_limit=False, num_threads=threads, minloglevel=1)
    except (RuntimeError, OSError) as e:
        raise DataPrepError(f"sentencepiece training failed: {e}") from None
    return out / "spm.model"
