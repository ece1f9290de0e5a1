"""The summarization corpus (CNN/DailyMail for MSC Appendix A, ``cnndm``): story archives and
See et al.'s URL lists -> parsed stories -> tokenized article/summary pairs -> joint BPE with
the articles truncated (:mod:`deepnmt_data.cnndm` holds See et al.'s rules)."""

from __future__ import annotations

import collections
import json
import lzma
import os
import tarfile
import zlib
from pathlib import Path

from .. import cnndm, corpora
from .archives import ArchiveReader
from .common import SPLITS, DataPrepError, Progress, Writer
from .job import Job
from .workers import Workers, _seg_job, _story_job, chunks


class SummarizationJob(Job):
    """CNN/DailyMail for MSC Appendix A (``cnndm``): story archives + See et al.'s URL lists ->
    ``raw/<split>.jsonl`` (parsed stories, URL-list order) -> ``tok/<split>.{article,summary}``
    (Moses-tokenized, lowercased, See et al.'s period fix, ``<q>`` between summary sentences)
    -> ``bpe/`` (joint BPE; articles truncated to their first 640 subword tokens) -> ``bin/``.
    The choices are in deepnmt_data/cnndm.py and docs/data-preparation.md."""

    def __init__(self, args, recipe):
        super().__init__(args, recipe)
        if args.spm:
            raise DataPrepError("--spm is not offered for cnndm (joint BPE, subword-nmt)")
        self.max_doc = args.max_doc_tokens or recipe.max_doc_tokens
        self.config["max_doc_tokens"] = self.max_doc

    def describe_steps(self) -> list:
        r = self.r
        return [
            ("raw", "read " + ", ".join(corpora.ARCHIVES[k].filename for k in r.stories) + " and the URL lists "
                    + ", ".join(corpora.ARCHIVES[r.url_lists[s]].filename for s in SPLITS)
                    + "; story = sha1(URL).story; article lines / @highlight sentences (See et al.)"),
            ("tok", "Moses tokenizer (sacremoses, en, escape=False; CoreNLP's PTB tokenizer in See et al.), "
                    "lowercased, See et al.'s missing-period fix; summary sentences joined with "
                    f"{cnndm.SENT_SEP}; empty articles or summaries dropped"),
            ("bpe", f"joint BPE, subword-nmt, {self.merges} merges learned on train article+summary; articles "
                    f"truncated to their first {self.max_doc} subword tokens"),
            ("bin", f"fairseq-preprocess --source-lang {r.src} --target-lang {r.tgt} --joined-dictionary "
                    f"--workers {self.workers}"),
        ]

    def step_raw(self) -> dict:
        r = self.r
        out = self.fresh_partial("raw")
        where = {}          # story hash -> (split, position)
        order = {}
        for split in SPLITS:
            path = self.archives[r.url_lists[split]]
            with open(path, encoding="utf-8") as f:
                hashes = cnndm.read_url_list(f)
            if not hashes:
                raise DataPrepError(f"the {split} URL list {path} is empty")
            for i, h in enumerate(hashes):
                if h in where:
                    raise DataPrepError(f"URL lists: story {h} is listed twice ({where[h][0]} and {split})")
                where[h] = (split, i)
            order[split] = hashes
        stats = {"url_lists": {s: len(order[s]) for s in SPLITS}, "archives": {}}
        offsets = {}
        blob = out / "stories.jsonl.tmp"
        with open(blob, "w", encoding="utf-8", newline="\n") as fout:
            for key in r.stories:
                path, n = self.archives[key], 0
                self.log(f"raw: reading {path}")
                prog = Progress(self.log, f"raw: {path.name}", "stories")
                try:
                    with tarfile.open(path, mode="r|*") as tar:
                        for m in tar:
                            base = m.name.rsplit("/", 1)[-1]
                            if not m.isfile() or not base.endswith(".story") or base[:-6] not in where:
                                continue
                            h = base[:-6]
                            data = tar.extractfile(m).read()
                            try:
                                text = data.decode("utf-8", errors="replace" if self.args.allow_invalid_utf8
                                                   else "strict")
                            except UnicodeDecodeError as e:
                                raise DataPrepError(f"{path.name}:{m.name} is not valid UTF-8 ({e}); "
                                                    "--allow-invalid-utf8 replaces bad bytes") from None
                            article, highlights = cnndm.parse_story(text)
                            offsets[h] = fout.tell()
                            fout.write(json.dumps({"id": h, "article": article, "highlights": highlights},
                                                  ensure_ascii=False) + "\n")
                            n += 1
                            prog.add()
                except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as e:
                    raise ArchiveReader(path, corpora.ARCHIVES[key])._corrupt(e) from None
                prog.done()
                stats["archives"][key] = n
        missing = [h for h in where if h not in offsets]
        if missing:
            raise DataPrepError(f"{len(missing):,} stories of the URL lists are in none of the archives "
                                f"(e.g. {', '.join(m + '.story' for m in missing[:3])}); are the archives "
                                "complete (cnn_stories.tgz and dailymail_stories.tgz)?")
        with open(blob, "rb") as fin:
            for split in SPLITS:
                with open(out / f"{split}.jsonl.tmp", "wb") as f:
                    for h in order[split]:
                        fin.seek(offsets[h])
                        f.write(fin.readline())
                os.replace(out / f"{split}.jsonl.tmp", out / f"{split}.jsonl")
                stats[split] = len(order[split])
        blob.unlink()
        return stats

    def step_tok(self) -> dict:
        out = self.fresh_partial("tok")
        spec = {"tok": True, "langs": ("en",), "lowercase": False, "aggressive": False, "normalize": False}
        stats = {}
        s, t = self.langs()
        with Workers(self.workers, spec) as pool:
            for split in SPLITS:
                prog = Progress(self.log, f"tok: {split}", "stories")
                w = Writer(out, split, s, t)
                dropped = collections.Counter()

                def stories(split=split):
                    with open(self.ds / "raw" / f"{split}.jsonl", encoding="utf-8") as f:
                        for line in f:
                            yield json.loads(line)

                for res in pool.map(_story_job, chunks(stories(), 500)):
                    for art, summ in res:
                        if not art or not summ:
                            dropped["empty article" if not art else "empty summary"] += 1
                            continue
                        w.write(art, summ)
                    prog.add(len(res))
                w.close()
                stats[split] = w.n
                stats[f"{split}_dropped"] = dict(dropped)
                prog.done(f" -> {w.n:,} pairs" + (f" (dropped {dict(dropped)})" if dropped else ""))
        return stats

    def _seg_split(self, split: str, pool, out: Path, stats: dict) -> None:
        """Apply BPE to one split and truncate every article to its first max_doc_tokens subword tokens."""
        n_max = self.max_doc
        s, t = self.langs()
        prog = Progress(self.log, f"bpe: apply to {split}", "pairs")
        w = Writer(out, split, s, t)
        truncated = 0
        for res in pool.map(_seg_job, chunks(self.tok_pairs(split))):
            for x, y in res:
                if len(x.split()) > n_max:
                    truncated += 1
                    x = cnndm.truncate(x, n_max)
                w.write(x, y)
            prog.add(len(res))
        w.close()
        stats[split] = w.n
        stats[f"{split}_truncated"] = truncated
        prog.done(f" -> {w.n:,} pairs ({truncated:,} articles truncated to {n_max} subword tokens)")
