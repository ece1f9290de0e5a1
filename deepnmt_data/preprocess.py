"""The one ``fairseq-preprocess`` command: its arguments (:func:`preprocess_argv`) and its run in a
process of this interpreter (:func:`fairseq_preprocess`).  Every caller builds its binarization with
it: the small corpora (:mod:`.small_corpus`: the quickstart, the study, the GPKD pipeline),
``deepnmt-prepare-data`` (:mod:`.prepare.binarize`, in its own process), ``deepnmt-skd``'s SKD corpus,
the study's train sample and ``benchmarks/deep_stability.py``.

Nothing here imports torch or fairseq (``fairseq-preprocess`` runs as a process).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Callable, List, Mapping, Optional


def preprocess_argv(src: str, tgt: str, destdir, *, trainpref=None, validpref=None, testpref=None,
                    joined: bool = False, srcdict=None, tgtdict=None, nwords: Optional[int] = None,
                    workers: int = 1) -> List[str]:
    """``fairseq-preprocess``'s arguments, always in this order: the language pair, the splits' text
    prefixes (those given), ``--destdir``, ``--joined-dictionary``, given dictionaries, a vocabulary
    size for both sides (``nwords``), ``--workers``."""
    argv = ["--source-lang", src, "--target-lang", tgt]
    for flag, prefix in (("--trainpref", trainpref), ("--validpref", validpref), ("--testpref", testpref)):
        if prefix is not None:
            argv += [flag, str(prefix)]
    argv += ["--destdir", str(destdir)]
    if joined:
        argv.append("--joined-dictionary")
    for flag, path in (("--srcdict", srcdict), ("--tgtdict", tgtdict)):
        if path is not None:
            argv += [flag, str(path)]
    if nwords is not None:
        argv += ["--nwordssrc", str(nwords), "--nwordstgt", str(nwords)]
    return argv + ["--workers", str(workers)]


def fairseq_preprocess(argv: List[str], env: Optional[Mapping[str, str]] = None,
                       log: Optional[Callable[[str], None]] = print, quiet: bool = False) -> None:
    """``fairseq-preprocess ARGV`` in a process of this interpreter (its output on the console;
    ``quiet``: kept from it); ``log``: where the command line is said (None: nowhere).  Raises
    ``subprocess.CalledProcessError`` when it fails."""
    if log is not None:
        log("$ fairseq-preprocess " + " ".join(argv))
    subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", *argv], check=True,
                   env=None if env is None else dict(env), capture_output=quiet)
