"""Results files for BLEU/parameters-vs-depth plots.

A results file is JSON: one object or a list of objects, each with at least

    {"experiment": "msc_iwslt_36l",          # name of the run
     "bleu": 29.1  or  "sacrebleu": 28.7,    # "bleu" is used when both are present
     "params": 28400000,                     # number of parameters
     "encoder_layers": 36, "decoder_layers": 6}

Optional keys: ``"series"`` (or ``"family"``) groups runs into one line (default:
the experiment name with every number replaced by ``N``, so ``msc_iwslt_36l``
and ``msc_iwslt_72l`` form the series ``msc_iwslt_Nl``).  Extra keys are kept.
Directories are searched recursively for ``results.json``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict, List

REQUIRED = ("experiment", "params", "encoder_layers", "decoder_layers")


def series_name(entry: Dict) -> str:
    for key in ("series", "family"):
        if entry.get(key):
            return str(entry[key])
    return re.sub(r"\d+", "N", str(entry["experiment"]))


def _check(entry, where: str) -> Dict:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    missing = [k for k in REQUIRED if k not in entry]
    if "bleu" not in entry and "sacrebleu" not in entry:
        missing.append("bleu or sacrebleu")
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)} (a results file needs experiment, "
                         f"bleu or sacrebleu, params, encoder_layers, decoder_layers)")
    e = dict(entry)
    e["bleu_value"] = float(e["bleu"] if e.get("bleu") is not None else e["sacrebleu"])
    e["params"] = float(e["params"])
    e["encoder_layers"] = int(e["encoder_layers"])
    e["decoder_layers"] = int(e["decoder_layers"])
    e["total_layers"] = e["encoder_layers"] + e["decoder_layers"]
    e["series_name"] = series_name(e)
    return e


def load_results(paths: List[str]) -> List[Dict]:
    files: List[str] = []
    for p in paths:
        if os.path.isdir(p):
            for d, _s, fs in os.walk(p):
                files += [os.path.join(d, f) for f in fs if f == "results.json"]
        elif os.path.exists(p):
            files.append(p)
        else:
            raise ValueError(f"no such results file or directory: {p}")
    if not files:
        raise ValueError(f"no results.json found in {' '.join(paths)}")
    out = []
    for f in sorted(files):
        with open(f, encoding="utf-8") as fh:
            try:
                obj = json.load(fh)
            except json.JSONDecodeError as e:
                raise ValueError(f"{f}: not valid JSON ({e})") from e
        entries = obj if isinstance(obj, list) else [obj]
        for i, entry in enumerate(entries):
            e = _check(entry, f if len(entries) == 1 else f"{f}[{i}]")
            e["source_file"] = f
            out.append(e)
    return out
