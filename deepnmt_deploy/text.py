"""Raw text <-> the model's subword tokens, as the training data were made.

The project's data preparation records how text became model input:

* ``scripts/prepare_data.py`` writes ``DATA_ROOT/NAME/{bin,bpe,CONFIG.json}``: the Moses
  tokenizer (sacremoses, ``escape=False``; lowercased and with aggressive dash splits as the
  corpus recipe in :mod:`deepnmt_data.corpora` says), then joint subword-nmt BPE
  (``bpe/code``) or sentencepiece (``bpe/spm.model``, applied to the Moses-tokenized text);
* ``scripts/quickstart.py`` writes ``WORK/{data-bin,tok/bpe.codes}``: Moses, then subword-nmt.

:func:`deepnmt_fairseq.deploy.export.discover` finds that recipe from the binarized data
directory a checkpoint was trained on; explicit flags of ``deepnmt-export-ct2`` override it.
The recipe is written into the exported model directory (:data:`deepnmt_deploy.METADATA`, the BPE codes or
sentencepiece model copied beside it), so ``deepnmt-translate`` needs nothing else.

:class:`TextPipeline` applies it: test-time Moses tokenization as ``prepare_data.py`` applies
it to dev/test sets (``’`` -> ``'`` first, as fairseq's recipes do), lowercasing if the
recipe lowercased, BPE/sentencepiece; and back: BPE removal as fairseq's ``--remove-bpe``
(subword-nmt: ``"@@ "``; sentencepiece: ``"▁"`` -> space), then Moses detokenization.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

logger = logging.getLogger("deepnmt_deploy")

SEGMENTERS = ("subword-nmt", "sentencepiece", "none")


@dataclass
class Tokenization:
    """How raw text became the model's input (and how output goes back to text)."""

    source_lang: str = "src"
    target_lang: str = "tgt"
    moses: bool = True
    lowercase: bool = False
    aggressive_dash: bool = False
    segmenter: str = "none"
    #: file name of the BPE codes / sentencepiece model inside the exported model directory
    model_file: Optional[str] = None
    #: where the recipe was read from (for the record)
    found_in: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Tokenization":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def remove_bpe(tokens: List[str], segmenter: str) -> str:
    """fairseq's ``--remove-bpe`` / ``post_process`` for this segmenter."""
    line = " ".join(tokens)
    if segmenter == "subword-nmt":
        return (line + " ").replace("@@ ", "").rstrip()
    if segmenter == "sentencepiece":
        return line.replace(" ", "").replace("\u2581", " ").strip()
    return line


class TextPipeline:
    """Raw sentence -> subword tokens, and subword tokens -> raw sentence."""

    def __init__(self, tok: Tokenization, model_dir: Optional[str] = None):
        self.tok = tok
        self._bpe = self._sp = None
        if tok.segmenter != "none":
            if not tok.model_file or model_dir is None:
                raise ValueError(f"segmenter {tok.segmenter} needs its model file")
            path = Path(model_dir) / tok.model_file
            if tok.segmenter == "subword-nmt":
                from subword_nmt.apply_bpe import BPE

                with open(path, encoding="utf-8") as f:
                    self._bpe = BPE(f)
            elif tok.segmenter == "sentencepiece":
                import sentencepiece as spm

                self._sp = spm.SentencePieceProcessor(model_file=str(path))
            else:
                raise ValueError(f"unknown segmenter {tok.segmenter!r}; choose one of {SEGMENTERS}")
        if tok.moses:
            from sacremoses import MosesDetokenizer, MosesTokenizer

            self._mt = MosesTokenizer(lang=tok.source_lang)
            self._md = MosesDetokenizer(lang=tok.target_lang)

    def encode(self, line: str) -> List[str]:
        text = " ".join(line.split())
        if not text:
            return []
        if self.tok.moses:
            text = text.replace("\u2019", "'")
            text = self._mt.tokenize(text, aggressive_dash_splits=self.tok.aggressive_dash,
                                     escape=False, return_str=True)
        if self.tok.lowercase:
            text = text.lower()
        text = " ".join(text.split())
        if self._bpe is not None:
            return self._bpe.process_line(text).split()
        if self._sp is not None:
            return self._sp.encode(text, out_type=str)
        return text.split()

    def decode(self, tokens: List[str]) -> str:
        text = remove_bpe(tokens, self.tok.segmenter)
        if self.tok.moses and text:
            text = self._md.detokenize(text.split())
        return text
