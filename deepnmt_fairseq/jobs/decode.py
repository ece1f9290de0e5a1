"""The one decode path: ``fairseq-generate`` from a checkpoint with named search settings, into a file
that appears only when it is complete.  ``deepnmt-repro evaluate``, the quickstart, ``deepnmt-distill``
(SKD and the report), the GPKD pipeline and the serve study decode through it; scoring is
:mod:`deepnmt_fairseq.scoring`.

* :func:`complete_or_nothing`: the project's one "write to ``<out>.partial``, rename when complete"
  (a file or a directory: fairseq-generate's output, fairseq-preprocess's ``--destdir``);
* :class:`Search`: the search settings by name (beam, length penalty, maximum length, batch, BPE
  removal, ...), as fairseq-generate flags;
* :func:`generate_command`: the whole command (built on :func:`.fairseq_argv.fairseq_generate`);
* :func:`generate`: runs it into its output file (:class:`GenerateError` when it fails: the output
  is not there, what fairseq printed is kept in the partial file or the log).

Nothing here imports fairseq.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from .fairseq_argv import fairseq_generate
from .stage import JobError


def partial_path(out) -> Path:
    """Where ``out`` is written until it is complete: ``<out>.partial``."""
    out = Path(out)
    return out.with_name(out.name + ".partial")


@contextmanager
def complete_or_nothing(out) -> Iterator[Path]:
    """``with complete_or_nothing(out) as tmp:`` the body writes ``tmp`` (``<out>.partial``: a file, or
    a directory; one left by an earlier try is removed first); when the body ends without an error,
    ``tmp`` becomes ``out`` (``os.replace``; an empty directory at ``out`` is replaced).  On an error
    ``out`` is not touched and ``tmp`` stays for inspection: a reader never sees half an output."""
    out = Path(out)
    tmp = partial_path(out)
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp)
    elif tmp.exists() or tmp.is_symlink():
        tmp.unlink()
    yield tmp
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        out.rmdir()
    os.replace(tmp, out)


@dataclass(frozen=True)
class Search:
    """fairseq-generate's search settings by name; ``None``: the flag is not given (fairseq's
    default).  Values are written as given (``str``), so a caller that formats one (``f"{x:g}"``)
    keeps its recorded commands.  ``remove_bpe``: ``True`` for a bare ``--remove-bpe``, or its
    argument (``subword_nmt``, ``sentencepiece``).  ``every_sentence``: ``--required-batch-size-multiple
    1`` (fairseq otherwise drops the last partial batch)."""

    beam: Optional[object] = None
    lenpen: Optional[object] = None
    batch_size: Optional[object] = None
    max_tokens: Optional[object] = None
    max_len_a: Optional[object] = None
    max_len_b: Optional[object] = None
    every_sentence: bool = True
    remove_bpe: Union[None, bool, str] = None
    nbest: Optional[object] = None

    def flags(self) -> List[str]:
        """The settings as flags, always in this order."""
        out: List[str] = []
        for flag, value in (("--beam", self.beam), ("--lenpen", self.lenpen), ("--batch-size", self.batch_size),
                            ("--max-tokens", self.max_tokens), ("--max-len-a", self.max_len_a),
                            ("--max-len-b", self.max_len_b)):
            if value is not None:
                out += [flag, str(value)]
        if self.every_sentence:
            out += ["--required-batch-size-multiple", "1"]
        if self.remove_bpe is True:
            out.append("--remove-bpe")
        elif self.remove_bpe:
            out += ["--remove-bpe", str(self.remove_bpe)]
        if self.nbest is not None:
            out += ["--nbest", str(self.nbest)]
        return out


def generate_command(data, model, search: Search, subset: str = "test", *, task: Sequence = (),
                     shard: Optional[Tuple[int, int]] = None, cpu: bool = False, fp16: bool = False,
                     extra: Iterable = (), resolve: bool = False) -> List[str]:
    """``fairseq-generate DATA --user-dir DIR --path MODEL [task flags] --gen-subset SUBSET [search]
    [--distributed-world-size N --distributed-rank K] [--cpu] [--fp16] [extra]``.  ``shard`` = (K, N):
    fairseq-generate's batch sharding, every N-th batch from the K-th, without any distributed
    process; ``resolve``: the console script of this environment."""
    return fairseq_generate(data, ["--path", model], task, ["--gen-subset", subset], search.flags(),
                            ["--distributed-world-size", shard[1], "--distributed-rank", shard[0]] if shard else [],
                            ["--cpu"] if cpu else [], ["--fp16"] if fp16 else [], extra, resolve=resolve)


class GenerateError(JobError):
    """fairseq-generate failed: its exit status (``returncode``), where its output is kept
    (``where``) and the end of it (``tail``)."""

    def __init__(self, returncode: int, where: Path, tail: str, name: str = "fairseq-generate"):
        super().__init__(f"{name} failed (exit {returncode}); its output is in {where}:\n{tail}")
        self.returncode, self.where, self.tail = returncode, where, tail


#: ``stderr=MERGED``: fairseq's log goes into the output file with the translations
MERGED = subprocess.STDOUT


def generate(argv: Sequence, out, stderr: Union[None, int, Path] = MERGED,
             env: Optional[Dict[str, str]] = None) -> Path:
    """Run ``argv`` (a fairseq-generate command: :func:`generate_command`) with its standard output
    into ``out``, which appears only when the command succeeded (:func:`complete_or_nothing`).
    ``stderr``: :data:`MERGED` (into the output too), a file for it, or ``None`` (this process's);
    ``env``: the child's environment (default: :func:`deepnmt_fairseq.console.child_env`).  Raises
    :class:`GenerateError` when the command fails; the partial output is then kept."""
    from ..console import child_env, exe

    first = str(argv[0])
    cmd = [first if os.sep in first else exe(first), *[str(a) for a in argv[1:]]]
    out = Path(out)
    err_file = Path(stderr) if isinstance(stderr, (str, os.PathLike)) else None
    try:
        with complete_or_nothing(out) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                if err_file is not None:
                    with open(err_file, "w", encoding="utf-8") as e:
                        rc = subprocess.run(cmd, stdout=f, stderr=e, env=env or child_env()).returncode
                else:
                    rc = subprocess.run(cmd, stdout=f, stderr=stderr, env=env or child_env()).returncode
            if rc != 0:
                raise _Failed(rc)
    except _Failed as failed:
        where = err_file if err_file is not None else partial_path(out)
        tail = where.read_text(encoding="utf-8", errors="replace")[-3000:] if where.exists() else ""
        raise GenerateError(failed.rc, where, tail, Path(str(argv[0])).name) from None
    return out


class _Failed(Exception):
    def __init__(self, rc: int):
        self.rc = rc
