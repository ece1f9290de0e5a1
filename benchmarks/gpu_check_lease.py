#!/usr/bin/env python
"""benchmarks/gpu_check.py on the workplace's lent GPU machine, split into calls that fit its lease
(issue 82 §1): 64 MiB per call for the checkout *and* the carried paths, 10 minutes per command,
15 minutes of device time per session (a machine's start included), Python 3.12 + CUDA torch +
pyyaml there, no fairseq, no network.  On your own GPU node none of this is needed:
``python benchmarks/gpu_check.py``.

    python benchmarks/gpu_check_lease.py pack     # here, once: the packs -> .lease/ (checks their sizes)
    python benchmarks/gpu_check_lease.py sizes    # what each call carries, in MiB (tracked files + packs)
    python benchmarks/gpu_check_lease.py calls    # the calls: command, carry, timeout_s (markdown)
    python3 benchmarks/gpu_check_lease.py setup P..   # there, first thing of a call: unpack the packs P

The packs are the wheels' *installed files* in xz tarballs (a wheel is a deflate zip; xz -9e of its
content is about half the size): ``fairseq`` = ve-fairseq 0.12.3 (cp312, its bundled ``fairseq/examples``
left out: nothing imports them) + hydra-core, omegaconf, antlr4, bitarray; ``ct2`` = ctranslate2 4.8.5
(its PyPI wheel is the CUDA build).  ``setup`` unpacks them into /tmp/site and writes a shim per console
script (fairseq-train, deepnmt-*) into /tmp/site/bin, so nothing is pip-installed there.

The calls, in the order the issue asks (what matters first): the deep rows' fp16/bf16 health; memory
and speed (throughput, activation checkpointing); DDP and the decoding invariants; DESDAR and
CTranslate2 on CUDA last, in their own call (the only one carrying the ct2 pack).  Each call's budget
leaves its timeout a margin for the setup and the report; two calls fit one session's 15 minutes.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
PACK_DIR = ".lease"  # ignored (.gitignore): carried by name
SITE = "/tmp/site"
MIB = 2 ** 20
LEASE_MIB = 64.0  # the device tool's limit per call: checkout (tracked + untracked-not-ignored) + carry
LIMIT_MIB = 60.0  # what a call may plan for: the lease less a margin for untracked files and growth

PLATFORMS = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
             "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64",
             "--platform", "manylinux2014_x86_64"]


@dataclass(frozen=True)
class Pack:
    name: str
    wheels: Tuple[str, ...]  # pip requirement strings (binary wheels for cp312 manylinux x86-64)
    sdist_wheels: Tuple[str, ...]  # built here with `pip wheel` (no binary on PyPI)
    exclude: Tuple[str, ...]  # path prefixes of the wheels' content left out
    mib: float  # size of .lease/<name>.tar.xz as measured 2026-12-04; `pack` refuses a pack above mib + 0.5

    @property
    def file(self) -> str:
        return f"{PACK_DIR}/{self.name}.tar.xz"


PACKS: Dict[str, Pack] = {
    "fairseq": Pack("fairseq", ("ve-fairseq==0.12.3", "hydra-core==1.3.2", "omegaconf==2.3.0", "bitarray==3.12.3"),
                    ("antlr4-python3-runtime==4.9.3",), ("fairseq/examples/",), 6.0),  # pack measured 2026-12-04: 5.97 MiB
    "ct2": Pack("ct2", ("ctranslate2==4.8.5",), (), (), 23.43),  # xz -9e: 24,559,380 bytes
}


@dataclass(frozen=True)
class Call:
    name: str
    sections: Tuple[str, ...]
    packs: Tuple[str, ...]
    budget: int  # gpu_check.py --budget (s)
    timeout_s: int  # the run tool's timeout_s: budget + setup (~40 s) + report + margin
    extra: Tuple[str, ...] = ()
    why: str = ""

    @property
    def carry(self) -> List[str]:
        return [PACKS[p].file for p in self.packs]

    def command(self) -> str:
        args = " ".join(["--sections", *self.sections, "--budget", str(self.budget), *self.extra])
        return (f"python3 benchmarks/gpu_check_lease.py setup {' '.join(self.packs)} && export PYTHONPATH={SITE}:$PWD "
                f"PATH={SITE}/bin:$PATH PYTHONUNBUFFERED=1 && timeout {self.budget + 60} python3 benchmarks/gpu_check.py "
                f"{args} --out \"$OUT/{self.name}\" 2>&1 | tee \"$OUT/{self.name}.log\"")


CALLS: Tuple[Call, ...] = (
    Call("1-health", ("health",), ("fairseq",), 240, 360, ("--health-parallel", "14"),
         "fairseq-train --fp16 and --bf16 of the 7 deepest rows at their paper's shapes, all 14 at once"),
    Call("2-memory-speed", ("throughput", "checkpointing"), ("fairseq",), 240, 360, (),
         "training tokens/s, peak memory, decoding speed vs stock fairseq; MSC-72 with/without checkpointing"),
    Call("3-ddp-correctness", ("ddp", "correctness"), ("fairseq",), 240, 360, (),
         "two gloo ranks on the one GPU (c10d, legacy_ddp) and the decoding invariants on CUDA"),
    Call("4-desdar-ct2", ("desdar", "ct2"), ("fairseq", "ct2"), 240, 360, (),
         "DESDAR 48-1 vs 48-6 decoding; the served student through CTranslate2 float16/int8 on CUDA"),
)


# ------------------------------------------------------------------------------ sizes
def tracked_bytes(repo: Path = REPO) -> int:
    """Bytes of the tracked files of the checkout (what every call sends)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True).stdout
    total = 0
    for name in out.decode().split("\0"):
        if name:
            p = repo / name
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total


def call_mib(call: Call, tracked: int) -> float:
    """What ``call`` sends: the tracked checkout plus its packs at their recorded sizes (MiB)."""
    return tracked / MIB + sum(PACKS[p].mib for p in call.packs)


def sizes(repo: Path = REPO) -> Dict[str, float]:
    tracked = tracked_bytes(repo)
    return {c.name: round(call_mib(c, tracked), 1) for c in CALLS}


# ------------------------------------------------------------------------------ pack (here)
def _xz_tar(src: Path, dest: Path, exclude: Sequence[str]) -> None:
    def keep(info: tarfile.TarInfo):
        rel = info.name[2:] if info.name.startswith("./") else info.name
        return None if any(rel.startswith(e) or rel + "/" == e for e in exclude) else info

    tmp = dest.with_suffix(".tmp")
    with lzma.open(tmp, "wb", preset=9 | lzma.PRESET_EXTREME) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        tar.add(str(src), arcname=".", filter=keep)
    os.replace(tmp, dest)


def pack(names: Sequence[str], python: str = sys.executable) -> int:
    (REPO / PACK_DIR).mkdir(exist_ok=True)
    bad = []
    for name in names:
        pk = PACKS[name]
        with tempfile.TemporaryDirectory(prefix=f"lease-{name}-") as tmp:
            wheels, content = Path(tmp) / "whl", Path(tmp) / "content"
            subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *PLATFORMS,
                            "-d", str(wheels), *pk.wheels], check=True)
            if pk.sdist_wheels:
                subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), *pk.sdist_wheels],
                               check=True)
            for whl in sorted(wheels.glob("*.whl")):
                with zipfile.ZipFile(whl) as z:
                    z.extractall(content)
            _xz_tar(content, REPO / pk.file, pk.exclude)
        mib = (REPO / pk.file).stat().st_size / MIB
        print(f"{pk.file}: {mib:.2f} MiB (recorded {pk.mib:.2f})")
        if mib > pk.mib + 0.5:
            bad.append(f"{pk.file} is {mib:.2f} MiB, above the {pk.mib:.2f} MiB the calls were sized with: update "
                       f"PACKS[{name!r}].mib in benchmarks/gpu_check_lease.py and rerun its size test")
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


# ------------------------------------------------------------------------------ setup (there)
def _console_scripts(site: Path) -> Dict[str, str]:
    """name -> 'module:function' of the packs' dist-info entry points and of this checkout's pyproject."""
    import configparser

    found: Dict[str, str] = {}
    for ep in site.glob("*.dist-info/entry_points.txt"):
        cp = configparser.ConfigParser(interpolation=None)
        cp.optionxform = str  # keep the names' case
        cp.read(ep)
        if cp.has_section("console_scripts"):
            found.update(dict(cp.items("console_scripts")))
    try:
        import tomllib

        found.update(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
    except (ImportError, KeyError, OSError):  # pragma: no cover - Python < 3.11
        pass
    return found


def setup(names: Sequence[str], site: Path = Path(SITE)) -> int:
    site.mkdir(parents=True, exist_ok=True)
    for name in names:
        pk = PACKS[name]
        path = REPO / pk.file
        if not path.is_file():
            print(f"setup: {path} is missing: run `python benchmarks/gpu_check_lease.py pack` here first and "
                  f"name {pk.file} in the call's carry", file=sys.stderr)
            return 2
        with tarfile.open(path, "r:xz") as tar:
            tar.extractall(site, filter="data") if sys.version_info >= (3, 12) else tar.extractall(site)
    bin_dir = site / "bin"
    bin_dir.mkdir(exist_ok=True)
    for script, target in _console_scripts(site).items():
        module, _, func = target.partition(":")
        shim = bin_dir / script
        shim.write_text(f"#!/usr/bin/env bash\nexec \"{sys.executable}\" -c 'import sys; from {module} import "
                        f"{func.split('.')[0]} as m; sys.argv[0] = \"{script}\"; sys.exit(m())' \"$@\"\n")
        shim.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": f"{site}:{REPO}"}
    check = ("import torch, fairseq, deepnmt_fairseq; print('torch', torch.__version__, 'cuda', "
             "torch.cuda.is_available(), 'fairseq', fairseq.__version__)")
    if "ct2" in names:
        check += "; import ctranslate2; print('ctranslate2 cuda devices', ctranslate2.get_cuda_device_count())"
    return subprocess.run([sys.executable, "-W", "ignore", "-c", check], env=env).returncode


# ------------------------------------------------------------------------------ the calls
def calls_markdown(repo: Path = REPO) -> str:
    tracked = tracked_bytes(repo)
    rows = ["| call | sections | carry | timeout_s | MiB sent | what |", "|---|---|---|---|---|---|"]
    for c in CALLS:
        rows.append(f"| {c.name} | {', '.join(c.sections)} | `{json.dumps(c.carry)}` | {c.timeout_s} | "
                    f"{call_mib(c, tracked):.1f} | {c.why} |")
    out = ["\n".join(rows), ""]
    for c in CALLS:
        out += [f"{c.name}: `run` with carry `{json.dumps(c.carry)}`, timeout_s {c.timeout_s}, command:", "",
                f"    {c.command()}", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: download the wheels and write .lease/<pack>.tar.xz")
    p.add_argument("packs", nargs="*", choices=[[], *PACKS], default=[], help="default: all")
    p.add_argument("--python", default=sys.executable, help="the interpreter whose pip downloads")
    s = sub.add_parser("setup", help="there: unpack the packs into /tmp/site, console-script shims in /tmp/site/bin")
    s.add_argument("packs", nargs="+", choices=list(PACKS))
    sub.add_parser("sizes", help="MiB each call sends (tracked checkout + its packs)")
    sub.add_parser("calls", help="the calls as markdown (benchmarks/results/gpu/README.md)")
    a = ap.parse_args(argv)
    if a.cmd == "pack":
        return pack(a.packs or list(PACKS), a.python)
    if a.cmd == "setup":
        return setup(a.packs)
    if a.cmd == "sizes":
        for name, mib in sizes().items():
            print(f"{name}: {mib:.1f} MiB{'  OVER ' + str(LIMIT_MIB) if mib > LIMIT_MIB else ''}")
        return 0
    print(calls_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
