#!/usr/bin/env python
"""The command line of the project's one speed protocol (issue 78): whole commands, interleaved, pinned,
repeated, and a claim that is the lower bound of a bootstrap interval.  The protocol itself (its
calibration, interleaving, statistics and machine description) is the library's
:mod:`deepnmt_deploy.speed_protocol`, which deepnmt-distill's report uses too; this script only parses
arguments and writes records.

    # 1. a tuning pass: each setting of a fixed grid timed once (>= --min-seconds of work), the fastest
    #    recorded and then frozen (measure reads it; re-tuning is a new record)
    python benchmarks/speed_protocol.py tune --name student --out tune-student.json \\
        --command 'deepnmt-translate --model served --input test.src --output /dev/null --batch-size {batch}' \\
        --grid batch=4,8,16,32,64
    # 2. the measurement: reference and candidates interleaved (ref, cand, ref, cand, ...)
    python benchmarks/speed_protocol.py measure --out record.json --cores 0 --repeats 5 --min-seconds 10 \\
        --reference teacher 'fairseq-generate ... --batch-size 64' \\
        --candidate student 'deepnmt-translate ... --batch-size {batch}' --tuned student=tune-student.json
    # 3. the comparison of two records (a rerun must give lower bounds within 10%)
    python benchmarks/speed_protocol.py compare a.json b.json

What each record holds (``measure``): the machine (CPU model, its vector extensions from
``/proc/cpuinfo``, the cores the commands were pinned to), every timed run (wall seconds, CPU
seconds of the command and its children, the 1-minute load average before and after, the number of
back-to-back executions that made it >= ``--min-seconds`` of work), and per candidate the speed ratio
(reference wall / candidate wall for the same work) of each interleaved pair, their median, a
bootstrap 95% interval of the median (``BOOTSTRAP`` resamples of the pairs, seeded) and **the claim:
the interval's lower bound**.

Choices (the issue fixes the protocol, not these details): a repeat is one execution of the command,
or k back-to-back executions where one is shorter than ``--min-seconds`` (k from a warm-up run;
repeating the command rather than the input keeps any command usable, at the price of counting its
start-up k times, which the ratio then includes for both sides); pinning with ``os.sched_setaffinity``
in the child (Linux); the first two (warm-up) executions of every command are not timed.  It needs only
``deepnmt_deploy`` (standard library; no torch or fairseq): it runs on a serving machine too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Sequence

# the protocol, one place (the library); re-exported here for the command line and its tests
from deepnmt_deploy.speed_protocol import (BOOTSTRAP, CALIBRATION_MARGIN, CONFIDENCE, FORMAT, MIN_REPEATS,  # noqa: F401
                                           MIN_SECONDS, bootstrap_interval, executions_for, expand_grid, frozen,
                                           machine, measure, parse_cores, ratios, rerun_agreement, run_once,
                                           summarize, tune)


# ------------------------------------------------------------------------------ command line
def _grid(items: Sequence[str]) -> Dict[str, List[str]]:
    out = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not values:
            raise ValueError(f"--grid {item}: expected NAME=V1,V2,...")
        out[key] = values.split(",")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune", help="time every setting of a grid once; record the fastest")
    t.add_argument("--name", required=True)
    t.add_argument("--command", required=True, help="shell command with {NAME} fields of the grid")
    t.add_argument("--grid", nargs="+", required=True, metavar="NAME=V1,V2")
    t.add_argument("--out", required=True)
    m = sub.add_parser("measure", help="the reference and candidates, interleaved; the claims")
    m.add_argument("--reference", nargs=2, required=True, metavar=("NAME", "COMMAND"))
    m.add_argument("--candidate", nargs=2, action="append", required=True, metavar=("NAME", "COMMAND"))
    m.add_argument("--tuned", nargs="+", default=[], metavar="NAME=TUNE.json",
                   help="fill a system's {fields} from its tuning record's choice")
    m.add_argument("--repeats", type=int, default=MIN_REPEATS)
    m.add_argument("--out", required=True)
    c = sub.add_parser("compare", help="two records of the same measurement: do their claims agree within 10%%?")
    c.add_argument("records", nargs=2)
    for p in (t, m):
        p.add_argument("--min-seconds", type=float, default=MIN_SECONDS, help="work in one timed repeat")
        p.add_argument("--cores", help="pin every command to these cores (e.g. 0 or 0-1)")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "compare":
            agree = rerun_agreement(*(json.loads(Path(r).read_text()) for r in a.records))
            print(json.dumps(agree, indent=1))
            return 0 if agree and all(v["within_10_percent"] for v in agree.values()) else 1
        cores = parse_cores(a.cores)
        if a.cmd == "tune":
            rec = tune(a.name, a.command, _grid(a.grid), a.min_seconds, cores)
        else:
            tuned = {}
            for item in a.tuned:
                name, _, path = item.partition("=")
                tuned[name] = json.loads(Path(path).read_text())
            ref = (a.reference[0], frozen(a.reference[1], tuned.get(a.reference[0])))
            cands = [(n, frozen(cmd, tuned.get(n))) for n, cmd in a.candidate]
            rec = measure(ref, cands, a.repeats, a.min_seconds, cores)
            rec["tuned"] = {n: t["choice"] for n, t in tuned.items()}
            for name, res in rec["results"].items():
                print(f"{name} vs {ref[0]}: median {res['median']:.2f}x, 95% interval "
                      f"[{res['interval'][0]:.2f}, {res['interval'][1]:.2f}], claim {res['claim']:.2f}x")
    except (ValueError, RuntimeError, OSError) as e:
        print(f"speed_protocol: error: {e}", file=sys.stderr)
        return 2
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(a.out).with_suffix(".partial")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(a.out)
    print(f"[speed] record: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
