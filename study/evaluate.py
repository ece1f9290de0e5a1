#!/usr/bin/env python
"""Every metric of one run of the evidence study, in one process (study/cli.py).

    python study/evaluate.py --data DATA_BIN --raw TOK_DIR --checkpoint CKPT [--unk-gap] [--cpu]
                                       [--average-dir SAVE_DIR]

With ``--average-dir``, CKPT is first written (if it does not exist) as the average of the last 3
checkpoints of SAVE_DIR by update, interval and epoch checkpoints alike (``deepnmt-average-checkpoints
--inputs SAVE_DIR --num-checkpoints 3 --output CKPT``, in this process).

Prints one JSON object:

* ``valid_nll``: NLL of the valid references (bits/token, no label smoothing, teacher forcing);
* ``bleu`` / ``train_bleu``: detokenized sacreBLEU (13a) of beam-4 translations (max length
  1.2 * source + 10, length penalty 1) of the ``test`` and ``trainsample`` splits against the raw
  references ``TOK_DIR/<split>.raw.de``; the same search as
  ``fairseq-generate DATA_BIN --path CKPT --gen-subset test --beam 4 --max-len-a 1.2 --max-len-b 10
  --remove-bpe``;
* ``layer_weights``: the learned layer weights of a transparent or DLCL encoder
  (``EncoderMemory.learned_weights``), so that an analysis of them reads the record;
* ``test_stats``: sacreBLEU's statistics of every test sentence, for the paired bootstrap
  (``study/stats.py``);
* with ``--valid-only``: the valid NLL (and the layer weights) only: a tuning run (issue 77) never
  translates the test set;
* with ``--unk-gap``: ``valid_nll_unk_source`` (every source token replaced by ``<unk>``) and
  ``unk_gap`` = the difference: how much the predictions depend on the source (a decoder that
  collapsed into a language model has a gap near 0; deep-decoder paper Sec. 3).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from argparse import Namespace
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:  # python study/evaluate.py: its package is one up
    sys.path[0] = str(_HERE.parent)


def valid_nll(model, task, unk_source: bool) -> float:
    import torch

    ds = task.dataset("valid")
    d = task.source_dictionary
    total, ntok = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ds), 64):
            sample = ds.collater([ds[i] for i in range(start, min(len(ds), start + 64))])
            net, target = sample["net_input"], sample["target"]
            src = net["src_tokens"]
            if unk_source:
                src = src.masked_fill(~(src.eq(d.pad()) | src.eq(d.eos())), d.unk())
            out = model(src.to(_device(model)), net["src_lengths"].to(_device(model)),
                        net["prev_output_tokens"].to(_device(model)))
            lp = model.get_normalized_probs(out, log_probs=True).float().cpu()
            mask = target.ne(d.pad())
            total += float(-lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)[mask].sum())
            ntok += int(mask.sum())
    return total / ntok / math.log(2)


def _device(model):
    return next(model.parameters()).device


def translate(model, task, split: str) -> list:
    """Beam-4 translations of every sentence of ``split``, BPE removed, in input order."""
    import torch
    from fairseq import utils

    task.load_dataset(split)
    ds = task.dataset(split)
    gen = task.build_generator([model], Namespace(beam=4, max_len_a=1.2, max_len_b=10, lenpen=1.0))
    itr = task.get_batch_iterator(dataset=ds, max_tokens=None, max_sentences=128, required_batch_size_multiple=1,
                                  ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
    hyps = {}
    with torch.no_grad():
        for sample in itr:
            sample = utils.move_to_cuda(sample) if _device(model).type == "cuda" else sample
            out = task.inference_step(gen, [model], sample)
            for i, sid in enumerate(sample["id"].tolist()):
                hyps[sid] = task.target_dictionary.string(out[i][0]["tokens"].int().cpu(), "@@ ")
    if sorted(hyps) != list(range(len(ds))):
        raise SystemExit(f"{split}: translated {len(hyps)} of {len(ds)} sentences")
    return [hyps[i] for i in range(len(ds))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--raw", required=True, help="directory with <split>.raw.de references")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--unk-gap", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--average-dir", help="write CKPT as the average of this directory's last 3 checkpoints by update")
    ap.add_argument("--valid-only", action="store_true",
                    help="the valid NLL only, no translation (the tuning sweep's runs: test is not read)")
    ap.add_argument("--no-train-sample", action="store_true",
                    help="skip the train-sample BLEU (the points of a BLEU-vs-updates curve)")
    a = ap.parse_args(argv)
    if a.average_dir and not Path(a.checkpoint).exists():
        from deepnmt_fairseq.checkpoint_averaging import average, newest_checkpoints, save_atomic

        save_atomic(average(newest_checkpoints(a.average_dir, 3)), a.checkpoint)

    import torch

    import deepnmt_fairseq  # noqa: F401
    from deepnmt_fairseq.scoring import corpus_bleu, detokenize
    from fairseq import checkpoint_utils
    from study.stats import encode_stats, sentence_stats

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([a.checkpoint],
                                                                       arg_overrides={"data": a.data})
    model = models[0].eval()
    if not a.cpu and torch.cuda.is_available():
        model = model.cuda()
    task.load_dataset("valid")
    res = {"valid_nll": round(valid_nll(model, task, False), 4)}
    memory = getattr(model.encoder, "memory", None)  # learned layer weights (transparent s, DLCL W)
    weights = memory.learned_weights() if memory is not None else None
    if weights:
        res["layer_weights"] = weights
    if a.unk_gap:
        res["valid_nll_unk_source"] = round(valid_nll(model, task, True), 4)
        res["unk_gap"] = round(res["valid_nll_unk_source"] - res["valid_nll"], 4)
    splits = (("test", "bleu"),) + ((("trainsample", "train_bleu"),) if not a.no_train_sample else ())
    for split, key in () if a.valid_only else splits:
        refs = (Path(a.raw) / f"{split}.raw.de").read_text(encoding="utf-8").splitlines()
        hyps = detokenize(translate(model, task, split), "de", join_at=False)
        if len(hyps) != len(refs):
            raise SystemExit(f"{split}: {len(hyps)} translations for {len(refs)} references")
        res[key] = round(corpus_bleu(hyps, refs).score, 2)
        if split == "test":  # sacreBLEU's statistics per sentence: the paired bootstrap's input
            res["test_stats"] = encode_stats(sentence_stats(hyps, refs))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
