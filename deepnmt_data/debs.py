"""Reading Debian packages without dpkg, and writing a dataset built from them, for the corpora
made of the help pages the packages ship (:mod:`deepnmt_data.libreoffice_help`,
:mod:`deepnmt_data.evidence_corpus`).

A .deb is an ``ar`` archive (own reader) holding ``control.tar.*`` and ``data.tar.*``
(``tarfile``/``lzma``); :func:`read_deb_files` returns the text files under a prefix.
:func:`publish_dataset` writes the output directory all at once (temporary directory,
renamed into place), and the command-line helpers are shared by both commands.  Standard
library only.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path


class ExtractError(Exception):
    """A problem the user has to fix (missing/broken input, existing output)."""


# --------------------------------------------------------------------------
# .deb reading (ar archive + tar)
# --------------------------------------------------------------------------

AR_MAGIC = b"!<arch>\n"


def read_ar(data: bytes, origin: str = "<ar>") -> dict[str, bytes]:
    """Return the members of an ``ar`` archive (the .deb container)."""
    if not data.startswith(AR_MAGIC):
        raise ExtractError(f"{origin}: not an ar archive (bad magic); is it a .deb file?")
    members: dict[str, bytes] = {}
    pos = len(AR_MAGIC)
    while pos < len(data):
        if data[pos:pos + 1] == b"\n":  # stray padding byte
            pos += 1
            continue
        header = data[pos:pos + 60]
        if len(header) < 60:
            raise ExtractError(f"{origin}: truncated ar header at byte {pos}")
        if header[58:60] != b"`\n":
            raise ExtractError(f"{origin}: corrupt ar header at byte {pos}")
        name = header[0:16].decode("ascii", "replace").strip()
        if name.endswith("/") and name != "/":
            name = name[:-1]
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise ExtractError(f"{origin}: corrupt ar member size at byte {pos}") from None
        start = pos + 60
        end = start + size
        if end > len(data):
            raise ExtractError(
                f"{origin}: truncated: member {name!r} needs {size} bytes, "
                f"only {len(data) - start} present")
        members[name] = data[start:end]
        pos = end + (size % 2)
    return members


def _open_tar(blob: bytes, name: str, origin: str) -> tarfile.TarFile:
    if name.endswith(".xz"):
        mode = "r:xz"
    elif name.endswith(".gz"):
        mode = "r:gz"
    elif name.endswith(".tar"):
        mode = "r:"
    else:
        raise ExtractError(f"{origin}: unsupported compression of {name}")
    try:
        return tarfile.open(fileobj=io.BytesIO(blob), mode=mode)
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:
        raise ExtractError(f"{origin}: cannot open {name}: {exc}") from exc


def _member(members: dict[str, bytes], prefix: str, origin: str) -> tuple[str, bytes]:
    for name, blob in members.items():
        if name.startswith(prefix):
            return name, blob
    raise ExtractError(f"{origin}: no {prefix}* member; not a Debian package?")


def read_control(members: dict[str, bytes], origin: str) -> dict[str, str]:
    name, blob = _member(members, "control.tar", origin)
    try:
        with _open_tar(blob, name, origin) as tar:
            for info in tar:
                if info.name.lstrip("./") == "control" and info.isfile():
                    text = tar.extractfile(info).read().decode("utf-8")
                    break
            else:
                raise ExtractError(f"{origin}: control.tar has no control file")
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:
        raise ExtractError(f"{origin}: corrupt {name}: {exc}") from exc
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, value = line.split(":", 1)
            fields[key.strip()] = value.strip()
    return fields


@dataclass
class DebFiles:
    path: Path
    package: str
    version: str
    sha256: str
    size: int
    files: dict[str, str]  # relative path under the prefix -> text (here: HTML source)


def read_deb_files(path: Path, prefix: str, suffix: str,
                   missing: str | None = None) -> DebFiles:
    """Text files under ``prefix`` ending in ``suffix`` from a .deb (the
    LibreOffice help, and the GIMP help of :mod:`deepnmt_data.evidence_corpus`).  ``missing`` is the
    error message when there are none."""
    origin = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ExtractError(f"cannot read {path}: {exc}") from exc
    members = read_ar(data, origin)
    control = read_control(members, origin)
    name, blob = _member(members, "data.tar", origin)
    files: dict[str, str] = {}
    try:
        with _open_tar(blob, name, origin) as tar:
            for info in tar:
                member_path = info.name[2:] if info.name.startswith("./") else info.name
                if (info.isfile() and member_path.startswith(prefix)
                        and member_path.endswith(suffix)):
                    raw = tar.extractfile(info).read()
                    files[member_path[len(prefix):]] = raw.decode("utf-8", "replace")
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:
        raise ExtractError(f"{origin}: truncated or corrupt {name}: {exc}") from exc
    if not files:
        raise ExtractError(f"{origin}: " + (missing or f"no *{suffix} files under {prefix}"))
    return DebFiles(path=path, package=control.get("Package", "?"),
                    version=control.get("Version", "?"),
                    sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                    files=files)


def package_entry(p: DebFiles) -> dict:
    """The STATS.json record of one .deb."""
    return {"package": p.package, "version": p.version, "deb": p.path.name,
            "bytes": p.size, "sha256": p.sha256}


def find_pkg_deb(directory: Path, pkg: str) -> Path:
    found = sorted(directory.glob(f"{pkg}_*.deb"))
    if not found:
        raise ExtractError(f"no {pkg}_*.deb in {directory} "
                           f"(get it with: apt-get download {pkg}, or use --download)")
    if len(found) > 1:
        raise ExtractError(f"several {pkg}_*.deb in {directory}: "
                           + ", ".join(p.name for p in found) + "; keep only one")
    return found[0]


def download_packages(pkgs: list[str], directory: Path) -> None:
    try:
        subprocess.run(["apt-get", "download", *pkgs], cwd=directory, check=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise ExtractError("--download needs apt-get (Debian/Ubuntu); "
                           "download the packages elsewhere and use --debs DIR") from None
    except subprocess.CalledProcessError as exc:
        raise ExtractError(f"apt-get download {' '.join(pkgs)} failed:\n"
                           + exc.stderr.decode("utf-8", "replace")) from None


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

def write_gz_lines(path: Path, lines: list[str]) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                 compresslevel=9, mtime=0) as gz:
        for line in lines:
            if not line or "\n" in line or "\t" in line or "\r" in line:
                raise AssertionError(f"bad line {line!r}")  # libreoffice_help.normalise prevents this
            gz.write(line.encode("utf-8") + b"\n")


def publish_dataset(out: Path, force: bool, write_files, stats: dict, notice: str) -> None:
    """Write a dataset directory all at once: ``write_files(tmp)`` writes the data
    files into a fresh temporary directory next to ``out``; then
    ``stats["files"]`` gets the size and sha256 of its top-level *.gz files,
    STATS.json and NOTICE are written, and the directory is renamed to
    ``out`` (an existing ``out`` is replaced only if ``force``)."""
    out = out.resolve()
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
        write_files(tmp)
        files = {}
        for p in sorted(tmp.glob("*.gz")):
            files[p.name] = {"bytes": p.stat().st_size,
                             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        stats["files"] = files
        (tmp / "STATS.json").write_text(
            json.dumps(stats, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
            encoding="utf-8")
        (tmp / "NOTICE").write_text(notice, encoding="utf-8")
        # Move into place only now, so that a crash never leaves a complete-
        # looking dataset behind.
        if out.exists():
            if not force:
                raise ExtractError(f"{out} exists; use --force to replace it")
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.rename(out, old / out.name)
            os.rename(tmp, out)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def add_deb_source_args(ap: argparse.ArgumentParser, debs_help: str) -> None:
    """--debs DIR | --download."""
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--debs", type=Path, metavar="DIR", help=debs_help)
    where.add_argument("--download", action="store_true",
                       help="run 'apt-get download' for the packages into a temporary directory")


def checked_out_dir(args: argparse.Namespace) -> Path:
    """The resolved --out; an error if it exists and --force was not given."""
    out = args.out.resolve()
    if out.exists() and not args.force:
        raise ExtractError(f"{out} exists; use --force to replace it")
    return out


def deb_dir(args: argparse.Namespace, download_dir: str, download) -> Path:
    """Where the .deb files are: ``download_dir`` after ``download(it)`` with
    --download, else --debs DIR."""
    if args.download:
        debdir = Path(download_dir)
        download(debdir)
        return debdir
    if not args.debs.is_dir():
        raise ExtractError(f"--debs {args.debs}: not a directory")
    return args.debs


def run_reporting_errors(run, args: argparse.Namespace) -> dict | None:
    """``run(args)``; None after printing an ExtractError to stderr."""
    try:
        return run(args)
    except ExtractError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
