"""The translation corpora (IWSLT14/17 TED talks, WMT14/15 news): parallel members of the
archives -> ``raw/`` (metadata and markup removed) -> ``tok/`` (Moses, lowercased for IWSLT;
IWSLT's valid split off the training text and train cleaned here) -> ``bpe/`` (WMT's train
cleaned after subword segmentation, as fairseq's recipes do).  docs/data-preparation.md
explains every choice; the recipes are in :mod:`deepnmt_data.corpora`."""

from __future__ import annotations

import collections
import os
import shutil
from pathlib import Path

from .. import corpora
from .archives import ArchiveReader
from .common import SPLITS, DataPrepError, Progress, Writer, nth, read_pairs
from .job import Job
from .text import clean_reason, decoded_lines, parse_segs, parse_tags, parse_text
from .workers import Workers, _seg_job, _tok_job, chunks


class TranslationJob(Job):
    """A parallel corpus of :data:`deepnmt_data.corpora.RECIPES` (a :class:`~deepnmt_data.corpora.Recipe`)."""

    # ------------------------------------------------------------------ plan
    def describe_steps(self) -> list:
        r, a = self.r, self.args
        tok = f"Moses tokenizer (sacremoses, escape=False{', aggressive dash splits' if r.aggressive_dash else ''})"
        if r.normalize_train:
            tok += "; train first normalize-punctuation + remove-non-printing-char"
        if r.lowercase:
            tok += "; lowercased"
        if r.valid_every:
            order = "before" if r.split_before_clean else "after"
            tok += (f"; valid = every {nth(r.valid_every)} training line ({order} cleaning); train cleaned "
                    f"{r.clean_min}..{r.clean_max} tokens, ratio {r.clean_ratio}")
        seg = (f"joint sentencepiece {a.spm_model_type} model, vocabulary {self.merges}" if a.spm
               else f"joint BPE, subword-nmt, {self.merges} merges")
        seg += " learned on train src+tgt, applied to all splits"
        if r.clean_stage == "bpe":
            seg += f"; train cleaned {r.clean_min}..{r.clean_max} subword units, ratio {r.clean_ratio}"
        return [
            ("raw", "extract " + ", ".join(f"{s}: " + " + ".join(p.name for p in self.parts(s))
                                           for s in SPLITS if self.parts(s))),
            ("tok", tok),
            ("bpe", seg),
            ("bin", f"fairseq-preprocess --source-lang {r.src} --target-lang {r.tgt} --joined-dictionary "
                    f"--workers {self.workers}"),
        ]

    # ------------------------------------------------------------------ step raw
    def step_raw(self) -> dict:
        out = self.fresh_partial("raw")
        stats = {"files": {}}
        bykey = collections.defaultdict(list)
        for split in SPLITS:
            for p in self.parts(split):
                for lang in self.langs():
                    bykey[p.archive].append((split, p, lang))
        ids = {}
        for key, items in bykey.items():
            wanted = {}
            targets = collections.defaultdict(list)
            for split, p, lang in items:
                wanted[p.members[lang]] = p.gz
                targets[p.members[lang]].append((split, p, lang))
            arch = corpora.ARCHIVES[key]

            def handle(suffix, stream, label, targets=targets):
                tl = targets[suffix]
                split, p, lang = tl[0]
                fst = {}
                lines = decoded_lines(stream, label, fst, self.args.allow_invalid_utf8)
                seg_ids = []
                if p.fmt == "text":
                    gen = parse_text(lines, label, fst)
                elif p.fmt == "tags":
                    gen = parse_tags(lines, label, fst)
                elif p.fmt in ("xml", "sgm"):
                    gen = parse_segs(lines, label, fst, seg_ids)
                else:
                    raise DataPrepError(f"unknown format {p.fmt}")
                names = [f"{s}.{q.name}.{lg}" for s, q, lg in tl]
                prog = Progress(self.log, f"raw: {label}")
                tmp = out / (names[0] + ".tmp")
                n = 0
                with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                    for line in gen:
                        f.write(line + "\n")
                        n += 1
                        prog.add()
                if n == 0:
                    raise DataPrepError(
                        f"{label} is empty (no {'segments' if p.fmt in ('xml', 'sgm') else 'sentences'} in it)")
                for extra in names[1:]:
                    shutil.copyfile(tmp, out / extra)
                os.replace(tmp, out / names[0])
                prog.done()
                for nm in names:
                    stats["files"][nm] = {"member": label, "lines": n, **fst}
                    ids[nm] = seg_ids

            self.log(f"raw: reading {self.archives[key]}")
            ArchiveReader(self.archives[key], arch).read(wanted, handle)
        s, t = self.langs()
        for split in SPLITS:
            for p in self.parts(split):
                a, b = f"{split}.{p.name}.{s}", f"{split}.{p.name}.{t}"
                na, nb = stats["files"][a]["lines"], stats["files"][b]["lines"]
                if na != nb:
                    what = {"xml": "segments", "sgm": "segments", "tags": "lines after removing metadata"}.get(
                        p.fmt, "lines")
                    raise DataPrepError(
                        f"{p.name}: {stats['files'][a]['member']} has {na:,} {what} but "
                        f"{stats['files'][b]['member']} has {nb:,}; the two sides are not parallel")
                if ids.get(a) and ids[a] != ids[b]:
                    k = next(i for i, (x, y) in enumerate(zip(ids[a], ids[b])) if x != y)
                    raise DataPrepError(f"{p.name}: segment {k + 1} has id {ids[a][k]!r} in {a} but "
                                        f"{ids[b][k]!r} in {b}; the two sides are not aligned")
        for split in ("valid", "test"):     # untokenized references (sacreBLEU), parts concatenated
            if self.parts(split):
                for lang in (s, t):
                    with open(out / f"{split}.{lang}.tmp", "wb") as f:
                        for p in self.parts(split):
                            f.write((out / f"{split}.{p.name}.{lang}").read_bytes())
                    os.replace(out / f"{split}.{lang}.tmp", out / f"{split}.{lang}")
        return stats

    # ------------------------------------------------------------------ step tok
    def raw_pairs(self, split: str):
        s, t = self.langs()
        for p in self.parts(split):
            yield from read_pairs(self.ds / "raw" / f"{split}.{p.name}.{s}", self.ds / "raw" / f"{split}.{p.name}.{t}")

    def step_tok(self) -> dict:
        r = self.r
        out = self.fresh_partial("tok")
        spec = {"tok": True, "langs": self.langs(), "lowercase": r.lowercase, "aggressive": r.aggressive_dash,
                "normalize": r.normalize_train}
        stats = {}
        with Workers(self.workers, spec) as pool:
            for split in SPLITS:
                self._tok_split(split, pool, out, stats)
        return stats

    def _tok_split(self, split: str, pool, out: Path, stats: dict) -> None:
        """Tokenize one split.  For IWSLT the training text is also split into train/valid
        (every ``valid_every``-th line, before or after cleaning) and cleaned here."""
        r = self.r
        s, t = self.langs()
        if split == "valid" and not r.valid:
            return              # written while the training data are tokenized
        train = split == "train"
        prog = Progress(self.log, f"tok: {split}", "pairs")
        jobs = ((train, c) for c in chunks(self.raw_pairs(split)))
        if train and r.valid_every:
            writers = {"train": Writer(out, "train", s, t), "valid": Writer(out, "valid", s, t)}
        else:
            writers = {split: Writer(out, split, s, t)}
        clean = train and r.clean_stage == "tok"
        dropped = collections.Counter()
        n_in = n_clean = 0
        for res in pool.map(_tok_job, jobs):
            for a, b in res:
                n_in += 1
                if train and r.valid_every and r.split_before_clean and n_in % r.valid_every == 0:
                    writers["valid"].write(a, b)        # MSC reading: split first, valid not cleaned
                    continue
                if clean:
                    why = clean_reason(a, b, r.clean_min, r.clean_max, r.clean_ratio)
                    if why:
                        dropped[why] += 1
                        continue
                n_clean += 1
                if train and r.valid_every and not r.split_before_clean and n_clean % r.valid_every == 0:
                    writers["valid"].write(a, b)        # fairseq's order: clean first, then split
                    continue
                writers[split].write(a, b)
            prog.add(len(res))
        for w in writers.values():
            w.close()
            stats[w.split] = w.n
        if train:
            stats["train_input"] = n_in
            stats["train_dropped"] = dict(dropped)
        prog.done(" -> " + ", ".join(f"{w.split} {w.n:,}" for w in writers.values())
                  + (f" (cleaning dropped {sum(dropped.values()):,}: {dict(dropped)})" if dropped else ""))

    # ------------------------------------------------------------------ step bpe
    def _seg_split(self, split: str, pool, out: Path, stats: dict) -> None:
        """Apply the subword model to one split; WMT training pairs are cleaned afterwards
        (fairseq's WMT recipes run clean-corpus-n on the BPE'd text)."""
        r = self.r
        s, t = self.langs()
        prog = Progress(self.log, f"bpe: apply to {split}", "pairs")
        w = Writer(out, split, s, t)
        dropped = collections.Counter()
        clean = split == "train" and r.clean_stage == "bpe"
        for res in pool.map(_seg_job, chunks(self.tok_pairs(split))):
            for x, y in res:
                if clean:
                    why = clean_reason(x, y, r.clean_min, r.clean_max, r.clean_ratio)
                    if why:
                        dropped[why] += 1
                        continue
                w.write(x, y)
            prog.add(len(res))
        w.close()
        stats[split] = w.n
        if clean:
            stats["train_dropped"] = dict(dropped)
        prog.done(f" -> {w.n:,} pairs" + (f" (cleaning dropped {sum(dropped.values()):,}: {dict(dropped)})"
                                          if dropped else ""))
