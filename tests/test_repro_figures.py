"""The papers' figures as registry entries (deepnmt_fairseq/repro/figures.py; issue 13).

Log parsing on fairseq's own line formats, every figure's experiments in the registry, a
curve figure across the two stages of a run and a sweep figure from results.json, written
as PNG + CSV; the deep-decoder tables mark the values that are our choice.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from deepnmt_fairseq.repro import figures as F
from deepnmt_fairseq.repro import registry as reg

SIMPLE = """\
2026-11-23 12:23:01 | INFO | train_inner | epoch 001:      2 / 3 loss=10.5, nll_loss=10.4, ppl=1351.2, wps=500, num_updates=2, lr=1e-05
2026-11-23 12:23:09 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.901 | nll_loss 9.887 | ppl 946.53 | wps 16090.3 | num_updates 3 | best_loss 9.901
2026-11-23 12:23:14 | INFO | train | epoch 001 | loss 10.049 | nll_loss 10.044 | ppl 1055.7 | wps 539.6 | num_updates 3 | lr 0.00141421 | gnorm 0.621
2026-11-23 12:23:20 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 9.5 | nll_loss 9.4 | ppl 675.59 | num_updates 6
"""
JSON = ('{"epoch": 3, "train_loss": "9.1", "train_ppl": "550.1", "train_num_updates": "9"}\n'
        '{"epoch": 3, "valid_loss": "9.0", "valid_ppl": "512", "valid_num_updates": "9"}\n')


def test_parse_curves_reads_fairseqs_simple_and_json_lines():
    from deepnmt_fairseq.analysis.logs import last_value, parse_curves  # the figures' log reader

    c = parse_curves(SIMPLE + JSON)
    assert c["train_ppl"] == [(2.0, 1351.2), (3.0, 1055.7), (9.0, 550.1)]
    assert c["valid_ppl"] == [(3.0, 946.53), (6.0, 675.59), (9.0, 512.0)]
    assert c["train_loss"][0] == (2.0, 10.5) and c["valid_loss"][-1] == (9.0, 9.0)
    assert last_value(SIMPLE, "train_ppl") == 1055.7


def test_every_figure_points_at_registry_experiments_and_says_what_we_chose():
    keys = {t.key for t in reg.TABLES}
    for key in ("gpkd-fig2", "gpkd-fig4", "gpkd-fig5", "gpkd-fig6", "dd-fig1", "dd-fig2", "dd-fig3", "dd-fig4"):
        fig = F.FIGURES[key]
        assert key in keys and fig.chosen
        names = F.experiments_of(fig)
        assert names and all(n in reg.EXPERIMENTS for n in names)
        table = next(t for t in reg.TABLES if t.key == key)
        assert set(names) <= {r.experiment for r in table.rows}, key  # each run is listed with its command
    # deep-decoder Fig. 1: the decoder depth is the only change, with and without CAD + CRT
    fig1 = F.FIGURES["dd-fig1"]
    for label, points in fig1.lines:
        xs = [p.x for p in points]
        assert xs == sorted(xs) and xs[0] == 6 and xs[-1] >= 24
        for p in points[1:]:
            st = reg.EXPERIMENTS[p.experiment].eval_stage
            flags = list(st.model_flags)
            dec = int(flags[flags.index("--decoder-layers") + 1]) if "--decoder-layers" in flags else int(
                st.arch.split("_")[3])
            assert dec == p.x
            assert (st.criterion == "collapse_reducing") == ("CAD" in label)


def _write(root: Path, name: str, stage, text: str):
    exp = reg.EXPERIMENTS[name]
    d = root / name / (stage or exp.eval_stage.name) if exp.multi_stage else root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.log").write_text(text, encoding="utf-8")


def test_curves_across_two_stages_and_a_sweep_are_plotted(tmp_path):
    pytest.importorskip("matplotlib")
    root = tmp_path / "ck"
    # Fig. 6: 'after' = stage 1 (gpkd-wmt14-ende-48L-converged) then stage 2 (gpkd-wmt14-ende-48L-ssl)
    _write(root, "gpkd-wmt14-ende-48L", None, SIMPLE)
    _write(root, "gpkd-wmt14-ende-48L-converged", None, SIMPLE)
    _write(root, "gpkd-wmt14-ende-48L-ssl", None,
           "2026 | INFO | valid | epoch 003 | valid on 'valid' subset | loss 8 | ppl 256 | num_updates 9\n")
    paths = F.plot(F.FIGURES["gpkd-fig6"], root, tmp_path / "out")
    assert [p.name for p in paths] == ["gpkd-fig6.png", "gpkd-fig6.csv"] and paths[0].stat().st_size > 0
    rows = list(csv.DictReader(open(paths[1], encoding="utf-8")))
    after = [(float(r["x"]), float(r["y"])) for r in rows if r["line"].startswith("after")]
    assert after == [(3.0, 946.53), (6.0, 675.59), (9.0, 256.0)]
    with pytest.raises(FileExistsError):
        F.plot(F.FIGURES["gpkd-fig6"], root, tmp_path / "out")
    # Fig. 5: BLEU and tokens/s per decoder depth from results.json
    for name, bleu, tps in (("gpkd-wmt14-ende-fig5-6-1", 25.0, 900.0), ("gpkd-wmt14-ende-base-6L", 27.0, 400.0)):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "results.json").write_text(json.dumps({"bleu": bleu, "tokens_per_s": tps}))
    data = F.collect(F.FIGURES["gpkd-fig5"], root)
    assert data["bleu"]["6-layer encoder"] == [(1, 25.0), (6, 27.0)]
    assert data["tokens_per_s"]["6-layer encoder"] == [(1, 900.0), (6, 400.0)]
    from deepnmt_cli import repro as cli

    assert cli.main(["plot", "gpkd-fig5", "--checkpoint-root", str(root), "--out", str(tmp_path / "o2")]) == 0
    assert (tmp_path / "o2" / "gpkd-fig5.png").exists()
    assert cli.main(["plot", "gpkd-fig2", "--checkpoint-root", str(tmp_path / "empty"), "--out",
                     str(tmp_path / "o3")]) == 1  # nothing trained yet: a clear error


def test_deep_decoder_tables_mark_our_choices_and_headline_metric():
    from deepnmt_fairseq.repro import tables

    # Table 1's 27-27 CAD+CRT: depth 21 of 27 is the paper's (Fig. 2 peak); the unweighted loss sum and p_net 1
    # are our readings of its words (issue 37), everything else is ours
    assert tables.dd_settings("dd-wmt14-ende-base-27-27-cad-crt") == \
        "L_dr 21, p_net 0.5*, α_DDR 1†, α_ALD 1†, p_ALD 0.3*, τ 0.1"
    assert tables.dd_settings("dd-fig2-base-27-27-depth21-ratio1") == "L_dr 21, p_net 1†, α_ALD 1†, p_ALD 0.3*, τ 0.1"
    assert tables.dd_settings("dd-wmt14-ende-base-15-15-cad-crt-ald0.5").endswith("α_DDR 1†, α_ALD 0.5*, p_ALD 0.3*, τ 0.1")
    assert tables.dd_settings("dd-wmt14-ende-base-15-15") == ""
    text = tables.render(Path("/nonexistent"), "dd-t3")
    assert "CAD/CRT (* = not in the paper, † = our reading of it)" in text and "compound-split BLEU (ours)" in text
    # the deep-decoder paper states multi-bleu.perl (no compound splitting): that is its headline
    assert {e.eval.primary for e in reg.EXPERIMENTS.values() if e.paper == reg.DD and e.dataset == "wmt14-en-de-dd"} \
        == {"tok_bleu"}
    # MSC: "tokenized case-sensitive BLEU" with multi-bleu.perl for WMT14 En-De, no compound splitting mentioned
    assert {e.eval.primary for e in reg.EXPERIMENTS.values() if e.paper == reg.MSC and e.dataset == "wmt14-en-de"} \
        == {"tok_bleu"}
    # GPKD states compound splitting for En-De
    assert {e.eval.primary for e in reg.EXPERIMENTS.values() if e.paper == reg.GPKD} == {"tok_bleu_compound_split"}


def test_desdar_greedy_rows_read_the_beam_1_evaluation_of_the_same_runs(tmp_path):
    from deepnmt_fairseq.repro import tables

    ck = tmp_path / "ck"
    files = {("gpkd-wmt14-ende-48L", "results.json"): (30.0, 1000.0),
             ("gpkd-wmt14-ende-desdar-48-1-gpkd", "results.json"): (29.9, 2000.0),
             ("gpkd-wmt14-ende-desdar-48-1-gpkd", "results-beam1-lenpen0.6.json"): (29.8, 3200.0)}
    for (name, fname), (bleu, tps) in files.items():
        (ck / name).mkdir(parents=True, exist_ok=True)
        (ck / name / fname).write_text(json.dumps({"bleu": bleu, "tokens_per_s": tps}))
    text = tables.render(ck, "gpkd-desdar-greedy")
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines()
            if ln.startswith("| DESDAR") or ln.startswith("| Deep")}
    beam1 = rows["DESDAR 48-1 (GPKD), beam 1"]
    assert beam1[2] == "29.80" and beam1[4] == "3.20"  # BLEU ours; speedup vs Deep 48-6 beam 4 (ours)
    assert "evaluate gpkd-wmt14-ende-desdar-48-1-gpkd --beam 1`" in beam1[-2]  # the command cell
    assert rows["DESDAR 48-1 (GPKD), beam 4"][2] == "29.90"
    assert rows["DESDAR 48-1 (SKD), beam 1"][2] == "—"  # not evaluated yet
