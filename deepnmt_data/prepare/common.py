"""What every stage of ``deepnmt-prepare-data`` shares: the step and split names, the user-facing
error, the log and progress lines, and the writer of a parallel split."""

from __future__ import annotations

import os
import time
from pathlib import Path

STEPS = ("raw", "tok", "bpe", "bin")
SPLITS = ("train", "valid", "test")
FORMAT_VERSION = 1
REPORT_EVERY = 10.0   # seconds between progress lines


class DataPrepError(Exception):
    """A problem with the inputs or settings, reported to the user without a traceback."""


# ============================================================================ logging
class Log:
    def __init__(self, name: str):
        self.name = name
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        el = int(time.time() - self.t0)
        print(f"[prepare_data {self.name} {el // 3600}:{el // 60 % 60:02d}:{el % 60:02d}] {msg}", flush=True)


class Progress:
    """Counts items and logs a line every REPORT_EVERY seconds (and once at the end)."""

    def __init__(self, log: Log, what: str, unit: str = "lines"):
        self.log, self.what, self.unit = log, what, unit
        self.n = 0
        self.t0 = self.last = time.time()

    def add(self, k: int = 1) -> None:
        self.set(self.n + k)

    def set(self, n: int) -> None:
        self.n = n
        now = time.time()
        if now - self.last >= REPORT_EVERY:
            self.last = now
            self.log(f"{self.what}: {self.n:,} {self.unit} ({self.n / max(now - self.t0, 1e-9):,.0f}/s)")

    def done(self, extra: str = "") -> None:
        dt = time.time() - self.t0
        self.log(f"{self.what}: {self.n:,} {self.unit} in {dt:.1f} s{extra}")


def nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class Writer:
    """Writes a parallel split as ``<split>.<src>`` / ``<split>.<tgt>`` (temp names, renamed on close)."""

    def __init__(self, out: Path, split: str, s: str, t: str):
        self.out, self.split, self.n = out, split, 0
        self.names = [out / f"{split}.{s}", out / f"{split}.{t}"]
        self.fs = [open(str(p) + ".tmp", "w", encoding="utf-8", newline="\n") for p in self.names]

    def write(self, a: str, b: str) -> None:
        self.fs[0].write(a + "\n")
        self.fs[1].write(b + "\n")
        self.n += 1

    def close(self) -> None:
        for f, p in zip(self.fs, self.names):
            f.close()
            os.replace(str(p) + ".tmp", p)


def read_pairs(source: Path, target: Path):
    """(source line, target line) of two parallel text files, newlines stripped; a length mismatch
    raises (``zip(strict=True)``) instead of silently dropping the longer file's tail."""
    with open(source, encoding="utf-8", newline="\n") as fa, open(target, encoding="utf-8", newline="\n") as fb:
        for a, b in zip(fa, fb, strict=True):
            yield a.rstrip("\n"), b.rstrip("\n")
