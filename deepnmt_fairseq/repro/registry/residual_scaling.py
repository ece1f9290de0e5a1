"""The deep post-norm baselines: DeepNet (Wang et al. 2022, Table 1) and Admin (Liu et al. 2020,
*Very Deep Transformers for Neural Machine Translation*, Table 1), both on WMT En-De; Admin also
on WMT14 En-Fr.  The mechanisms: ``--deepnorm`` / ``--admin`` (docs/mechanisms.md)."""

from __future__ import annotations

from typing import List

from ..spec import EvalSpec, Recipe, Row, Table
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
# preemption (issue 67 §3, spec.checkpoint_rule: 8 GPUs at 20 TFLOP/s, 128 x 4096 tokens per update): an
# update takes ~3 s at 18L-18L, ~8 s at 50L-50L, ~15 s at 100L-100L, so 1000 updates would be 0.8-4 hours
DEEPNET_SAVE = {6: 1000, 18: 500, 50: 200, 100: 100}


def deepnet_recipe(layers: int) -> Recipe:
    n = DEEPNET_SAVE[layers]
    if n == 1000:
        return DEEPNET_RECIPE
    return DEEPNET_RECIPE.with_(save=f"updates:{n}", notes=(
        ("save (preemption)", f"a checkpoint every {n} updates, not 1000: checkpoint_last.pt at least every ~30 "
                              f"minutes on one 8-GPU node (spec.checkpoint_rule); the last 10 averaged then span "
                              f"{10 * n} updates (ours, as the interval)"),))

# Admin: the authors' released scripts, read (not copied).  En-De: Transformer-Clinic
# (LiyuanLucasLiu/Transformer-Clinic, nmt-experiments/wmt14_en-de.md, "admin" section, 6/12/18 layers;
# eval_wmt_en-de.sh).  En-Fr 6L-6L: Transformer-Clinic's wmt14_en-fr.md "admin 6l" (eval_wmt_en-fr.sh).
# En-Fr 60L-12L: microsoft/deepnmt's run_wmt14_en_fr.sh (the code of Very Deep Transformers, whose 43.8
# the row carries; nmt_eval/eval_enfr.sh), with Transformer-Clinic's "admin 60-12l" as a variant row.
# All of them: --optimizer radam (the plugin's, deepnmt_fairseq/optim/radam.py: fairseq 0.12 has none),
# betas (0.9, 0.98), no clipping, inverse sqrt from 1e-7 over 8K warm-up updates, weight decay 0, label
# smoothing 0.1, attention and ReLU dropout 0.1, seed 1111, --fp16, --share-all-embeddings.
_ADMIN_COMMON_NOTES = (
    ("optimizer", "RAdam as the scripts' --optimizer radam: fairseq 0.12 registers none, so the plugin's "
                  "--optimizer radam wraps torch.optim.RAdam (same update; the authors' own RAdam rectifies at "
                  "rho_t >= 5 where torch uses > 5, deepnmt_fairseq/optim/radam.py)"),
    ("adam_eps", "1e-8: the scripts give none, their RAdam's default"),
    ("warmup_init_lr", "1e-7 as the scripts; their --min-lr 1e-9 is not a fairseq 0.12 inverse_sqrt option"),
    ("precision", "the scripts train with --fp16 (--fp16-scale-window 256 --threshold-loss-scale 0.03125): give "
                  "--fp16 to deepnmt-repro train on GPUs; loss-scale settings are fairseq's defaults here"),
    ("profile", "Admin's omega is profiled on the first training batch inside fairseq-train (the released code "
                "profiles in a separate one-GPU first run, --init-type adaptive-profiling, and writes the profile "
                "to a file the real run reads)"),
)
ADMIN_BASE = Recipe(optimizer="radam", lr=0.001, warmup_updates=8000, max_update=0, tokens_per_update=32768,
                    adam_eps=1e-8, save="epoch", keep=10, seed=1111, notes=_ADMIN_COMMON_NOTES)
ADMIN_ENDE_RECIPE = ADMIN_BASE.with_(
    lr=0.001, max_update=500000, tokens_per_update=4 * 8192, max_tokens=8192,
    notes=(("recipe", "Transformer-Clinic's WMT14 En-De 'admin' script (nmt-experiments/wmt14_en-de.md): RAdam "
                      "(0.9, 0.98), lr 1e-3 after 8K warm-up updates from 1e-7 (inverse sqrt), 4 GPUs x 8192 = "
                      "32,768 tokens per update, --max-update 500000, dropout 0.1 (transformer_wmt_en_de's "
                      "default), attention and ReLU dropout 0.1, no weight decay"),
           ("max_epoch", "eval_wmt_en-de.sh averages the last 10 epoch checkpoints up to epoch 100 "
                         "(--checkpoint-upper-bound 100): --max-epoch 100 so that our last 10 are those (our reading "
                         "of the two scripts; the training script stops only at 500K updates)"),
           ("60L-12L", "Transformer-Clinic's En-De script covers 6/12/18 layers and microsoft/deepnmt releases only "
                       "En-Fr: the 60L-12L En-De row runs the same En-De recipe with 60/12 layers (our reading)"),
           ("admin-torch", "microsoft/admin-torch's later example/train_wmt_en-de.sh differs: Adam, --max-update "
                           "1000000, beam 4 / lenpen 0.6; the rows follow Transformer-Clinic, the paper's code")),
)
ADMIN_ENDE_EXTRA = ("--max-epoch", "100", "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout",
                    "0.1")
ADMIN_ENFR_6_RECIPE = ADMIN_BASE.with_(
    lr=0.0007, max_update=0, tokens_per_update=8 * 8000 * 10, max_tokens=8000, checkpoint_updates=1000,
    notes=(("checkpoint_updates", "checkpoint_last.pt every 1000 updates (an epoch of the 36M-pair corpus is ~50 min "
                                  "on one 8-GPU node by spec.checkpoint_rule; issue 67 §3, ours)"),
           ("recipe", "Transformer-Clinic's WMT14 En-Fr 'admin 6l' script (nmt-experiments/wmt14_en-fr.md): RAdam "
                      "(0.9, 0.98), lr 7e-4 after 8K warm-up updates, 8 GPUs x 8000 tokens x update-freq 10 = "
                      "640,000 tokens per update, 50 epochs, dropout 0.1, attention and ReLU dropout 0.1"),),
)
ADMIN_ENFR_60_RECIPE = ADMIN_BASE.with_(
    lr=0.001, max_update=0, tokens_per_update=16 * 3200 * 8, max_tokens=3200, checkpoint_updates=250,
    notes=(("checkpoint_updates", "checkpoint_last.pt every 250 updates (~4 s per update, epochs of ~3 h on one "
                                  "8-GPU node by spec.checkpoint_rule; issue 67 §3, ours)"),
           ("recipe", "microsoft/deepnmt's run_wmt14_en_fr.sh (Very Deep Transformers' code, Admin 60L-12L): "
                      "RAdam (0.9, 0.98), lr 1e-3 after 8K warm-up updates, 16 GPUs x 3200 tokens x update-freq 8 "
                      "= 409,600 tokens per update, 50 epochs, dropout 0.2 (its profiling run: 0.1 on one GPU), "
                      "attention and ReLU dropout 0.1"),
           ("clinic", "Transformer-Clinic's 'admin 60-12l' En-Fr script differs (lr 7e-4, dropout 0.1, 16 x 5000 x "
                      "16 = 1,280,000 tokens, beam 5 / lenpen 0.8): row admin-wmt14-enfr-60L-12L-clinic")),
)
ADMIN_ENFR_60_CLINIC_RECIPE = ADMIN_BASE.with_(
    lr=0.0007, max_update=0, tokens_per_update=16 * 5000 * 16, max_tokens=5000, checkpoint_updates=100,
    notes=(("checkpoint_updates", "checkpoint_last.pt every 100 updates (~12 s per update, epochs of ~3 h on one "
                                  "8-GPU node by spec.checkpoint_rule; issue 67 §3, ours)"),
           ("recipe", "Transformer-Clinic's WMT14 En-Fr 'admin 60-12l' script: RAdam (0.9, 0.98), lr 7e-4 after "
                      "8K warm-up updates, 16 GPUs x 5000 tokens x update-freq 16 = 1,280,000 tokens per update, 50 "
                      "epochs, dropout 0.1, attention and ReLU dropout 0.1"),),
)
ADMIN_ENFR_EXTRA = ("--max-epoch", "50", "--attention-dropout", "0.1", "--activation-dropout", "0.1")


def admin_eval(script: str, beam: int, lenpen: float, batch_size: int, upper: int) -> EvalSpec:
    """The authors' evaluation scripts: the last 10 epoch checkpoints (up to epoch ``upper``) averaged,
    fairseq-generate with their beam and length penalty."""
    return EvalSpec(beam=beam, lenpen=lenpen, average=10, primary="tok_bleu", batch_size=batch_size,
                    notes=(f"{script}: the 10 epoch checkpoints up to epoch {upper} averaged, beam {beam}, length "
                           f"penalty {lenpen:g}" + (" (the script gives none: fairseq's default)" if
                                                    script.startswith("eval_wmt_en-de") else ""),
                           "headline: tokenized case-sensitive BLEU (multi-bleu.perl); detokenized sacreBLEU beside it"))


_DEEPNET_DATA_NOTE = ("data: DeepNet Table 1 is WMT-17 En-De (the DeepNet team's preprocessed set, not among "
                      "deepnmt-prepare-data's corpora); this row runs on wmt14-en-de (test newstest2014), so its BLEU "
                      "can be compared with the paper's only in the ranking of depths")
_DEEPNET_BLEU_NOTE = ("paper BLEU: DeepNet Table 1 (WMT-17 En-De), as reported in summaries of the paper; the "
                      "paper's text is not in this repository")


def tables() -> List[Table]:
    deepnet_rows = []
    for layers, bleu in ((6, "-"), (18, 28.8), (50, 29.0), (100, 28.9)):
        name = single(f"deepnet-wmt-ende-{layers}L-{layers}L", DEEPNET, "wmt14-en-de",
                      arch_name("deepnorm_wmt_base", layers), deepnet_recipe(layers), wmt_ende_eval(10),
                      f"DeepNet Table 1: DeepNet {layers}L-{layers}L (post-norm with DeepNorm)",
                      model_flags=DEEPNET_DROPOUT, notes=(_DEEPNET_DATA_NOTE, _DEEPNET_BLEU_NOTE))
        deepnet_rows.append(Row(f"DeepNet {layers}L-{layers}L", name, {"bleu": bleu}))
    admin_rows = []
    # pair, enc, dec, recipe, extra flags, eval, paper BLEU, name suffix, label suffix
    ende_eval = admin_eval("Transformer-Clinic eval_wmt_en-de.sh", 5, 1.0, 128, 100)
    admin_specs = (
        ("ende", 6, 6, ADMIN_ENDE_RECIPE, ADMIN_ENDE_EXTRA, ende_eval, "-", ""),
        ("ende", 60, 12, ADMIN_ENDE_RECIPE, ADMIN_ENDE_EXTRA, ende_eval, 30.1, ""),
        ("enfr", 6, 6, ADMIN_ENFR_6_RECIPE, ADMIN_ENFR_EXTRA + ("--dropout", "0.1"),
         admin_eval("Transformer-Clinic eval_wmt_en-fr.sh", 5, 0.8, 128, 50), "-", ""),
        ("enfr", 60, 12, ADMIN_ENFR_60_RECIPE, ADMIN_ENFR_EXTRA + ("--dropout", "0.2"),
         admin_eval("microsoft/deepnmt nmt_eval/eval_enfr.sh", 10, 1.0, 256, 50), 43.8, ""),
        ("enfr", 60, 12, ADMIN_ENFR_60_CLINIC_RECIPE, ADMIN_ENFR_EXTRA + ("--dropout", "0.1"),
         admin_eval("Transformer-Clinic eval_wmt_en-fr.sh", 5, 0.8, 128, 50), "-", "-clinic"),
    )
    for pair, enc, dec, recipe, extra, ev, value, suffix in admin_specs:
        ds = "wmt14-en-de" if pair == "ende" else "wmt14-en-fr"
        script = "Transformer-Clinic's" if pair == "ende" or enc == 6 or suffix else "microsoft/deepnmt's"
        name = single(f"admin-wmt14-{pair}-{enc}L-{dec}L{suffix}", ADMIN, ds, arch_name("admin_wmt_base", enc, dec),
                      recipe, ev, f"Liu et al. 2020 Table 1: Admin {enc}L-{dec}L ({pair}), {script} recipe",
                      model_flags=extra,
                      notes=("paper BLEU: 60L-12L from the abstract of arXiv 2008.07772 (30.1 En-De, 43.8 "
                             "En-Fr without back-translation); the 6L-6L baseline's number is not recorded here",))
        label = f"Admin {enc}L-{dec}L, WMT14 {pair[:2].upper()}-{pair[2:].capitalize()}"
        admin_rows.append(Row(label + (" (Transformer-Clinic's 60-12l recipe)" if suffix else ""), name,
                              {"bleu": value},
                              "variant: the other released script (lr 7e-4, dropout 0.1, 1.28M tokens, beam 5 / "
                              "lenpen 0.8)" if suffix else ""))
    return [
        Table("deepnet-t1", DEEPNET, "Table 1: WMT-17 En-De, N-layer encoder and decoder, DeepNorm",
              tuple(deepnet_rows),
              note="Transformer-base width (512 / 2048 / 8 heads), shared vocabulary. " + _DEEPNET_DATA_NOTE + "."),
        Table("admin-t1", ADMIN, "Table 1: WMT14 En-De / En-Fr, 60-layer encoder, 12-layer decoder, Admin",
              tuple(admin_rows),
              note="Transformer-base width; Admin's omega profiled on the first training batch (docs/mechanisms.md). "
                   "Recipes: the authors' released scripts (RAdam; Transformer-Clinic for En-De and En-Fr 6L-6L, "
                   "microsoft/deepnmt for En-Fr 60L-12L), each row's notes list what differs."),
    ]
