"""In-process tiny trained models and fairseq-generate's search, for the deployment tests
and the deployment benchmark (no subprocess: CI time).

``train_tiny`` trains a model of the plugin for a few hundred Adam updates on a binarized
corpus and writes a normal fairseq checkpoint (cfg + model), so the export reads it as it
reads one written by fairseq-train.  ``fairseq_generate`` runs fairseq's own
``SequenceGenerator`` through ``task.inference_step``, exactly as ``fairseq-generate`` does,
and returns the hypotheses as subword strings by sentence id.  ``wheels_of_installed`` rebuilds
installed distributions as wheels, for a fresh environment that installs without a network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

from fairseq_helpers import TINY, USER_DIR


def parse_train_args(data_bin: Path, flags: Sequence[str]):
    from fairseq import options

    parser = options.get_training_parser()
    argv = [str(data_bin), "--user-dir", USER_DIR, "--task", "translation", "--cpu",
            "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "600", "--seed", "1", *map(str, flags)]
    if "--arch" not in flags:
        argv += ["--arch", "deepnmt_transformer"]
    return options.parse_args_and_arch(parser, argv)


def train_tiny(data_bin: Path, out: Path, flags: Sequence[str] = (), updates: int = 200, width=TINY,
               init_from: Path = None) -> Path:
    """Train for ``updates`` steps (label-smoothed CE 0.1, Adam) and save ``out`` (a checkpoint).

    ``init_from``: start from the weights of that checkpoint where names and shapes match
    (a variant fine-tuned from a base model, so every variant is trained at a small cost)."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    import deepnmt_fairseq  # noqa: F401

    args = parse_train_args(data_bin, [*width, *flags])
    torch.manual_seed(1)
    task = tasks.setup_task(args)
    task.load_dataset("train")
    model = task.build_model(args)
    if init_from is not None:
        from deepnmt_fairseq.checkpoint_safety import load_checkpoint

        own = model.state_dict()
        base = {k: v for k, v in load_checkpoint(str(init_from))["model"].items()
                if k in own and own[k].shape == v.shape}
        model.load_state_dict(base, strict=False)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=600, seed=1).next_epoch_itr(shuffle=True)
    step, epoch = 0, 1
    pad = task.target_dictionary.pad()
    while step < updates:
        for sample in itr:
            if step >= updates:
                break
            if hasattr(model, "set_num_updates"):
                model.set_num_updates(step)
            net_out = model(**sample["net_input"])
            lprobs = model.get_normalized_probs(net_out, log_probs=True).view(-1, len(task.target_dictionary))
            target = sample["target"].view(-1)
            keep = target.ne(pad)
            nll = -lprobs[keep].gather(1, target[keep].unsqueeze(1)).squeeze(1)
            smooth = -lprobs[keep].mean(1)
            loss = (0.9 * nll + 0.1 * smooth).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        epoch += 1
        itr = task.get_batch_iterator(task.dataset("train"), max_tokens=600, seed=epoch).next_epoch_itr(shuffle=True)
    if hasattr(model, "set_num_updates"):
        model.set_num_updates(step)
    cfg = convert_namespace_to_omegaconf(args)
    state = {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "Adam",
                               "lr_scheduler_state": {"best": None}, "num_updates": step}],
        "extra_state": {},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    return out


def fairseq_generate(model, task, subset="test", beam=5, lenpen=1.0, max_len_b=200, batch_tokens=4000
                     ) -> Tuple[Dict[int, str], Dict[int, str], Dict[int, str]]:
    """(sources, hypotheses, references) as subword strings by sentence id, through
    fairseq-generate's own path (``task.build_generator`` + ``task.inference_step``)."""
    from argparse import Namespace

    task.load_dataset(subset)
    gen = task.build_generator([model], Namespace(beam=beam, lenpen=lenpen, max_len_a=0, max_len_b=max_len_b,
                                                  min_len=1, unkpen=0, sampling=False, nbest=1))
    itr = task.get_batch_iterator(task.dataset(subset), max_tokens=batch_tokens,
                                  max_positions=model.max_positions()).next_epoch_itr(shuffle=False)
    src_d, tgt_d = task.source_dictionary, task.target_dictionary
    srcs, hyps, refs = {}, {}, {}
    model.eval()
    with torch.no_grad():
        for sample in itr:
            out = task.inference_step(gen, [model], sample)
            for k, sid in enumerate(sample["id"].tolist()):
                src = sample["net_input"]["src_tokens"][k]
                srcs[sid] = src_d.string(src[src.ne(src_d.pad())])
                refs[sid] = tgt_d.string(sample["target"][k][sample["target"][k].ne(tgt_d.pad())])
                hyps[sid] = tgt_d.string(out[k][0]["tokens"].int().cpu())
    return srcs, hyps, refs


def bleu(hyps: List[str], refs: List[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True).score


def wheels_of_installed(requirements, dest: Path) -> List[str]:
    """Rebuild, from this environment's installed files, the wheels of the distributions that
    ``requirements`` (``Requires-Dist`` strings) need, transitively, into ``dest``: a fresh
    environment then installs them with ``pip install --no-index --find-links dest`` (no
    download; the versions are the ones tested here).  Returns the distributions' names.

    Each wheel holds the files its installation recorded (``RECORD``) inside site-packages,
    its ``.dist-info`` with a new ``RECORD``, and the original ``WHEEL`` tags; console scripts
    are remade by pip from ``entry_points.txt``."""
    import base64
    import hashlib
    import re
    import zipfile
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = [Requirement(r) for r in requirements]
    found = {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        dist = metadata.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), (str(req), dist.version)
        assert dist.files, f"{req.name} {dist.version} has no RECORD: cannot be rebuilt as a wheel"
        found[name] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    dest.mkdir(parents=True, exist_ok=True)
    for dist in found.values():
        files = [f for f in dist.files if ".." not in f.parts and "__pycache__" not in f.parts]
        info = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
        wheel_meta = Path(dist.locate_file(f"{info}/WHEEL")).read_text()
        tag = next(line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag:"))
        wname = f"{re.sub(r'[-_.]+', '_', dist.metadata['Name'])}-{dist.version}-{tag}.whl"
        record = []
        with zipfile.ZipFile(dest / wname, "w", zipfile.ZIP_STORED) as z:
            for f in files:
                if f.parts[0] == info and f.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                    continue
                path = Path(dist.locate_file(f))
                data = path.read_bytes()
                z.writestr(zipfile.ZipInfo.from_file(path, str(f)), data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                record.append(f"{f},sha256={digest},{len(data)}")
            record.append(f"{info}/RECORD,,")
            z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return sorted(found)
