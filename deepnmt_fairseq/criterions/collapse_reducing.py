"""``--criterion collapse_reducing``: LS cross-entropy + DDR + ALD (+ encoder L2).

Deep-decoder paper, Sec. 3.4 (the math lives in
:mod:`deepnmt_fairseq.modules.collapse_losses`)::

    loss = CE + alpha_DDR * J_DDR + alpha_ALD * J_ALD + lambda * ||W_enc||^2

Scaling: fairseq divides the returned loss by ``sample_size`` (target tokens).
CE and J_DDR are summed over target tokens, so after the division they are
per-token averages; J_ALD (per sentence) and the L2 term are multiplied by
``sample_size`` so that they enter as their sentence mean and plain value.
With DDR the CE is the mean of both passes' CE (as in R-Drop).

Loss weights: the paper gives none.  Sec. 1 adds the DDR and ALD losses "for
joint model optimization" and Sec. 3.4 "introduced two extra losses into model
training" without a weighted objective, which reads most simply as the
unweighted sum: the defaults are alpha_DDR = alpha_ALD = 1.0 (our reading).
Our earlier weighting, alpha_ALD = 0.5 (the per-sentence J_ALD starts at
log 2, comparable to the per-token CE late in training, so 0.5 keeps CE
dominant), stays an option: ``--ald-alpha 0.5`` (the registry keeps one run
with it, dd-wmt14-ende-base-15-15-cad-crt-ald0.5).  Other defaults (not in the
paper): tau = 0.1 (Sec. 4.3: 0.05 is slightly worse), p_ALD = 0.3 (Fig. 3: BLEU
rises with p_ALD and then falls; the paper requires 0 < p_ALD < 0.5; the
figure's exact peak is not legible in our copy).
Both terms are on by default; ``--ddr-alpha 0`` / ``--ald-alpha 0`` disable
one.  R-Drop (Table 3) is DDR without CAD, i.e. this
criterion on a model without ``--cad-drop-depth``.

Cost per training step: DDR adds one decoder pass (the encoder output is
reused), ALD adds two encoder+decoder passes.  All passes run inside one call of
the model (``DeepTransformerModel.forward(..., extra_passes=...)``), so a
DistributedDataParallel wrapper sees one forward per backward and synchronises
the gradients of every pass.  Validation and generation run the plain
cross-entropy only.
"""

import math
from dataclasses import dataclass, field

import torch
from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics

from ..modules.collapse_losses import (
    ald_loss,
    bidirectional_kl,
    l2_penalty,
    masked_mean,
    unk_corrupt,
    weight_matrices,
)


@dataclass
class CollapseReducingConfig(LabelSmoothedCrossEntropyCriterionConfig):
    ddr_alpha: float = field(
        default=1.0,
        metadata={"help": "weight of the DDR loss, bidirectional KL between two decoder passes "
                          "(deep-decoder paper Sec. 3.4); 0 disables.  1.0: the unweighted sum (our reading)"},
    )
    ald_alpha: float = field(
        default=1.0,
        metadata={"help": "weight of the ALD contrastive loss (Sec. 3.4); 0 disables.  The paper gives no "
                          "weights ('joint model optimization'): 1.0 with --ddr-alpha 1.0 is the unweighted sum "
                          "(our reading); 0.5 was our earlier choice"},
    )
    ald_p: float = field(
        default=0.3,
        metadata={"help": "p_ALD: gamma ~ U[0, p_ALD) per sentence, X+ has gamma of its tokens "
                          "UNK-replaced, X- 1-gamma (0 < p_ALD < 0.5)"},
    )
    ald_tau: float = field(default=0.1, metadata={"help": "ALD softmax temperature tau (Fig. 3)"})
    encoder_l2: float = field(
        default=0.0,
        metadata={"help": "lambda of an L2 loss on encoder weight matrices (MSC Table 2 row 6 "
                          "uses 1e-5 for 72-layer IWSLT models); biases, norms, embeddings excluded"},
    )


@register_criterion("collapse_reducing", dataclass=CollapseReducingConfig)
class CollapseReducingCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 ddr_alpha=1.0, ald_alpha=1.0, ald_p=0.3, ald_tau=0.1, encoder_l2=0.0):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if not 0.0 < ald_p < 0.5 and ald_alpha > 0:
            raise ValueError(f"--ald-p must be in (0, 0.5) (the paper's range), got {ald_p}")
        if ald_tau <= 0:
            raise ValueError(f"--ald-tau must be > 0, got {ald_tau}")
        if min(ddr_alpha, ald_alpha, encoder_l2) < 0:
            raise ValueError("--ddr-alpha, --ald-alpha and --encoder-l2 must be >= 0")
        self.ddr_alpha, self.ald_alpha = ddr_alpha, ald_alpha
        self.ald_p, self.ald_tau, self.encoder_l2 = ald_p, ald_tau, encoder_l2
        self.unk = task.source_dictionary.unk()
        self.specials = {task.source_dictionary.eos(), task.source_dictionary.bos(), self.padding_idx}

    # ------------------------------------------------------------------ pieces
    def _replaceable(self, src_tokens):
        mask = torch.ones_like(src_tokens, dtype=torch.bool)
        for s in self.specials:
            mask &= src_tokens.ne(s)
        return mask

    def encoder_l2_term(self, model):
        enc = model.encoder
        emb = [enc.embed_tokens.weight] if getattr(enc, "embed_tokens", None) is not None else []
        return l2_penalty(weight_matrices(enc, exclude=emb))

    # ------------------------------------------------------------------ forward
    def forward(self, model, sample, reduce=True):
        training = model.training
        net = sample["net_input"]
        target = model.get_targets(sample, None)
        target_mask = target.ne(self.padding_idx)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        ddr = training and self.ddr_alpha > 0
        ald = training and self.ald_alpha > 0
        logging_output = {}

        if not (ddr or ald):  # validation, or both terms off: fairseq's plain forward
            net_output = model(**net)
            ce, nll = self.compute_loss(model, net_output, sample, reduce=reduce)
            loss = ce
        else:
            corrupted = ()
            if ald:
                src = net["src_tokens"]
                gamma = torch.rand(src.size(0), device=src.device) * self.ald_p
                corrupted = unk_corrupt(src, (gamma, 1.0 - gamma), self.unk, self._replaceable(src))
            # every pass inside ONE call of the (possibly DDP-wrapped) model: the encoder
            # runs once for the DDR passes, and DDP sees exactly one forward per backward
            out = model(**net, extra_passes={"decoder_passes": 2 if ddr else 1, "corrupted_sources": corrupted})
            (features, logits, extra), others = out["passes"][0], out["passes"][1:]
            net_output = (logits, extra)
            ce, nll = self.compute_loss(model, net_output, sample, reduce=reduce)
            loss = ce
            if ddr:  # the second pass drew its own dropout and CAD coins
                net_output2 = others[0][1:]
                ce2, nll2 = self.compute_loss(model, net_output2, sample, reduce=reduce)
                lp1 = model.get_normalized_probs(net_output, log_probs=True)
                lp2 = model.get_normalized_probs(net_output2, log_probs=True)
                ddr_sum = bidirectional_kl(lp1, lp2, target_mask).sum()
                ce, nll = (ce + ce2) / 2, (nll + nll2) / 2
                loss = ce + self.ddr_alpha * ddr_sum
                logging_output["ddr_loss"] = ddr_sum.data
            if ald:
                g = masked_mean(features, target_mask)
                g_pos, g_neg = (masked_mean(f, target_mask) for f in out["corrupted"])
                ald_mean = ald_loss(g, g_pos, g_neg, self.ald_tau).mean()
                loss = loss + self.ald_alpha * ald_mean * sample_size
                logging_output["ald_loss"] = ald_mean.data * target.size(0)  # summed over sentences
        if training and self.encoder_l2 > 0:
            l2 = self.encoder_l2_term(model)
            loss = loss + self.encoder_l2 * l2 * sample_size
            logging_output["encoder_l2"] = l2.data * sample_size

        logging_output.update({
            "loss": loss.data,
            "ce_loss": ce.data,
            "nll_loss": nll.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        })
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        nsent = sum(log.get("nsentences", 0) for log in logging_outputs)
        ce = sum(log.get("ce_loss", 0) for log in logging_outputs)
        metrics.log_scalar("ce_loss", ce / max(sample_size, 1) / math.log(2), sample_size, round=3)
        if any("ddr_loss" in log for log in logging_outputs):
            ddr = sum(log.get("ddr_loss", 0) for log in logging_outputs)
            metrics.log_scalar("ddr_loss", ddr / max(ntokens, 1), ntokens, round=4)
        if any("ald_loss" in log for log in logging_outputs):
            ald = sum(log.get("ald_loss", 0) for log in logging_outputs)
            metrics.log_scalar("ald_loss", ald / max(nsent, 1), nsent, round=4)
        if any("encoder_l2" in log for log in logging_outputs):
            l2 = sum(log.get("encoder_l2", 0) for log in logging_outputs)
            metrics.log_scalar("encoder_l2", l2 / max(sample_size, 1), sample_size, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
