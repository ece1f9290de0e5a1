"""The archives of a corpus: found in ``--from-dir`` or the download cache, downloaded
(resumable, URL fallbacks), checksummed, and read member by member in one streaming pass."""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import http.client
import lzma
import os
import tarfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from .common import DataPrepError, Log, Progress


def hash_file(path: Path, log: Log | None = None) -> dict:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    size = path.stat().st_size
    prog = Progress(log, f"checksum {path.name}", "MB") if log and size > 200 * 2**20 else None
    with open(path, "rb") as f:
        while True:
            b = f.read(2**22)
            if not b:
                break
            sha.update(b)
            md5.update(b)
            if prog:
                prog.add(len(b) // 2**20)
    return {"size": size, "sha256": sha.hexdigest(), "md5": md5.hexdigest()}


def archive_candidates(arch) -> list:
    return [arch.filename, *arch.also_named]


def locate_archive(arch, from_dir: Path | None, downloads: Path):
    """(path or None, origin).  --from-dir first, then the download cache."""
    if from_dir is not None:
        for c in archive_candidates(arch):
            if (from_dir / c).is_file():
                return from_dir / c, "from-dir"
    if (downloads / arch.filename).is_file():
        return downloads / arch.filename, "cache"
    return None, "missing"


def download(arch, dest: Path, log: Log, timeout: float = 60.0) -> str:
    """Download ``arch`` to ``dest`` atomically (``dest.part`` then rename), resuming a
    previous ``.part`` with an HTTP Range request when the server allows it.  Tries the
    URLs in order; returns the URL used."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    errors = []
    with open(dest.with_name(dest.name + ".lock"), "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if dest.is_file():      # another process finished it while we waited
            return "(downloaded by another process)"
        for url in arch.urls:
            try:
                _download_one(url, part, log, timeout)
            except urllib.error.HTTPError as e:
                errors.append(f"{url}: HTTP {e.code} {e.reason}")
                continue
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
                reason = getattr(e, "reason", e)
                errors.append(f"{url}: {reason}")
                continue
            os.replace(part, dest)
            return url
    names = " or ".join(archive_candidates(arch))
    raise DataPrepError(
        f"could not download {arch.filename} ({arch.description}):\n  " + "\n  ".join(errors) +
        f"\nNo network here?  Download it on a machine with internet access (URLs above), put it in a "
        f"directory as {names} and pass --from-dir DIR.  A partial download is kept in {part} and resumed "
        "on the next attempt.")


def _download_one(url: str, part: Path, log: Log, timeout: float) -> None:
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "deepnmt-prepare-data/1"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:      # nothing left to fetch, or a stale .part: start again
            part.unlink()
            return _download_one(url, part, log, timeout)
        raise
    with resp:
        if have and resp.status == 206:
            mode, start = "ab", have
            log(f"resuming {url} at {have:,} bytes")
        else:
            mode, start = "wb", 0
            log(f"downloading {url}")
        length = resp.headers.get("Content-Length")
        total = start + int(length) if length is not None else None
        prog = Progress(log, f"download {part.name[:-5]}", "MB")
        got = start
        with open(part, mode) as out:
            while True:
                b = resp.read(2**20)
                if not b:
                    break
                out.write(b)
                got += len(b)
                prog.set(got // 2**20)
    if total is not None and got != total:
        raise OSError(f"connection closed after {got:,} of {total:,} bytes (kept for resuming)")
    prog.done()


class ArchiveReader:
    """Reads the wanted members of one tar archive in a single streaming pass."""

    def __init__(self, path: Path, arch):
        self.path, self.arch = path, arch

    def read(self, wanted: dict, handle) -> None:
        """``wanted``: member suffix -> gz flag.  ``handle(suffix, binary_stream)`` is called
        once per wanted member.  Errors name the archive and the member."""
        found, seen = {}, []
        try:
            with tarfile.open(self.path, mode="r|*") as tar:
                for m in tar:
                    seen.append(m.name)
                    if not m.isfile():
                        continue
                    for suffix, gz in wanted.items():
                        if m.name == suffix or m.name.endswith("/" + suffix):
                            if suffix in found:
                                raise DataPrepError(
                                    f"archive {self.path} has two members matching {suffix!r}: "
                                    f"{found[suffix]} and {m.name}")
                            found[suffix] = m.name
                            f = tar.extractfile(m)
                            stream = gzip.GzipFile(fileobj=f, mode="rb") if gz else f
                            handle(suffix, stream, f"{self.path.name}:{m.name}")
                            break
        except DataPrepError:
            raise
        except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as e:
            raise self._corrupt(e) from None
        except OSError as e:
            if e.errno is not None:     # a real I/O error (disk full, ...), not bad archive data
                raise
            raise self._corrupt(e) from None
        missing = [s for s in wanted if s not in found]
        if missing:
            sample = ", ".join(seen[:12]) + (" ..." if len(seen) > 12 else "")
            raise DataPrepError(
                f"archive {self.path} lacks the expected member(s) {', '.join(missing)} "
                f"(it has {len(seen)} entries: {sample or 'none'}). Is it the right file ({self.arch.description})? "
                "A truncated download can also end early: delete it and download again.")

    def _corrupt(self, e) -> DataPrepError:
        return DataPrepError(
            f"archive {self.path} is truncated or corrupt ({type(e).__name__}: {e}). Delete it and download "
            f"it again ({' or '.join(self.arch.urls)}).")
