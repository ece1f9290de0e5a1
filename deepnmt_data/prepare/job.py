"""The driver of one dataset's preparation (:class:`Job`): settings, archives, the steps
``raw -> tok -> bpe -> bin`` each built in ``<step>.partial/`` and renamed when complete, the
lock, ``--force``, ``--dry-run`` and the summary.  A corpus family supplies the text steps
(:mod:`.translation`, :mod:`.summarization`); subword learning and binarization are shared."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path

from .. import corpora
from .archives import archive_candidates, download, hash_file, locate_archive
from .binarize import binarize
from .common import FORMAT_VERSION, SPLITS, STEPS, DataPrepError, Log, read_pairs
from .subwords import learn_bpe, learn_spm
from .workers import Workers


class Job:
    """One dataset (``DATA_ROOT/<recipe name>``).  Subclasses give ``describe_steps`` (the
    plan ``--dry-run`` prints), ``step_raw``, ``step_tok`` and ``_seg_split`` (one split of
    the ``bpe`` step)."""

    def __init__(self, args, recipe):
        self.args = args
        self.r = recipe
        self.root = Path(args.data_root).resolve()
        self.ds = self.root / recipe.name
        self.downloads = self.root / "downloads"
        self.from_dir = Path(args.from_dir).resolve() if args.from_dir else None
        self.log = Log(recipe.name)
        self.workers = max(1, args.workers)
        self.merges = args.bpe_merges or recipe.bpe_merges
        self.config = {
            "format": FORMAT_VERSION,
            "name": recipe.name,
            "recipe": recipe.fingerprint(),
            "src": recipe.src,
            "tgt": recipe.tgt,
            "segmenter": f"sentencepiece-{args.spm_model_type}" if args.spm else "subword-nmt",
            "bpe_merges" if not args.spm else "spm_vocab_size": self.merges,
            "invalid_utf8": "replace" if args.allow_invalid_utf8 else "error",
        }
        self.archives = {}      # key -> Path
        self.sources = {}

    # ------------------------------------------------------------------ helpers
    def step_done(self, step: str) -> bool:
        return (self.ds / step / "STEP.json").is_file()

    def step_info(self, step: str) -> dict:
        return json.loads((self.ds / step / "STEP.json").read_text())

    def fresh_partial(self, step: str) -> Path:
        p = self.ds / f"{step}.partial"
        if p.exists():
            self.log(f"{step}: removing the unfinished {p.name} of an earlier run")
            shutil.rmtree(p)
        p.mkdir(parents=True)
        return p

    def finish_step(self, step: str, partial: Path, stats: dict, t0: float) -> None:
        info = {"config": self.config, "stats": stats, "seconds": round(time.time() - t0, 1),
                "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        if step == "raw":
            info["sources"] = {k: v["sha256"] for k, v in self.sources.items()}
        (partial / "STEP.json").write_text(json.dumps(info, indent=1) + "\n")
        os.replace(partial, self.ds / step)
        self.log(f"{step}: done in {info['seconds']} s")

    def parts(self, split: str):
        r = self.r
        return {"train": r.train, "valid": r.valid, "test": r.test}[split]

    def langs(self):
        return self.r.src, self.r.tgt

    # ------------------------------------------------------------------ plan / dry run
    def dry_run(self) -> None:
        r = self.r
        print(f"{r.name}: {r.title}  [{r.papers}]")
        print(f"  output: {self.ds}")
        print(f"  settings: {json.dumps(self.config)}")
        if (self.ds / ".done").exists():
            print("  status: already prepared (.done exists)")
        try:
            self.check_config()
        except DataPrepError as e:
            print(f"  WARNING: {e}")
        print("  archives:")
        for key in sorted(set(r.archive_keys()) if hasattr(r, "archive_keys") else {p.archive for p in r.parts()}):
            arch = corpora.ARCHIVES[key]
            path, origin = locate_archive(arch, self.from_dir, self.downloads)
            if path is not None:
                where = f"use {path} ({origin})"
            elif self.from_dir is not None:
                where = f"MISSING in --from-dir {self.from_dir} (expected {' or '.join(archive_candidates(arch))})"
            else:
                where = f"download {arch.urls[0]} -> {self.downloads / arch.filename}"
            chk = f"sha256 {arch.sha256}" if arch.sha256 else (f"md5 {arch.md5}" if arch.md5 else "no known checksum")
            print(f"    {arch.filename}: {where}; {chk}")
        print("  steps:")
        for step, what in self.describe_steps():
            state = "done" if self.step_done(step) else (
                "unfinished (restarts)" if (self.ds / f"{step}.partial").exists() else "to do")
            print(f"    {step:4s} [{state}] {what}")
        if self.args.stop_after:
            print(f"  stops after: {self.args.stop_after}")

    # ------------------------------------------------------------------ sources
    def fetch(self) -> None:
        keys = sorted(set(self.r.archive_keys()) if hasattr(self.r, "archive_keys")
                      else {p.archive for p in self.r.parts()})
        if self.from_dir is not None:
            missing = [corpora.ARCHIVES[k] for k in keys
                       if locate_archive(corpora.ARCHIVES[k], self.from_dir, self.downloads)[0] is None]
            if missing:
                raise DataPrepError(f"not found in --from-dir {self.from_dir}:\n" + "\n".join(
                    f"  {a.filename} (or {', '.join(archive_candidates(a)[1:]) or '-'}): {a.description}; "
                    f"URL {a.urls[0]}" for a in missing))
        for key in keys:
            arch = corpora.ARCHIVES[key]
            path, origin = locate_archive(arch, self.from_dir, self.downloads)
            url = None
            if path is None:
                url = download(arch, self.downloads / arch.filename, self.log)
                path, origin = self.downloads / arch.filename, "downloaded"
            self.log(f"source {arch.filename}: {path} ({origin}); computing checksums")
            h = hash_file(path, self.log)
            verified = self.verify(arch, path, h, origin)
            self.archives[key] = path
            self.sources[key] = {"file": str(path), "origin": origin, "downloaded_from": url,
                                 "canonical_url": arch.urls[0], **h,
                                 "verified": verified, "checksum_source": arch.checksum_source}

    def verify(self, arch, path: Path, h: dict, origin: str) -> str:
        want = ("sha256", arch.sha256) if arch.sha256 else (("md5", arch.md5) if arch.md5 else None)
        if want is None:
            return "no known checksum (SHA-256 recorded)"
        kind, value = want
        if h[kind] == value:
            return f"{kind} matches"
        if self.args.ignore_checksums:
            self.log(f"WARNING: {path.name}: {kind} {h[kind]} != expected {value} (--ignore-checksums)")
            return f"{kind} MISMATCH ignored (--ignore-checksums)"
        msg = f"{path} has {kind} {h[kind]}, expected {value} ({arch.checksum_source})."
        if origin in ("downloaded", "cache"):
            bad = path.with_name(path.name + f".bad-{int(time.time())}")
            os.replace(path, bad)
            msg += f" Moved it aside to {bad}; run again to download it anew."
        else:
            msg += " The file in --from-dir was left as it is."
        raise DataPrepError(msg + " Pass --ignore-checksums if the upstream file was re-released.")

    # ------------------------------------------------------------------ step bpe (the split: a subclass)
    def tok_pairs(self, split: str):
        s, t = self.langs()
        yield from read_pairs(self.ds / "tok" / f"{split}.{s}", self.ds / "tok" / f"{split}.{t}")

    def step_bpe(self) -> dict:
        a = self.args
        out = self.fresh_partial("bpe")
        stats = {}
        if a.spm:
            model = learn_spm(self.ds / "tok", self.langs(), self.merges, a.spm_model_type, a.spm_input_sentences,
                              self.workers, out, self.log)
            spec = {"spm": str(model)}
            stats["model"] = model.name
        else:
            codes = learn_bpe(self.ds / "tok", self.langs(), self.merges, out, self.log)
            spec = {"codes": str(codes)}
            stats["model"] = codes.name
        with Workers(self.workers, spec) as pool:
            for split in SPLITS:
                self._seg_split(split, pool, out, stats)
        return stats

    # ------------------------------------------------------------------ step bin
    def step_bin(self) -> dict:
        s, t = self.langs()
        return binarize(self.ds / "bpe", self.fresh_partial("bin"), s, t, self.workers,
                        self.step_info("bpe")["stats"], self.log)

    # ------------------------------------------------------------------ driver
    def run(self) -> int:
        a, ds = self.args, self.ds
        if a.dry_run:
            self.dry_run()
            return 0
        ds.mkdir(parents=True, exist_ok=True)
        with open(ds / ".lock", "a+") as lockf:
            try:
                fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lockf.seek(0)
                pid = lockf.read().strip() or "?"
                raise DataPrepError(f"another prepare_data.py run (pid {pid}) is working on {ds} "
                                    f"(lock {ds / '.lock'})") from None
            lockf.seek(0)
            lockf.truncate()
            lockf.write(f"{os.getpid()}\n")
            lockf.flush()
            return self._run_locked()

    def _run_locked(self) -> int:
        a, ds = self.args, self.ds
        if (ds / ".done").exists() and not a.force:       # re-checked under the lock
            self.check_config()
            self.log(f"already prepared: {ds / 'bin'}")
            return 0
        if a.force:
            self.wipe()
        self.check_config()
        (ds / "CONFIG.json").write_text(json.dumps(self.config, indent=1) + "\n")
        self.log(f"preparing {self.r.title} in {ds} ({self.workers} workers)")
        self.fetch()
        (ds / "SOURCES.json").write_text(json.dumps(self.sources, indent=1) + "\n")
        if self.step_done("raw"):
            old = self.step_info("raw").get("sources", {})
            new = {k: v["sha256"] for k, v in self.sources.items()}
            if old != new:
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise DataPrepError(f"the archives {', '.join(changed)} differ from those {ds / 'raw'} was built "
                                    "from; pass --force to rebuild the dataset from them")
        all_stats = {}
        for step in STEPS:
            if self.step_done(step):
                self.log(f"{step}: already done, skipped")
            else:
                t0 = time.time()
                self.log(f"{step}: start")
                stats = getattr(self, f"step_{step}")()
                self.finish_step(step, ds / f"{step}.partial", stats, t0)
            all_stats[step] = self.step_info(step)["stats"]
            if a.stop_after == step:
                self.log(f"stopped after {step} as asked (--stop-after); no .done written")
                return 0
        self.write_summary(all_stats)
        return 0

    def check_config(self) -> None:
        f = self.ds / "CONFIG.json"
        if not f.exists():
            return
        old = json.loads(f.read_text())
        started = (self.ds / ".done").exists() or any(
            (self.ds / s).exists() or (self.ds / f"{s}.partial").exists() for s in STEPS)
        if old != self.config and started:
            diff = ", ".join(f"{k}: {old.get(k)!r} -> {self.config.get(k)!r}"
                             for k in sorted(set(old) | set(self.config)) if old.get(k) != self.config.get(k))
            state = "a finished dataset" if (self.ds / ".done").exists() else "unfinished work"
            raise DataPrepError(
                f"{self.ds} holds {state} prepared with other settings ({diff}). Nothing was changed. Pass --force "
                "to delete it and rebuild with the new settings, or use another --data-root.")

    def wipe(self) -> None:
        ds = self.ds
        if (ds / ".done").exists():
            (ds / ".done").unlink()         # first: the directory must never look complete
        self.log(f"--force: deleting the prepared data in {ds}")
        for step in STEPS:
            for p in (ds / step, ds / f"{step}.partial"):
                if p.exists():
                    shutil.rmtree(p)
        for f in ("CONFIG.json", "SOURCES.json", "STATS.json"):
            if (ds / f).exists():
                (ds / f).unlink()

    def write_summary(self, all_stats: dict) -> None:
        r = self.r
        sizes = {split: all_stats["bin"][split] for split in SPLITS}
        comparison = {}
        for split in SPLITS:
            comparison[split] = {"ours": sizes[split], "paper": r.paper_sizes.get(split)}
            if split in r.expected:
                comparison[split]["expected"] = r.expected[split]
                comparison[split]["matches"] = r.expected[split] == sizes[split]
        summary = {"config": self.config, "sizes": sizes, "dictionary": all_stats["bin"]["dictionary"],
                   "comparison_with_paper": comparison, "steps": all_stats, "notes": r.notes}
        tmp = self.ds / "STATS.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1) + "\n")
        os.replace(tmp, self.ds / "STATS.json")
        self.log(f"finished: {self.ds / 'bin'} (joined dictionary {summary['dictionary']:,} types)")
        for split in SPLITS:
            c = comparison[split]
            flag = "" if "expected" not in c else ("  (= paper)" if c["matches"] else
                                                   f"  (paper/recipe: {c['expected']:,}; differs)")
            self.log(f"  {split:5s} {c['ours']:>11,} sentence pairs; paper: {c['paper']}{flag}")
        done = {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "sizes": sizes}
        (self.ds / ".done.tmp").write_text(json.dumps(done) + "\n")
        os.replace(self.ds / ".done.tmp", self.ds / ".done")
