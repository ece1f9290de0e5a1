"""fairseq side of the analysis tools: load a checkpoint, score and translate sentences in-process.

Checkpoints are read through fairseq's loader after importing the plugin, i.e.
with ``weights_only=True`` and the plugin's allow-list (deepnmt_fairseq.checkpoint_safety).
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, Optional, Sequence, Tuple

import torch


def progress(msg: str, tool: str = "deepnmt") -> None:
    """The project's one log line (:func:`deepnmt_fairseq.jobs.stage.make_log`), on stderr."""
    from ..jobs.stage import make_log

    make_log(tool)(msg)


def pick_device(cpu: bool) -> torch.device:
    return torch.device("cuda" if (not cpu and torch.cuda.is_available()) else "cpu")


def load_model(path: str, data: Optional[str] = None, device: Optional[torch.device] = None,
               overrides: Optional[Dict] = None):
    """(model in eval mode on ``device``, task, cfg) of a fairseq checkpoint.

    ``data``: the binarized data directory (its dictionaries); default: the one stored in the checkpoint.
    """
    import deepnmt_fairseq  # noqa: F401  (registers the plugin, safe loading)
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such checkpoint: {path}")
    arg_overrides = dict(overrides or {})
    if data:
        arg_overrides["data"] = data
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=arg_overrides or None)
    model = models[0]
    model.eval()
    model.to(device or torch.device("cpu"))
    return model, task, cfg


def load_split(task, subset: str):
    try:
        task.load_dataset(subset, combine=False, epoch=1)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"cannot load the {subset!r} split of {task.cfg.data}: {e}") from e
    return task.dataset(subset)


def _batches(dataset, ids: Sequence[int], batch_size: int) -> Iterable[dict]:
    ids = sorted(ids, key=lambda i: (int(dataset.src_sizes[i]), i))
    for s in range(0, len(ids), batch_size):
        yield dataset.collater([dataset[i] for i in ids[s:s + batch_size]])


def _to(sample, device):
    from fairseq import utils

    return utils.move_to_cuda(sample, device=device) if device.type == "cuda" else sample


@torch.no_grad()
def sentence_nll(model, dataset, ids: Sequence[int], batch_size: int = 32,
                 device: torch.device = torch.device("cpu")) -> Dict[int, float]:
    """{id: -log P(y|x)}: teacher-forced NLL summed over the target tokens (EOS included), in nats,
    no label smoothing, model in eval mode (no dropout)."""
    out: Dict[int, float] = {}
    pad = dataset.tgt_dict.pad()
    for sample in _batches(dataset, ids, batch_size):
        sample = _to(sample, device)
        net_output = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True).float()
        target = sample["target"]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        nll = nll.masked_fill(target.eq(pad), 0.0).sum(-1)
        for sid, v in zip(sample["id"].tolist(), nll.tolist()):
            out[int(sid)] = float(v)
    return out


def generation_config(beam: int = 4, lenpen: float = 0.6, max_len_a: float = 1.2, max_len_b: int = 10):
    from fairseq.dataclass.configs import GenerationConfig

    cfg = GenerationConfig()
    cfg.beam, cfg.lenpen, cfg.max_len_a, cfg.max_len_b, cfg.nbest = beam, lenpen, max_len_a, max_len_b, 1
    return cfg


@torch.no_grad()
def translate(model, task, dataset, ids: Sequence[int], beam: int = 4, lenpen: float = 0.6,
              max_len_a: float = 1.2, max_len_b: int = 10, batch_size: int = 32,
              device: torch.device = torch.device("cpu"), log_every: int = 0, tool: str = "deepnmt"
              ) -> Dict[int, torch.Tensor]:
    """{id: best hypothesis token ids (with EOS)} by beam search (beam 1 = greedy)."""
    generator = task.build_generator([model], generation_config(beam, lenpen, max_len_a, max_len_b))
    out: Dict[int, torch.Tensor] = {}
    done = 0
    for sample in _batches(dataset, ids, batch_size):
        sample = _to(sample, device)
        hyps = task.inference_step(generator, [model], sample)
        for i, sid in enumerate(sample["id"].tolist()):
            out[int(sid)] = hyps[i][0]["tokens"].cpu()
        done += len(hyps)
        if log_every and (done // log_every) != ((done - len(hyps)) // log_every):
            progress(f"translated {done}/{len(ids)} sentences", tool)
    return out


def detok(dictionary, tokens, post_process: Optional[str]) -> str:
    """The token string with BPE removed (``--post-process`` as fairseq-generate: subword_nmt,
    sentencepiece, or a literal BPE separator such as '@@ ')."""
    return dictionary.string(tokens, post_process)


def model_depth(model) -> Tuple[int, int]:
    enc = getattr(getattr(model, "encoder", None), "layers", [])
    dec = getattr(getattr(model, "decoder", None), "layers", [])
    return len(enc), len(dec)


def memory_kind(model) -> str:
    opts = getattr(getattr(model, "encoder", None), "opts", None)
    return opts.deep_memory if opts is not None else "top"
