"""Small helpers that run fairseq's installed CLIs the way a user does.

``run_cli`` starts ``fairseq-train`` & co. as subprocesses (a user's view);
``build_model`` gives an in-process model for unit tests.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "deepnmt_fairseq")

_WORDS = "the a cat dog sees eats big small red blue house tree runs jumps over under near far".split()


def make_parallel_text(path: Path, n_train=120, n_valid=12, n_test=10, seed=1):
    """A tiny synthetic 'translation' task (target = reversed, slightly mapped source)."""
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)

    def sent():
        return [rng.choice(_WORDS) for _ in range(rng.randint(3, 9))]

    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        src, tgt = [], []
        for _ in range(n):
            s = sent()
            src.append(" ".join(s))
            tgt.append(" ".join(w.upper() for w in reversed(s)))
        (path / f"{split}.src").write_text("\n".join(src) + "\n")
        (path / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
    return path


def run_cli(cmd, *args, check=True, env=None, timeout=600, cwd=None, fork=None):
    """Run a console script of the current environment; returns CompletedProcess.

    fairseq-train, -generate, -preprocess and -validate are forked from the tests' warm interpreter
    of that script (tests/cli_zygote.py: its imports done once, about 6 CPU-seconds saved per
    command), unless ``fork=False``, the command's start-up environment differs from the warm
    interpreter's, or ``DEEPNMT_TEST_FORK=0``: then, as every other command, a fresh process.
    A test of what a command does at interpreter start-up (its import-time warnings) passes
    ``fork=False``."""
    exe = Path(sys.executable).with_name(cmd)
    full = [str(exe) if exe.exists() else cmd, *map(str, args)]
    base = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **os.environ}  # the test process's, single-threaded
    e = {**base, **(env or {})}  # with the call's own variables
    res = None
    if fork is not False and os.environ.get("DEEPNMT_TEST_FORK", "1") != "0":
        import tempfile

        import cli_zygote

        zygote = cli_zygote.get(full, base)  # started without a call's own variables
        if zygote is not None and zygote.can_run(e) and zygote.lock.acquire(blocking=False):
            try:
                with tempfile.TemporaryDirectory(prefix="run-cli-") as tmp:
                    res = zygote.run(full, e, cwd, timeout, Path(tmp))
            finally:
                zygote.lock.release()
    if res is None:
        res = subprocess.run(full, capture_output=True, text=True, env=e, timeout=timeout, cwd=cwd)
    if check and res.returncode != 0:
        raise AssertionError(
            f"{' '.join(full)} failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}"
        )
    return res


def preprocess(raw: Path, dest: Path):
    return preprocess_pair(raw, dest, "src", "tgt")


def preprocess_pair(raw: Path, dest: Path, src: str, tgt: str):
    run_cli(
        "fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", dest, "--joined-dictionary", "--workers", "1",
    )
    return dest


def tiny_model_flags(d=16, ffn=32, heads=2):
    return [
        "--encoder-embed-dim", d, "--decoder-embed-dim", d,
        "--encoder-ffn-embed-dim", ffn, "--decoder-ffn-embed-dim", ffn,
        "--encoder-attention-heads", heads, "--decoder-attention-heads", heads,
    ]


# in-process tiny models: width 16, shared embeddings; with dropout where a test needs it on
TINY = [*map(str, tiny_model_flags()), "--share-all-embeddings"]
TINY_DROPOUT = [*TINY, "--dropout", "0.1", "--attention-dropout", "0.1"]


def train(data_bin: Path, save_dir: Path, arch: str, extra=(), max_update=3, criterion=None):
    args = [
        data_bin, "--user-dir", USER_DIR, "--arch", arch, "--task", "translation",
        "--optimizer", "adam", "--lr", "0.001", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "10", "--max-tokens", "500", "--max-update", max_update,
        "--save-dir", save_dir, "--no-progress-bar", "--log-interval", "1", "--seed", "1",
        "--cpu", "--num-workers", "0", "--no-epoch-checkpoints",
        "--criterion", criterion or "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        *extra,
    ]
    return run_cli("fairseq-train", *args)


def generate(data_bin: Path, ckpt: Path, *extra, subset="test", beam=2, fork=None):
    return run_cli(
        "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", ckpt, "--gen-subset", subset,
        "--beam", beam, "--max-len-b", 20, "--batch-size", 8, "--cpu",
        "--required-batch-size-multiple", 1, *extra, fork=fork,
    )


def hypotheses(stdout: str):
    """{sentence id: hypothesis} from fairseq-generate output."""
    from deepnmt_fairseq.generate_output import parse_generate

    return parse_generate(stdout)["hyps"]


# ---------------------------------------------------------------- in-process
def build_model(arch="deepnmt_transformer", extra=(), vocab=40, seed=0):
    """An in-process model with a dummy vocabulary (no data needed)."""
    from deepnmt_fairseq.analysis.param_counts import build_model as _build

    torch.manual_seed(seed)
    return _build(arch, vocab, [str(a) for a in extra])


def incremental_decode(model, src, lens, tgt):
    """Decoder outputs ``(B, T, V)`` computed one target position at a time with an
    incremental state (what beam search does), to compare with the full forward pass."""
    enc = model.encoder(src, lens)
    state = {}
    steps = [model.decoder(tgt[:, : t + 1], encoder_out=enc, incremental_state=state)[0] for t in range(tgt.size(1))]
    return torch.cat(steps, 1)


def random_batch(model, bsz=3, src_len=7, tgt_len=6, seed=0, pad_last=True):
    """src_tokens, src_lengths and prev_output_tokens of a random batch; the last
    sentence is shorter and left-padded, like fairseq's translation task pads sources
    (``left_pad_source=True``)."""
    g = torch.Generator().manual_seed(seed)
    d = model.encoder.dictionary
    nspecial = d.nspecial
    V = len(d)
    src = torch.randint(nspecial, V, (bsz, src_len), generator=g)
    lengths = torch.full((bsz,), src_len, dtype=torch.long)
    if pad_last and bsz > 1:
        cut = max(2, src_len - 3)
        src[-1, : src_len - cut] = d.pad()  # left padding (fairseq default)
        lengths[-1] = cut
    src[:, -1] = d.eos()
    tgt = torch.randint(nspecial, V, (bsz, tgt_len), generator=g)
    tgt[:, 0] = d.eos()
    return src, lengths, tgt
