#!/usr/bin/env python
"""BLEU of the RPR-only model (exportable) next to GPKD's absolute + relative one (not exportable).

    PYTHONPATH=tests python benchmarks/rpr_only_bleu.py [--updates 400] [--out benchmarks/results]

Both are trained the same way (same seed, data, updates, width) on the repository's tiny
synthetic corpus (tests/fairseq_helpers.make_parallel_text: target = reversed, upper-cased
source), decoded with fairseq's search (beam 5); the RPR-only model is also exported to
CTranslate2 (float32 and int8) and decoded there.  A CPU-budget comparison: it says whether
dropping the absolute positions costs anything on a task that needs word order, not what it
costs on WMT.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

try:  # the tests' tiny models (tests/deploy_helpers.py, tests/fairseq_helpers.py): the same models the tests train
    from deploy_helpers import bleu, fairseq_generate, train_tiny
    from fairseq_helpers import make_parallel_text, preprocess, tiny_model_flags
except ImportError as e:
    sys.exit(f"benchmarks/rpr_only_bleu.py trains the tests' tiny models: run it with tests/ on the import path, "
             f"PYTHONPATH=tests python benchmarks/rpr_only_bleu.py ({e})")

ARCH = ["--encoder-layers", "4", "--decoder-layers", "2", "--rpr-max-relative-position", "4", "--dropout", "0.1"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=400)
    ap.add_argument("--dim", type=int, default=16, help="model width (FFN 2x, 2 heads at 16, 4 above)")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args(argv)
    from deepnmt_fairseq.deploy.export import export, load_model
    from deepnmt_deploy.translate import DeployedModel

    root = Path(tempfile.mkdtemp(prefix="rpr_bleu_"))
    data = preprocess(make_parallel_text(root / "raw", n_train=400, n_test=100), root / "bin")
    rows = {}
    for name, flags in (("absolute + relative (GPKD's RPR)", ARCH),
                        ("relative only (--no-token-positional-embeddings)", [*ARCH, "--no-token-positional-embeddings"])):
        width = [*map(str, tiny_model_flags(a.dim, 2 * a.dim, 2 if a.dim <= 16 else 4)), "--share-all-embeddings"]
        ckpt = train_tiny(data, root / f"{len(rows)}.pt", flags, updates=a.updates, width=width)
        model, cfg, task = load_model(str(ckpt))
        srcs, hyps, refs = fairseq_generate(model, task, beam=5, max_len_b=200)
        ids = sorted(hyps)
        row = {"fairseq": round(bleu([hyps[i] for i in ids], [refs[i] for i in ids]), 2)}
        if "only" in name:
            for q in ("float32", "int8"):
                out, _ = export(str(ckpt), str(root / q), q, force=True)
                ct = DeployedModel(out).translate_tokens([srcs[i].split() for i in ids], beam=5, max_len=200)
                row[f"ct2 {q}"] = round(bleu([" ".join(h) for h in ct], [refs[i] for i in ids]), 2)
        rows[name] = row
        print(name, row, flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "" if a.dim == 16 else f"-d{a.dim}"
    (out / f"rpr-only-bleu{tag}.json").write_text(
        json.dumps({"updates": a.updates, "dim": a.dim, "arch": ARCH, "rows": rows}, indent=1) + "\n")
    lines = ["# RPR-only vs absolute + relative positions (benchmarks/rpr_only_bleu.py)", "",
             f"Tiny synthetic corpus (400 training pairs, 100 test), 4-2 pre-norm, width {a.dim}, k = 4, {a.updates} "
             f"Adam updates, same seed; BLEU on subword tokens, beam 5. A CPU-budget check, not a WMT number.", "",
             "| positions | fairseq BLEU | CTranslate2 float32 | CTranslate2 int8 |", "|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['fairseq']} | {r.get('ct2 float32', 'not exportable')} | "
                     f"{r.get('ct2 int8', 'not exportable')} |")
    (out / f"rpr-only-bleu{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
