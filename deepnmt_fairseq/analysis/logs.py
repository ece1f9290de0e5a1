"""Read fairseq training logs: ``--log-format json`` lines, tensorboard event files, the
``--log-format simple`` statistics lines (:func:`parse_curves`) and the lines fairseq-train prints
once (:func:`parse_train_log`).  The project's one reader of them: ``deepnmt-plot``,
``deepnmt-repro`` (figures and results) and the evidence study (study/run.py).

A *run* is a list of records ``{"tag": "train_inner" | "train" | "valid" | ..., key: float}``.

JSON logs: fairseq prints one JSON object per line, after the logging prefix
``DATE | INFO | TAG | {...}`` (train.log, or a capture of stdout/stderr); values
are strings (``"0.123456"``), converted here to floats.  Lines that are not
fairseq statistics are ignored, so whole console captures can be given.

Tensorboard (``--tensorboard-logdir DIR``): fairseq writes one sub-directory per
tag (``DIR/train_inner``, ``DIR/valid``...) with the step = number of updates.
Reading them needs the ``tensorboard`` package (optional); without it a clear
error says so.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

_LINE_RE = re.compile(r"^(?:.*?\|\s*(?P<tag>[\w.\-]+)\s*\|\s*)?(?P<json>\{.*\})\s*$")
TB_PREFIX = "events.out.tfevents"

Record = Dict[str, object]


class LogError(ValueError):
    """A log that cannot be read or lacks what a plot needs."""


def _to_float(v) -> Optional[float]:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _infer_tag(obj: dict) -> str:
    keys = [k for k in obj if k not in ("epoch", "update")]
    if keys and all(k.startswith("valid_") for k in keys):
        return "valid"
    if keys and all(k.startswith("train_") for k in keys):
        return "train"
    return "train_inner"


def parse_json_lines(lines: Iterable[str]) -> List[Record]:
    """Records of every fairseq JSON statistics line in ``lines``."""
    out: List[Record] = []
    for line in lines:
        line = line.rstrip("\n")
        if "{" not in line:
            continue
        m = _LINE_RE.match(line)
        if not m:
            continue
        try:
            obj = json.loads(m.group("json"))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        tag = m.group("tag")
        if tag in (None, "INFO", "WARNING", "DEBUG", "ERROR"):
            tag = _infer_tag(obj)
        rec: Record = {"tag": tag}
        for k, v in obj.items():
            f = _to_float(v)
            if f is not None:
                rec[k] = f
        out.append(rec)
    return out


def read_json_log(path: str) -> List[Record]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_json_lines(f)


def series(records: Iterable[Record], key: str, tag: str = "train_inner",
           updates: str = "num_updates") -> List[Tuple[int, float]]:
    """(update, value of ``key``) of the ``tag`` records that have both ``key`` and the update count
    ``updates`` (fairseq prefixes it in the ``valid`` lines: ``valid_num_updates``), by update; an
    update logged twice (a resumed run) keeps its last value."""
    points = {int(r[updates]): float(r[key]) for r in records
              if r.get("tag") == tag and updates in r and key in r}
    return sorted(points.items())


def _tb_dirs(root: str) -> List[str]:
    found = []
    for d, _sub, files in os.walk(root):
        if any(f.startswith(TB_PREFIX) for f in files):
            found.append(d)
    return sorted(found)


def read_tensorboard(path: str) -> List[Record]:
    """Records from tensorboard event files under ``path`` (a log dir, a tag dir or one event file)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        raise LogError(
            f"{path} holds tensorboard event files, but the 'tensorboard' package is not installed "
            f"(pip install tensorboard), or give the JSON log (--log-format json) instead"
        ) from e
    if os.path.isfile(path):
        dirs, root = [os.path.dirname(path) or "."], os.path.dirname(os.path.dirname(path) or ".")
    else:
        dirs, root = _tb_dirs(path), path
    out: List[Record] = []
    for d in dirs:
        rel = os.path.relpath(d, root)
        tag = "train_inner" if rel in (".", "") else rel.replace(os.sep, "/")
        acc = EventAccumulator(d, size_guidance={"scalars": 0})
        acc.Reload()
        by_step: Dict[int, Record] = {}
        for key in acc.Tags().get("scalars", []):
            for ev in acc.Scalars(key):
                rec = by_step.setdefault(int(ev.step), {"tag": tag, "num_updates": float(ev.step)})
                rec[key] = float(ev.value)
        out.extend(by_step[s] for s in sorted(by_step))
    return out


def read_run(path: str) -> List[Record]:
    """Records of a run: a JSON log file, a tensorboard event file, or a directory holding either
    (tensorboard files anywhere below it, else ``*.log`` files directly in it)."""
    if not os.path.exists(path):
        raise LogError(f"no such log file or directory: {path}")
    if os.path.isfile(path):
        if os.path.basename(path).startswith(TB_PREFIX):
            return read_tensorboard(path)
        recs = read_json_log(path)
        if not recs:
            raise LogError(f"{path} has no fairseq JSON statistics lines: train with --log-format json "
                           f"and give its log (train.log or the captured output)")
        return recs
    if _tb_dirs(path):
        return read_tensorboard(path)
    logs = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".log"))
    recs: List[Record] = []
    for lp in logs:
        recs.extend(read_json_log(lp))
    if not recs:
        raise LogError(f"{path} holds neither tensorboard event files nor *.log files with fairseq JSON "
                       f"statistics (--log-format json)")
    return recs


def run_label(path: str) -> str:
    """A short name for a run: the file name without extension, or the directory's name;
    ``train.log``-like generic names take their directory's name."""
    p = os.path.normpath(path)
    base = os.path.basename(p)
    stem = os.path.splitext(base)[0]
    if os.path.isdir(p) or base.startswith(TB_PREFIX) or stem in ("train", "log", "stdout", "stderr", "out"):
        parent = p if os.path.isdir(p) else os.path.dirname(p)
        return os.path.basename(os.path.abspath(parent)) or stem
    return stem


def diagnostics(records: List[Record], pattern: str) -> Tuple[List[float], Dict[str, List[float]]]:
    """(updates, {key: values}) of the keys matching the regex ``pattern`` in the per-update lines.

    The x value is ``diag_update`` (the update the diagnostics were computed at), else
    ``num_updates``.  One point per update (the last line wins); missing values are NaN.
    """
    rx = re.compile(pattern)
    inner = [r for r in records if r.get("tag") == "train_inner"] or [
        r for r in records if r.get("tag") not in ("train", "valid")
    ]
    points: Dict[float, Dict[str, float]] = {}
    for r in inner:
        vals = {k: v for k, v in r.items() if k != "tag" and rx.fullmatch(k)}
        if not vals:
            continue
        x = r.get("diag_update", r.get("num_updates"))
        if x is None:
            continue
        points.setdefault(float(x), {}).update(vals)
    keys = sorted({k for v in points.values() for k in v}, key=natural_key)
    xs = sorted(points)
    return xs, {k: [points[x].get(k, math.nan) for x in xs] for k in keys}


def natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


# ------------------------------------------------------------- --log-format simple (and json)
_NUM = r"([-+0-9.eE,]+|inf|nan)"
_SIMPLE_EPOCH = re.compile(r"\| (train|valid) \| epoch \d+ \|(.*)$")
_SIMPLE_INNER = re.compile(r"\| train_inner \| epoch \d+:\s+\d+ / \d+ (.*)$")


def _kv_bars(text: str) -> Dict[str, float]:
    out = {}
    for part in text.split("|"):
        m = re.match(rf"\s*([a-z_0-9]+) {_NUM}\s*$", part.strip() + " ") if part.strip() else None
        if m:
            try:
                out[m.group(1)] = float(m.group(2).replace(",", ""))
            except ValueError:
                pass
    return out


def _kv_commas(text: str) -> Dict[str, float]:
    out = {}
    for m in re.finditer(rf"([a-z_0-9]+)={_NUM}", text):
        try:
            out[m.group(1)] = float(m.group(2).replace(",", "").rstrip(","))
        except ValueError:
            pass
    return out


def parse_curves(text: str) -> Dict[str, List[Tuple[float, float]]]:
    """(num_updates, value) series from a fairseq-train log: ``train_ppl``/``train_loss`` (every
    logging interval and epoch), ``valid_ppl``/``valid_loss`` (every validation).  Reads the simple
    format (``| train | epoch 001 | loss 9.9 | ... | num_updates 4``, ``train_inner ... loss=...``) and
    json lines (``{"epoch": 1, "train_loss": ..., "train_num_updates": ...}``)."""
    out: Dict[str, Dict[float, float]] = {}

    def put(kind: str, stats: Dict[str, float]):
        n = stats.get("num_updates")
        if n is None:
            return
        for k in ("ppl", "loss"):
            if k in stats:
                out.setdefault(f"{kind}_{k}", {})[n] = stats[k]

    for line in text.splitlines():
        line = line.rstrip()
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line[line.index("{"):])
            except ValueError:
                continue
            for kind in ("train", "valid", "train_inner"):
                stats = {k[len(kind) + 1:]: v for k, v in obj.items() if k.startswith(kind + "_")}
                stats = {k: float(v) for k, v in stats.items() if isinstance(v, (int, float, str))
                         and re.fullmatch(_NUM, str(v))}
                put("valid" if kind == "valid" else "train", stats)
            continue
        m = _SIMPLE_EPOCH.search(line)
        if m:
            put(m.group(1), _kv_bars(m.group(2)))
            continue
        m = _SIMPLE_INNER.search(line)
        if m:
            put("train", _kv_commas(m.group(1)))
    return {k: sorted(v.items()) for k, v in out.items()}


def last_value(text: str, metric: str) -> Optional[float]:
    points = parse_curves(text).get(metric) or []
    return points[-1][1] if points else None


# ------------------------------------------------------------- what fairseq-train prints once
_PARAMS = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")
_DONE = re.compile(r"done training in ([\d.]+) seconds")
_VALID_PPL = re.compile(r"valid on 'valid' subset \|.*?\| ppl ([\d.]+)")


def parse_train_log(text: str) -> Dict[str, Optional[float]]:
    """Model size, training time and best validation perplexity from a fairseq-train log."""
    params = _PARAMS.findall(text)
    seconds = [float(s) for s in _DONE.findall(text)]
    ppl = [float(p) for p in _VALID_PPL.findall(text)]
    n = int(params[-1].replace(",", "")) if params else None
    return {
        "params": n,
        "params_m": round(n / 1e6, 2) if n is not None else None,
        "train_seconds": sum(seconds) if seconds else None,
        "valid_ppl": min(ppl) if ppl else None,
    }
