"""Shared test helpers for the corpora read from Debian packages
(deepnmt_data.libreoffice_help, deepnmt_data.evidence_corpus): tiny synthetic
.deb files (ar archive + control.tar.xz + data.tar.xz in the real layout) and
reading the .gz output.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ar_archive(members: list[tuple[str, bytes]]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        header = (f"{name:<16}" f"{0:<12}" f"{0:<6}" f"{0:<6}" f"{'100644':<8}"
                  f"{len(data):<10}").encode("ascii") + b"`\n"
        assert len(header) == 60
        out += header + data
        if len(data) % 2:
            out += b"\n"
    return bytes(out)


def tar_xz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_deb(path: Path, control: str, data: dict[str, bytes]) -> Path:
    """A .deb at ``path`` with the control file text ``control`` and the data
    files ``data`` (path in the package -> contents)."""
    path.write_bytes(ar_archive([
        ("debian-binary", b"2.0\n"),
        ("control.tar.xz", tar_xz({"control": control.encode()})),
        ("data.tar.xz", tar_xz(data)),
    ]))
    return path


def read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def read_pairs(out: Path, split: str) -> list[tuple[str, str]]:
    en, de = read_gz(out / f"{split}.en.gz"), read_gz(out / f"{split}.de.gz")
    assert len(en) == len(de)
    return list(zip(en, de))


def assert_same_files(a: Path, b: Path) -> list[str]:
    """Two output directories hold the same file names with byte-identical contents; returns the names."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    return names
