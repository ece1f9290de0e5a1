"""The deep post-norm baselines: DeepNet (Wang et al. 2022, Table 1) and Admin (Liu et al. 2020,
*Very Deep Transformers for Neural Machine Translation*, Table 1), both on WMT En-De; Admin also
on WMT14 En-Fr.  The mechanisms: ``--deepnorm`` / ``--admin`` (docs/mechanisms.md)."""

from __future__ import annotations

from typing import List

from ..spec import Recipe, Row, Table
from .common import ADMIN, DEEPNET, arch_name, single, wmt_ende_eval

# DeepNet's WMT-17 setting ("huge batch", 128 x 4096 tokens), as the Admin authors re-ran it next to
# Admin in microsoft/admin-torch (example/train_wmt_en-de_huge_batch.sh, "the setting used in the
# DeepNet paper"): the paper's own hyper-parameter table is not in this repository.
DEEPNET_RECIPE = Recipe(
    lr=0.0015, warmup_updates=4000, max_update=100000, tokens_per_update=128 * 4096, weight_decay=1e-4,
    save="updates:1000", keep=10,
    notes=(("recipe", "DeepNet's WMT-17 En-De setting as microsoft/admin-torch's example reproduces it ('the "
                      "setting used in the DeepNet paper', 128 x 4096 tokens per update): Adam (0.9, 0.98), lr "
                      "1.5e-3 after 4K warm-up updates from 1e-7 (inverse sqrt), weight decay 1e-4, dropout 0.4, "
                      "label smoothing 0.1, 100K updates"),
           ("save", "not stated there: a checkpoint every 1000 updates, the last 10 averaged (ours)"),
           ("adam_eps", "fairseq's 1e-8 is what the script gets; 1e-9 here (Vaswani), no effect we know of")),
)
DEEPNET_DROPOUT = ("--dropout", "0.4")

# Admin's released WMT14 script (LiyuanLucasLiu/Transformer-Clinic, mirrored in admin-torch's
# example/train_wmt_en-de.sh): 8 x 4096 tokens, lr 1e-3, 8K warm-up.
ADMIN_RECIPE = Recipe(
    lr=0.001, warmup_updates=8000, max_update=0, tokens_per_update=32768, save="epoch", keep=10,
    notes=(("recipe", "Liu et al.'s released WMT14 script (Transformer-Clinic; admin-torch "
                      "example/train_wmt_en-de.sh): Adam (0.9, 0.98), lr 1e-3 after 8K warm-up updates from 1e-7 "
                      "(inverse sqrt), 8 x 4096 = 32,768 tokens per update, label smoothing 0.1, attention and "
                      "ReLU dropout 0.1, no weight decay"),
           ("max_update", "the script has no real limit (1M updates); Very Deep Transformers trains to "
                          "convergence: 50 epochs here (--max-epoch 50, ours), the last 10 epoch checkpoints "
                          "averaged (ours)"),
           ("profile", "Admin's omega is profiled on the first training batch inside fairseq-train (the released "
                       "code profiles in a separate first run and writes profile.ratio.init)")),
)
ADMIN_EXTRA = ("--max-epoch", "50", "--attention-dropout", "0.1", "--activation-dropout", "0.1")

_DEEPNET_DATA_NOTE = ("data: DeepNet Table 1 is WMT-17 En-De (the DeepNet team's preprocessed set, not among "
                      "deepnmt-prepare-data's corpora); this row runs on wmt14-en-de (test newstest2014), so its BLEU "
                      "can be compared with the paper's only in the ranking of depths")
_DEEPNET_BLEU_NOTE = ("paper BLEU: DeepNet Table 1 (WMT-17 En-De), as reported in summaries of the paper; the "
                      "paper's text is not in this repository")


def tables() -> List[Table]:
    deepnet_rows = []
    for layers, bleu in ((6, "-"), (18, 28.8), (50, 29.0), (100, 28.9)):
        name = single(f"deepnet-wmt-ende-{layers}L-{layers}L", DEEPNET, "wmt14-en-de",
                      arch_name("deepnorm_wmt_base", layers), DEEPNET_RECIPE, wmt_ende_eval(10),
                      f"DeepNet Table 1: DeepNet {layers}L-{layers}L (post-norm with DeepNorm)",
                      model_flags=DEEPNET_DROPOUT, notes=(_DEEPNET_DATA_NOTE, _DEEPNET_BLEU_NOTE))
        deepnet_rows.append(Row(f"DeepNet {layers}L-{layers}L", name, {"bleu": bleu}))
    admin_rows = []
    for ds, pair, bleu in (("wmt14-en-de", "ende", 30.1), ("wmt14-en-fr", "enfr", 43.8)):
        for enc, dec, value in ((6, 6, "-"), (60, 12, bleu)):
            name = single(f"admin-wmt14-{pair}-{enc}L-{dec}L", ADMIN, ds, arch_name("admin_wmt_base", enc, dec),
                          ADMIN_RECIPE, wmt_ende_eval(10), f"Liu et al. 2020 Table 1: Admin {enc}L-{dec}L ({pair})",
                          model_flags=ADMIN_EXTRA,
                          notes=("paper BLEU: 60L-12L from the abstract of arXiv 2008.07772 (30.1 En-De, 43.8 "
                                 "En-Fr without back-translation); the 6L-6L baseline's number is not recorded here",))
            admin_rows.append(Row(f"Admin {enc}L-{dec}L, WMT14 {pair[:2].upper()}-{pair[2:].capitalize()}", name,
                                  {"bleu": value}))
    return [
        Table("deepnet-t1", DEEPNET, "Table 1: WMT-17 En-De, N-layer encoder and decoder, DeepNorm",
              tuple(deepnet_rows),
              note="Transformer-base width (512 / 2048 / 8 heads), shared vocabulary. " + _DEEPNET_DATA_NOTE + "."),
        Table("admin-t1", ADMIN, "Table 1: WMT14 En-De / En-Fr, 60-layer encoder, 12-layer decoder, Admin",
              tuple(admin_rows),
              note="Transformer-base width; Admin's omega profiled on the first training batch (docs/mechanisms.md)."),
    ]
