"""``--optimizer radam`` (deepnmt_fairseq/optim/radam.py): registered by the plugin, built from
fairseq's flags, its steps equal RAdam's Algorithm 2 written out here, and fairseq-train runs,
saves and resumes with it (the Admin rows' optimizer, as the authors' scripts)."""

import math
import re

import pytest
import torch

from fairseq_helpers import TINY, train


def _reference_radam(theta, grads, lr, betas, eps):
    """RAdam, Liu et al. 2020 (arXiv 1908.03265) Algorithm 2, one scalar per element."""
    b1, b2 = betas
    rho_inf = 2 / (1 - b2) - 1
    m = torch.zeros_like(theta)
    v = torch.zeros_like(theta)
    out = []
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        rho_t = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
        if rho_t > 5:
            r = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            theta = theta - lr * r * m_hat * math.sqrt(1 - b2 ** t) / (v.sqrt() + eps)
        else:
            theta = theta - lr * m_hat
        out.append(theta.clone())
    return out


def _fairseq_radam(params, flags):
    from fairseq import optim, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import deepnmt_fairseq  # noqa: F401  (registers the optimizer)

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["/nonexistent", "--arch", "transformer", "--optimizer", "radam",
                                                *flags])
    cfg = convert_namespace_to_omegaconf(args)
    return optim.build_optimizer(cfg.optimizer, params)


def test_radam_is_registered_and_takes_adams_flags():
    from fairseq.optim import OPTIMIZER_REGISTRY

    import deepnmt_fairseq  # noqa: F401

    assert "radam" in OPTIMIZER_REGISTRY
    p = torch.nn.Parameter(torch.zeros(3))
    opt = _fairseq_radam([p], ["--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-8", "--lr", "0.0007",
                               "--weight-decay", "0.0"])
    assert isinstance(opt.optimizer, torch.optim.RAdam)
    group = opt.optimizer.param_groups[0]
    assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]) == (0.0007, (0.9, 0.98), 1e-8, 0.0)
    assert group["decoupled_weight_decay"]  # the authors' RAdam: theta -= lr * wd * theta


def test_radam_steps_equal_algorithm_2():
    """12 steps with beta2 = 0.98: rho_t <= 5 for t <= 5 (momentum SGD), rectified from t = 6."""
    torch.manual_seed(0)
    theta0 = torch.randn(5, dtype=torch.float64)
    grads = [torch.randn(5, dtype=torch.float64) for _ in range(12)]
    p = torch.nn.Parameter(theta0.clone())
    opt = _fairseq_radam([p], ["--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-8", "--lr", "0.001"])
    ref = _reference_radam(theta0.clone(), grads, 0.001, (0.9, 0.98), 1e-8)
    for g, want in zip(grads, ref):
        p.grad = g.clone()
        opt.step()
        assert torch.allclose(p.data, want, rtol=0, atol=1e-12)
    # the sensitivity of this check: plain Adam's steps differ
    adam = torch.nn.Parameter(theta0.clone())
    a = torch.optim.Adam([adam], lr=0.001, betas=(0.9, 0.98), eps=1e-8)
    for g in grads:
        adam.grad = g.clone()
        a.step()
    assert not torch.allclose(adam.data, ref[-1], atol=1e-6)


@pytest.mark.slow
def test_fairseq_train_with_radam_saves_and_resumes(data_bin, tmp_path):
    flags = [*TINY, "--encoder-layers", "2", "--decoder-layers", "2", "--admin", "--optimizer", "radam",
             "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-8"]
    first = train(data_bin, tmp_path / "ck", "deepnmt_transformer", flags, max_update=2)
    assert first.returncode == 0, first.stderr[-3000:]
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    state = load_checkpoint(str(tmp_path / "ck" / "checkpoint_last.pt"))
    assert state["cfg"]["optimizer"]["_name"] == "radam"
    assert all(v["step"] == 2 for v in state["last_optimizer_state"]["state"].values())
    resumed = train(data_bin, tmp_path / "ck", "deepnmt_transformer", flags, max_update=3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(r"@ 2 updates\)", resumed.stdout + resumed.stderr)
