"""Read the scalars of ``--tensorboard-logdir`` event files without the ``tensorboard`` package.

fairseq writes one folder per tag under the log dir (``train_inner``, ``train``, ``valid``, ...),
each holding ``events.out.tfevents.*`` files, with the number of updates as the step.  An event
file is a TFRecord file: records of ``uint64 length | uint32 masked CRC-32C of the length |
data | uint32 masked CRC-32C of the data`` (little-endian), each ``data`` an ``Event``
protobuf.  The protobuf classes and the CRC come from tensorboardX (a dependency of the
project; fairseq writes with it when ``tensorboard`` is not installed).  Files written by
``torch.utils.tensorboard`` have the same format.
"""

from __future__ import annotations

import os
import struct
from typing import Dict, Iterator, List, Tuple

TB_PREFIX = "events.out.tfevents"

#: {tag folder (relative to the log dir, "." for the log dir itself): {scalar: [(step, value), ...]}}
Scalars = Dict[str, Dict[str, List[Tuple[int, float]]]]


class EventFileError(ValueError):
    """A truncated or corrupt event file."""


def _masked_crc(data: bytes) -> int:
    from tensorboardX.crc32c import crc32c

    x = crc32c(data) & 0xFFFFFFFF
    return ((((x >> 15) | (x << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(path: str, check_crc: bool = True) -> Iterator[bytes]:
    """The data of every record of one event file.  A record cut short at the end of the file
    (a writer still running) ends the iteration; a wrong checksum raises EventFileError."""
    with open(path, "rb") as f:
        blob = f.read()
    pos = 0
    while pos + 12 <= len(blob):
        header = blob[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if check_crc and header_crc != _masked_crc(header):
            raise EventFileError(f"{path}: bad length checksum of the record at byte {pos}")
        end = pos + 12 + length + 4
        if end > len(blob):
            return
        data = blob[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", blob[end - 4:end])
        if check_crc and data_crc != _masked_crc(data):
            raise EventFileError(f"{path}: bad data checksum of the record at byte {pos}")
        yield data
        pos = end


def events(path: str, check_crc: bool = True):
    """The ``Event`` protobufs of one event file, in file order."""
    from tensorboardX.proto import event_pb2

    for data in records(path, check_crc):
        ev = event_pb2.Event()
        ev.ParseFromString(data)
        yield ev


def event_files(logdir: str) -> List[str]:
    """Every event file under ``logdir`` (or ``[logdir]`` for one file), sorted by path."""
    if os.path.isfile(logdir):
        return [logdir]
    found = []
    for d, _sub, files in os.walk(logdir):
        found += [os.path.join(d, f) for f in files if f.startswith(TB_PREFIX)]
    return sorted(found)


def read_scalars(logdir: str) -> Scalars:
    """Every scalar under ``logdir``, by tag folder and name, as (step, value) in file order."""
    root = logdir if os.path.isdir(logdir) else os.path.dirname(logdir)
    out: Scalars = {}
    for path in event_files(logdir):
        folder = os.path.relpath(os.path.dirname(path), root).replace(os.sep, "/")
        table = out.setdefault(folder, {})
        for ev in events(path):
            if not ev.HasField("summary"):
                continue
            for v in ev.summary.value:
                if v.HasField("simple_value"):
                    value = float(v.simple_value)
                elif v.HasField("tensor") and len(v.tensor.float_val) == 1:
                    value = float(v.tensor.float_val[0])
                else:
                    continue  # text, histograms, images
                table.setdefault(v.tag, []).append((int(ev.step), value))
    return out
