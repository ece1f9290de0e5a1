"""``--optimizer radam``: RAdam (Liu et al. 2020, *On the Variance of the Adaptive Learning Rate
and Beyond*, arXiv 1908.03265) for fairseq 0.12, which registers no such optimizer.

Why it is here: the Admin authors' released training scripts (Transformer-Clinic's
``nmt-experiments/wmt14_en-{de,fr}.md`` and microsoft/deepnmt's ``run_wmt14_en_fr.sh``) all pass
``--optimizer radam`` with their own fairseq plugin.  This is a thin fairseq wrapper around
``torch.optim.RAdam``: a subclass of fairseq's Adam optimizer that keeps its options
(``--adam-betas``, ``--adam-eps``, ``--weight-decay``) and its ``optimizer_config`` (what a resumed
run overrides in a checkpoint's optimizer state) and only builds a different torch optimizer.

The update (Algorithm 2 of the RAdam paper), for step t with rho_inf = 2 / (1 - beta2) - 1 and
rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t):

* m_t, v_t as Adam's; m_hat = m_t / (1 - beta1^t);
* rho_t > 5: theta -= lr * r_t * m_hat * sqrt(1 - beta2^t) / (sqrt(v_t) + eps), with the
  rectification r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t));
* otherwise: theta -= lr * m_hat (momentum SGD, no adaptive rate).

This is torch's implementation.  Where the authors' released RAdam differs: it rectifies at
rho_t >= 5 (torch: > 5; rho_t is never exactly 5 for beta2 = 0.98 or 0.999) and applies weight
decay as theta -= lr * wd * theta before the step; we pass ``decoupled_weight_decay=True`` so that
torch does the same (the scripts use weight decay 0 anyway).  ``tests/test_plugin.py`` checks the
steps against that formula.  fp16: fairseq's ``--fp16`` keeps fp32 master weights for it;
``--memory-efficient-fp16`` is not supported (torch's RAdam does not up-cast fp16 state).
"""

from __future__ import annotations

import torch
from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig
from fairseq.optim.fairseq_optimizer import FairseqOptimizer


@register_optimizer("radam", dataclass=FairseqAdamConfig)
class FairseqRAdam(FairseqAdam):
    """fairseq's Adam options and checkpoint handling around ``torch.optim.RAdam``."""

    def __init__(self, cfg: FairseqAdamConfig, params):
        FairseqOptimizer.__init__(self, cfg)  # not FairseqAdam's: it would build an Adam
        if getattr(cfg, "tpu", False) or getattr(cfg, "fp16_adam_stats", False):
            raise NotImplementedError("--optimizer radam: --tpu and --fp16-adam-stats are Adam-only options")
        self._optimizer = torch.optim.RAdam(params, decoupled_weight_decay=True, **self.optimizer_config)
