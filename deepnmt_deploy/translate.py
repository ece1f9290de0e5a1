"""Translate raw text with an exported model (``deepnmt-translate``).

    deepnmt-translate --model OUT_DIR < raw.src > raw.hyp
    deepnmt-translate --model OUT_DIR --input raw.src --output raw.hyp [--beam 5] [--lenpen 1]
                      [--batch-size 32] [--intra-threads 1] [--inter-threads 1] [--device cpu]

Each input line goes through the model's own tokenization and BPE (recorded at export,
:mod:`.text`), CTranslate2 beam search, BPE removal and detokenization.  Line handling:

* one output line for every input line, in input order; nothing is dropped or reordered;
  lines are split at ``\n`` only (``\r\n`` is a line end too; a CR, form feed, NEL or U+2028
  inside a line is whitespace, as in fairseq's tokenizer);
* input is read as bytes and decoded as UTF-8 line by line: invalid bytes become U+FFFD (an
  unknown word, ``<unk>``) with a warning naming the line, and the other lines are translated
  as usual;
* a line the pipeline or CTranslate2 fails on gives an empty output line and a warning naming
  it, never a stopped run;
* an empty (or all-whitespace) line gives an empty line without running the model;
* characters and words not in the vocabulary become ``<unk>`` as in fairseq-interactive;
* a line longer than the model's limit (``max_source_positions`` subword tokens, ``</s>``
  included) is truncated to it with a warning naming the line (fairseq-interactive stops at
  such a line and loses the rest of the input).

Search settings mirror fairseq-generate's: ``--beam``, ``--lenpen`` (score / length^lenpen,
fairseq's normalization), ``--max-len`` (fairseq's ``--max-len-b`` with ``--max-len-a 0``,
capped at the target positions), at least one token before ``</s>`` (fairseq's
``--min-len 1``).

Threads: CTranslate2's ``intra_threads`` (OpenMP threads per batch) default to 1: on the
2-vCPU machines this project was measured on, 2 intra threads were 6.7x *slower* one
sentence at a time (docs/deployment.md); use ``--inter-threads`` (batches in parallel)
for throughput.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, List, Optional, TextIO, Union

from . import METADATA, require_ctranslate2
from .help_format import HelpFormatter
from .text import TextPipeline, Tokenization
from .vmap import VMAP_FILE, has_vmap as export_has_vmap

logger = logging.getLogger("deepnmt_deploy")


def read_metadata(model_dir: str) -> dict:
    path = Path(model_dir) / METADATA
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: {model_dir} is not a directory written by deepnmt-export-ct2")
    return json.loads(path.read_text())


_NOT_ESCAPED_BYTE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def to_text(line: Union[str, bytes], line_no: Optional[int] = None) -> str:
    """One raw input line as valid Unicode text: bytes decoded as UTF-8, and text that holds
    undecodable bytes (Python's ``surrogateescape``, as ``sys.stdin`` under the C locale gives
    them) or lone surrogates re-decoded, invalid bytes as U+FFFD, with a warning naming the line.
    CTranslate2 and the tokenizers get nothing else (a surrogate made CTranslate2 raise a
    TypeError for the whole batch)."""
    if isinstance(line, str):
        try:
            line.encode("utf-8")
            return line
        except UnicodeEncodeError:
            # escaped bytes (U+DC80..U+DCFF) back to bytes, any other lone surrogate made invalid
            line = _NOT_ESCAPED_BYTE.sub("\udcff", line).encode("utf-8", "surrogateescape")
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"line {line_no}" if line_no is not None else "a line"
        logger.warning("%s: invalid UTF-8 (byte %r at offset %d); translated with U+FFFD in place of the "
                       "invalid bytes", where, line[e.start:e.start + 1], e.start)
        return line.decode("utf-8", "replace")


class DeployedModel:
    """An exported model: text pipeline + CTranslate2 translator."""

    use_vmap: bool = False  # the vocabulary shortlist (set in __init__ from the export)

    def __init__(self, model_dir: str, device: str = "cpu", compute_type: str = "default",
                 intra_threads: int = 1, inter_threads: int = 1, use_vmap: Optional[bool] = None):
        ct2 = require_ctranslate2()
        self.model_dir = str(model_dir)
        self.meta = read_metadata(model_dir)
        # the vocabulary shortlist (deepnmt_deploy/vmap.py): on when the export has one, unless told off
        has_vmap = export_has_vmap(model_dir)
        if use_vmap and not has_vmap:
            raise ValueError(f"{model_dir} has no vocabulary shortlist ({VMAP_FILE}): export it with "
                             f"deepnmt-export-ct2 --vmap")
        self.use_vmap = has_vmap if use_vmap is None else bool(use_vmap)
        self.pipeline = TextPipeline(Tokenization.from_dict(self.meta["tokenization"]), self.model_dir)
        # CTranslate2 appends </s> (add_source_eos): the tokens themselves get one position less
        self.max_source_tokens = int(self.meta["max_source_positions"]) - 1
        self.max_target_positions = int(self.meta["max_target_positions"])
        self.translator = ct2.Translator(self.model_dir, device=device, compute_type=compute_type,
                                         intra_threads=intra_threads, inter_threads=inter_threads)

    def search_options(self, beam: int = 5, lenpen: float = 1.0, max_len: int = 200, batch_size: int = 32,
                       batch_type: str = "examples", max_len_a: float = 0.0, src_len: int = 0) -> dict:
        """CTranslate2 options that reproduce fairseq-generate's search for a batch whose longest
        source has ``src_len`` tokens with its ``</s>`` (``max_len`` is fairseq's ``--max-len-b``,
        ``max_len_a`` its ``--max-len-a``)."""
        # fairseq: max_len = min(max_len_b, max_decoder_positions - 1) tokens, then </s> is forced
        # (and scored); CTranslate2 stops after max_decoding_length tokens without </s> (measured),
        # so a hypothesis cut at the limit can rank differently; below the limit the searches agree.
        # min_decoding_length 1 = fairseq's --min-len 1: no empty hypothesis.
        limit = min(int(max_len_a * src_len + max_len), self.max_target_positions - 1)
        return dict(beam_size=beam, length_penalty=lenpen, max_decoding_length=limit,
                    min_decoding_length=1, max_batch_size=batch_size, batch_type=batch_type,
                    max_input_length=0, return_scores=False, use_vmap=self.use_vmap)

    def translate_tokens(self, sources: List[List[str]], first_line: Optional[int] = None,
                         **search) -> List[List[str]]:
        """Subword sources -> subword hypotheses (an empty source gives an empty hypothesis;
        so does a source CTranslate2 fails on, with a warning naming it as line ``first_line + i``).

        With ``max_len_a`` > 0 the length limit is fairseq's, per batch: ``int(a * src_len + b)``
        where src_len is the longest source of the batch with its ``</s>`` (SequenceGenerator's
        padded ``src_tokens.size(1)``).  The sentences are then sorted by length and cut into
        batches of ``batch_size`` here, as fairseq-generate batches a length-sorted test set, so
        that a short sentence is not given a long neighbour's limit."""
        opts = self.search_options(**search)
        todo = [i for i, s in enumerate(sources) if s]
        out: List[List[str]] = [[] for _ in sources]
        if not todo:
            return out
        if not search.get("max_len_a"):
            batches = [(todo, opts)]
        else:
            todo.sort(key=lambda i: len(sources[i]))
            size = opts["max_batch_size"]
            batches = [(ids, self.search_options(**search, src_len=max(len(sources[i]) for i in ids) + 1))
                       for ids in (todo[k:k + size] for k in range(0, len(todo), size))]
        # every batch is submitted before any result is awaited, so that CTranslate2's inter_threads
        # translators work on several batches at once (each with its own length limit)
        submitted = []
        for ids, batch_opts in batches:
            try:
                pending = self.translator.translate_batch([sources[i] for i in ids], asynchronous=True, **batch_opts)
            except Exception:  # noqa: BLE001 - retried one sentence at a time below
                pending = None
            submitted.append((ids, batch_opts, pending))
        for ids, batch_opts, pending in submitted:
            try:
                if pending is None:
                    raise RuntimeError("the batch was not accepted")
                results = [r.result() for r in pending]
            except Exception:  # noqa: BLE001 - find the line, translate the others
                results = []
                for i in ids:
                    try:
                        results.append(self.translator.translate_batch([sources[i]], **batch_opts)[0])
                    except Exception as e:  # noqa: BLE001
                        where = f"line {first_line + i}" if first_line is not None else f"source {i + 1}"
                        logger.warning("%s: CTranslate2 failed on it (%s: %s); empty output line",
                                       where, type(e).__name__, e)
                        results.append(None)
            for i, r in zip(ids, results):
                out[i] = list(r.hypotheses[0]) if r is not None else []
        return out

    def encode(self, line: Union[str, bytes], line_no: Optional[int] = None) -> List[str]:
        where = f"line {line_no}" if line_no is not None else "a line"
        try:
            tokens = self.pipeline.encode(to_text(line, line_no))
        except Exception as e:  # noqa: BLE001 - one bad line must not stop the run
            logger.warning("%s: tokenization failed (%s: %s); empty output line", where, type(e).__name__, e)
            return []
        if len(tokens) > self.max_source_tokens:
            logger.warning("%s: %d subword tokens, truncated to the model's limit of %d "
                           "(max_source_positions %d, </s> included)", where, len(tokens),
                           self.max_source_tokens, self.max_source_tokens + 1)
            tokens = tokens[: self.max_source_tokens]
        return tokens

    def translate_lines(self, lines: Iterable[Union[str, bytes]], chunk: int = 1024, first_line: int = 1,
                        progress=None, **search) -> Iterator[str]:
        """Raw lines (text, or bytes as read from a file) -> raw translations, one per line, in
        order (streamed by chunks); see :func:`to_text` for invalid UTF-8."""
        buf: List[Union[str, bytes]] = []
        no = first_line
        for line in lines:
            buf.append(line.rstrip("\r\n" if isinstance(line, str) else b"\r\n"))
            if len(buf) >= chunk:
                yield from self._chunk(buf, no, progress, search)
                no += len(buf)
                buf = []
        if buf:
            yield from self._chunk(buf, no, progress, search)

    def _chunk(self, buf: List[str], first: int, progress, search) -> Iterator[str]:
        sources = [self.encode(line, first + k) for k, line in enumerate(buf)]
        hyps = self.translate_tokens(sources, first_line=first, **search)
        self.target_tokens = getattr(self, "target_tokens", 0) + sum(len(h) + 1 for h in hyps if h)
        for k, h in enumerate(hyps):
            yield self._decode(h, first + k)
        if progress is not None:
            progress.update(len(buf))

    def _decode(self, hyp: List[str], line_no: int) -> str:
        if not hyp:
            return ""
        try:
            text = self.pipeline.decode(hyp)
        except Exception as e:  # noqa: BLE001
            logger.warning("line %d: detokenization failed (%s: %s); the subword tokens joined instead",
                           line_no, type(e).__name__, e)
            text = " ".join(hyp)
        # one output line per input line, whatever the vocabulary holds
        return text.replace("\r", " ").replace("\n", " ")


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


HELP = """\
Translate raw text with a model exported by deepnmt-export-ct2 (CTranslate2): the model's own
tokenization and BPE, beam search, BPE removal and detokenization.  One output line for every
input line, in input order; a line that cannot be translated gives an empty line and a warning
naming it.

  deepnmt-translate --model OUT_DIR < raw.src > raw.hyp
  deepnmt-translate --model OUT_DIR --input raw.src --output raw.hyp --beam 5 --batch-size 32
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deepnmt-translate", description=HELP,
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="directory written by deepnmt-export-ct2")
    p.add_argument("--input", "-i", help="raw source text, one sentence per line (default: stdin)")
    p.add_argument("--output", "-o", help="where translations go (default: stdout)")
    p.add_argument("--beam", type=int, default=5, help="beam size (1 = greedy)")
    p.add_argument("--lenpen", type=float, default=1.0, help="length penalty, as fairseq-generate's --lenpen")
    p.add_argument("--max-len", type=int, default=200,
                   help="longest hypothesis in subword tokens before </s> (fairseq's --max-len-b)")
    p.add_argument("--max-len-a", type=float, default=0.0,
                   help="as fairseq's --max-len-a: the limit is a * source length + --max-len, per batch of "
                        "length-sorted sentences")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per CTranslate2 batch")
    p.add_argument("--intra-threads", type=int, default=1,
                   help="threads per batch (default 1: faster than 2 on 2-vCPU machines, see docs/deployment.md)")
    p.add_argument("--inter-threads", type=int, default=1, help="batches translated in parallel")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--compute-type", default="default",
                   help="CTranslate2 compute type (default: the exported weights' type; e.g. int8, float16)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar when reading a file")
    p.add_argument("--no-vmap", action="store_true",
                   help="translate with the whole target vocabulary even where the export has a vocabulary "
                        "shortlist (deepnmt-export-ct2 --vmap; used by default when present)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        model = DeployedModel(a.model, a.device, a.compute_type, a.intra_threads, a.inter_threads,
                              use_vmap=False if a.no_vmap else None)
    except (FileNotFoundError, ValueError) as e:
        print(f"deepnmt-translate: error: {e}", file=sys.stderr)
        return 2
    search = dict(beam=a.beam, lenpen=a.lenpen, max_len=a.max_len, batch_size=a.batch_size, max_len_a=a.max_len_a)
    # bytes in, decoded line by line (to_text): one invalid byte costs its line a U+FFFD and a
    # warning, not the run (a text-mode stream raises UnicodeDecodeError mid-file)
    src: BinaryIO = open(a.input, "rb") if a.input else getattr(sys.stdin, "buffer", sys.stdin)
    dst: TextIO = open(a.output, "w", encoding="utf-8", newline="\n") if a.output else sys.stdout
    progress = None
    if a.input and not a.no_progress:
        try:
            from tqdm import tqdm

            progress = tqdm(total=_count_lines(a.input), unit="lines", file=sys.stderr, desc="translating")
        except ImportError:  # pragma: no cover
            progress = None
    t0 = time.perf_counter()
    n = 0
    try:
        # a terminal on stdin: one line at a time, so an interactive user gets answers as they type
        chunk = 1 if not a.input and sys.stdin.isatty() else 1024
        for out in model.translate_lines(src, chunk=chunk, progress=progress, **search):
            dst.write(out + "\n")
            n += 1
            if chunk == 1:
                dst.flush()
    finally:
        if progress is not None:
            progress.close()
        if a.input:
            src.close()
        if a.output:
            dst.close()
    dt = time.perf_counter() - t0
    toks = getattr(model, "target_tokens", 0)
    print(f"deepnmt-translate: {n} lines, {toks} target tokens in {dt:.1f} s "
          f"({toks / max(dt, 1e-9):.0f} tok/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
