"""``deepnmt-prepare-data``: download (or take from a directory), process and binarize the papers'
corpora for fairseq.

    deepnmt-prepare-data --list
    deepnmt-prepare-data NAME [--data-root DIR] [--from-dir DIR] [--workers N]
                              [--spm] [--bpe-merges N] [--force] [--dry-run]

(``python scripts/prepare_data.py`` is the same command with ``<repo>/work/data`` as the
default data root.)  NAME is one of the corpora of :mod:`deepnmt_data.corpora` (``--list``):
iwslt14-de-en, iwslt14-en-de, iwslt14-de-en-fairseq, iwslt17-en-fr (MSC Sec. 4.1),
wmt14-en-de (MSC), wmt14-en-de-dd, wmt14-en-fr (deep-decoder paper Sec. 4.1), wmt15-cs-en
(transparent attention, Sec. 4), wmt14-en-de-gpkd (GPKD), cnndm (MSC Appendix A).
docs/data-preparation.md explains every choice.

Output (DATA_ROOT = --data-root, else $DEEPNMT_DATA, else work/data)::

    DATA_ROOT/downloads/         archives fetched from the network (shared by all corpora)
    DATA_ROOT/NAME/raw/          the text the tokenizer reads: metadata/markup removed, whitespace unified
                                 (<split>.<part>.<lang>; {valid,test}.<lang> = untokenized references)
    DATA_ROOT/NAME/tok/          Moses-tokenized (lowercased for IWSLT); IWSLT train cleaned, valid split off
    DATA_ROOT/NAME/bpe/          joint BPE (subword-nmt ``code``) or sentencepiece (``spm.model``) applied;
                                 WMT train cleaned here (fairseq's recipes clean after BPE)
    DATA_ROOT/NAME/bin/          fairseq-preprocess --joined-dictionary: train/valid/test
    DATA_ROOT/NAME/CONFIG.json   the settings the data were made with
    DATA_ROOT/NAME/SOURCES.json  the archives used: origin, size, SHA-256, checksum verification
    DATA_ROOT/NAME/STATS.json    line counts at every step, next to the papers' sizes
    DATA_ROOT/NAME/.done         written last: the dataset is complete

Robustness: each step builds ``<step>.partial/`` and renames it when complete, so a re-run
skips finished steps and an interrupted step starts again from scratch; ``.done`` is written
last.  A finished dataset is never overwritten (``--force`` rebuilds it), a dataset made with
other settings is refused, and a lock file stops two runs on the same dataset.  Large
corpora are streamed line by line; tokenization and subword segmentation run in
``--workers`` processes with results written in input order (identical output for every
worker count).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from deepnmt_deploy.help_format import HelpFormatter
from .. import corpora
from .common import STEPS, DataPrepError, nth
from .summarization import SummarizationJob
from .translation import TranslationJob


def list_corpora() -> None:
    for r in corpora.RECIPES.values():
        if getattr(r, "kind", "") == "summarization":
            print(f"{r.name:24s} {r.src}->{r.tgt}  {r.title}")
            print(f"{'':24s} paper: {r.papers}; sizes: " + ", ".join(f"{k} {v}" for k, v in r.paper_sizes.items()))
            print(f"{'':24s} default subwords: {r.bpe_merges}; documents truncated to {r.max_doc_tokens} subword "
                  f"tokens; archives: " + ", ".join(corpora.ARCHIVES[k].filename for k in r.archive_keys()))
            continue
        print(f"{r.name:24s} {r.src}->{r.tgt}  {r.title}")
        print(f"{'':24s} paper: {r.papers}; sizes: " + ", ".join(f"{k} {v}" for k, v in r.paper_sizes.items()))
        print(f"{'':24s} default subwords: {r.bpe_merges}; valid: "
              + (" + ".join(p.name for p in r.valid) if r.valid else f"every {nth(r.valid_every)} training line")
              + "; test: " + " + ".join(p.name for p in r.test))


def build_parser(default_data_root=None) -> argparse.ArgumentParser:
    """The options; ``default_data_root``: the --data-root default when $DEEPNMT_DATA is unset
    (else ``work/data`` under the current directory, as deepnmt-repro reads it)."""
    p = argparse.ArgumentParser(
        prog="deepnmt-prepare-data",
        description="Prepare the papers' corpora (IWSLT14/17, WMT14/15) for fairseq: download or --from-dir, "
                    "Moses tokenization, joint BPE (or sentencepiece), fairseq-preprocess --joined-dictionary. "
                    "See docs/data-preparation.md.",
        formatter_class=HelpFormatter)
    p.add_argument("name", nargs="?", choices=list(corpora.RECIPES), metavar="NAME",
                   help="corpus to prepare: " + ", ".join(corpora.RECIPES) + " (--list: papers, splits, sizes)")
    p.add_argument("--list", action="store_true", help="list the corpora and exit")
    default_root = str(default_data_root or Path("work", "data"))
    p.add_argument("--data-root", default=os.environ.get("DEEPNMT_DATA", default_root),
                   help="output root (env DEEPNMT_DATA); the dataset goes to DATA_ROOT/NAME")
    p.add_argument("--from-dir", default=None,
                   help="take the archives from this directory (clusters without internet; --dry-run lists the "
                        "file names) instead of downloading them")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="processes for tokenization, subword segmentation and fairseq-preprocess")
    p.add_argument("--spm", action="store_true",
                   help="sentencepiece instead of subword-nmt BPE (joint model trained on the tokenized train "
                        "src+tgt; vocabulary size = --bpe-merges)")
    p.add_argument("--spm-model-type", choices=("unigram", "bpe"), default="unigram",
                   help="sentencepiece model type with --spm")
    p.add_argument("--spm-input-sentences", type=int, default=10_000_000,
                   help="with --spm: train on a random sample of this many sentences (0 = all)")
    p.add_argument("--bpe-merges", type=int, default=None,
                   help="BPE merge operations (with --spm: vocabulary size); default: the paper's value "
                        "(MSC Sec. 4.1: IWSLT 10k, WMT14 En-De 32k; deep-decoder paper Sec. 4.1: 40k; "
                        "transparent attention Sec. 4: Cs-En 32k; GPKD: 32k)")
    p.add_argument("--max-doc-tokens", type=int, default=None,
                   help="cnndm: truncate every article to its first N subword tokens (default: MSC Appendix A's "
                        "640)")
    p.add_argument("--force", action="store_true",
                   help="delete an existing (finished or differently configured) dataset and rebuild it")
    p.add_argument("--dry-run", action="store_true", help="show what would be done and exit")
    p.add_argument("--stop-after", choices=STEPS[:-1], default=None,
                   help="stop after this step (inspect the text before binarizing); .done is not written")
    p.add_argument("--allow-invalid-utf8", action="store_true",
                   help="replace undecodable bytes with U+FFFD instead of stopping (keeps the alignment)")
    p.add_argument("--ignore-checksums", action="store_true",
                   help="continue when an archive does not match its known checksum (recorded in SOURCES.json)")
    return p


def main(argv=None, default_data_root=None) -> int:
    """``deepnmt-prepare-data`` (and ``python scripts/prepare_data.py``, which passes
    ``<repo>/work/data`` as ``default_data_root``); the exit status."""
    parser = build_parser(default_data_root)
    args = parser.parse_args(argv)
    if args.list:
        list_corpora()
        return 0
    if not args.name:
        parser.error("NAME is required (or --list)")
    if args.max_doc_tokens is not None and args.max_doc_tokens < 1:
        parser.error("--max-doc-tokens must be positive")
    if args.bpe_merges is not None and args.bpe_merges < 1:
        parser.error("--bpe-merges must be positive")
    if args.from_dir and not Path(args.from_dir).is_dir():
        print(f"prepare_data: error: --from-dir {args.from_dir} is not a directory", file=sys.stderr)
        return 2
    recipe = corpora.RECIPES[args.name]
    job = (SummarizationJob if getattr(recipe, "kind", "") == "summarization" else TranslationJob)(args, recipe)
    try:
        return job.run()
    except DataPrepError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prepare_data: interrupted; finished steps are kept, a re-run continues from there", file=sys.stderr)
        return 130
