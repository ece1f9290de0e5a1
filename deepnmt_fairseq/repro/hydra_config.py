"""``configs/<name>.yaml``: fairseq-hydra-train configs generated from the registry.

One file per training stage: ``<experiment>.yaml`` for single-stage experiments,
``<experiment>__<stage>.yaml`` for the train stages of multi-stage ones (SKD and student
extraction are not fairseq-train runs; ``deepnmt-repro train`` / ``scripts/train.sh`` runs them).

How they are made: the stage's fairseq-train command for the papers' 8 GPUs is parsed with
fairseq's own parser (plugin imported), and every option the command sets explicitly is
written under the config group fairseq's dataclasses put it in (``common``, ``dataset``,
``optimization``, ``checkpoint``, ``distributed_training``, ``task``, ``criterion``,
``optimizer``, ``lr_scheduler``); the model options go under ``model`` with
``_name: <named architecture>``: fairseq 0.12's ``build_model`` calls a legacy ``--arch``
function on the ``model`` config (``ARCH_CONFIG_REGISTRY``) to fill in its defaults, so a
named architecture plus overrides is how hydra expresses ``--arch X --flag v``.

Paths are environment interpolations resolved by fairseq-hydra-train, relative to the
directory it runs in (the repository root): ``${oc.env:DEEPNMT_DATA,work/data}``,
``${oc.env:DEEPNMT_CHECKPOINTS,work/checkpoints}``, user dir ``deepnmt_fairseq`` (the
package directory of the checkout).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import sys
from pathlib import Path
from typing import Dict, List, Tuple

from .commands import REFERENCE_GPUS, USER_DIR, Launch, Paths, Planner, RunOptions
from .spec import Experiment, TrainStage

DATA_PLACEHOLDER = "/@DEEPNMT_DATA@"
CKPT_PLACEHOLDER = "/@DEEPNMT_CHECKPOINTS@"
DATA_ENV = "${oc.env:DEEPNMT_DATA,work/data}"
CKPT_ENV = "${oc.env:DEEPNMT_CHECKPOINTS,work/checkpoints}"
GROUP_ORDER = ["common", "distributed_training", "dataset", "optimization", "checkpoint", "task", "model",
               "criterion", "optimizer", "lr_scheduler"]
_NAMED = {"--task": "task", "--arch": "model", "--criterion": "criterion", "--optimizer": "optimizer",
          "--lr-scheduler": "lr_scheduler"}
_DROP = {"--distributed-world-size"}  # fairseq-hydra-train uses every visible GPU


def config_name(exp: Experiment, stage: TrainStage) -> str:
    return exp.name if not exp.multi_stage else f"{exp.name}__{stage.name}"


def stage_argv(registry: Dict[str, Experiment], exp: Experiment, stage: TrainStage) -> Tuple[List[str], dict]:
    """The stage's fairseq-train argv on the reference 8-GPU node, with path placeholders."""
    paths = Paths(Path(DATA_PLACEHOLDER), Path(CKPT_PLACEHOLDER))
    opts = RunOptions(paths=paths, launch=Launch(world_size=REFERENCE_GPUS, gpus_found=REFERENCE_GPUS))
    planner = Planner(registry, exp, opts)
    argv, batch = planner.train_argv(stage)
    return argv[1:], batch  # without the executable


def _dataclass_fields(dc) -> Dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(dc)}


def _interpolated(f: dataclasses.Field) -> bool:
    return isinstance(f.default, str) and f.default.startswith("${")


@functools.lru_cache(maxsize=None)
def _group_fields_cached(key: Tuple[Tuple[str, str], ...]):
    return _group_fields(dict(key))


def _group_fields(names: Dict[str, str]) -> Dict[str, Dict[str, dataclasses.Field]]:
    """Fields of every config group (typed groups + the chosen task/criterion/optimizer/scheduler)."""
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY
    from fairseq.optim.lr_scheduler import LR_SCHEDULER_DATACLASS_REGISTRY
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    groups: Dict[str, Dict[str, dataclasses.Field]] = {}
    for f in dataclasses.fields(FairseqConfig):
        dc = f.default if isinstance(f.default, type) else (
            f.default_factory if f.default_factory is not dataclasses.MISSING else f.type)
        if dataclasses.is_dataclass(dc):
            groups[f.name] = _dataclass_fields(dc)
    registries = {"task": TASK_DATACLASS_REGISTRY, "criterion": CRITERION_DATACLASS_REGISTRY,
                  "optimizer": OPTIMIZER_DATACLASS_REGISTRY, "lr_scheduler": LR_SCHEDULER_DATACLASS_REGISTRY}
    for group, reg in registries.items():
        if names.get(group) in reg:
            groups[group] = _dataclass_fields(reg[names[group]])
    return groups


_MODEL_DESTS: Dict[type, set] = {}
_PARSERS: Dict[str, tuple] = {}


def model_dests(arch: str) -> set:
    """Options of the model class behind a named architecture (cached per class)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    cls = ARCH_MODEL_REGISTRY[arch]
    if cls not in _MODEL_DESTS:
        p = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
        cls.add_args(p)
        _MODEL_DESTS[cls] = {a.dest for a in p._actions if a.dest != "help"}
    return _MODEL_DESTS[cls]


def _parse(argv: List[str], names: Dict[str, str]):
    """fairseq's training parser, populated by ``parse_args_and_arch`` once per combination of
    model class / criterion / optimizer / scheduler / task and reused (all our experiments use
    one model class, so this is one parser per criterion)."""
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    key = "|".join([ARCH_MODEL_REGISTRY[names["model"]].__name__] +
                   [names.get(g, "") for g in ("criterion", "optimizer", "lr_scheduler", "task")])
    if key not in _PARSERS:
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, input_args=argv)
        actions = {s: a for a in parser._actions for s in a.option_strings}
        _PARSERS[key] = (parser, actions)
        return args, actions
    parser, actions = _PARSERS[key]
    return parser.parse_args(argv), actions


def _yaml_value(v):
    if isinstance(v, str):
        return v.replace(DATA_PLACEHOLDER, DATA_ENV).replace(CKPT_PLACEHOLDER, CKPT_ENV).replace(
            str(USER_DIR), "deepnmt_fairseq")
    if isinstance(v, tuple):
        return list(v)
    return v


def build(registry: Dict[str, Experiment], exp: Experiment, stage: TrainStage) -> Tuple[str, str]:
    """(file name, YAML text) of one stage."""
    import deepnmt_fairseq  # noqa: F401  (registers the plugin's models and criterion)
    import yaml

    argv, batch = stage_argv(registry, exp, stage)
    names = {grp: argv[argv.index(flag) + 1] for flag, grp in _NAMED.items() if flag in argv}
    args, actions = _parse(argv, names)
    groups = _group_fields_cached(tuple(sorted(names.items())))
    mdests = model_dests(names["model"])
    cfg: Dict[str, dict] = {g: {} for g in GROUP_ORDER}
    for g, n in names.items():
        cfg[g]["_name"] = n
    cfg["task"]["data"] = _yaml_value(argv[0])
    for tok in argv[1:]:
        if not tok.startswith("--") or tok in _NAMED or tok in _DROP:
            continue
        action = actions.get(tok)
        if action is None:
            raise ValueError(f"{exp.name}/{stage.name}: fairseq has no option {tok}")
        dest = action.dest
        value = _yaml_value(getattr(args, dest))
        placed = False
        for g in GROUP_ORDER:
            if g == "model":
                continue
            f = groups.get(g, {}).get(dest)
            if f is not None and not _interpolated(f):
                cfg[g][dest] = value
                placed = True
        if dest in mdests:
            cfg["model"][dest] = value
            placed = True
        if not placed:
            raise ValueError(f"{exp.name}/{stage.name}: cannot place {tok} in a config group")
    body = {g: cfg[g] for g in GROUP_ORDER if cfg[g]}
    # hydra's own files (.hydra/config.yaml, hydra_train.log) go next to the checkpoints, and the
    # working directory stays where fairseq-hydra-train was started (relative paths keep working).
    body["hydra"] = {"run": {"dir": "${checkpoint.save_dir}"}, "job": {"chdir": False}}
    name = config_name(exp, stage)
    header = [
        f"# {exp.title or exp.name}",
        f"# {exp.paper}",
        f"# experiment {exp.name}, stage {stage.name} - GENERATED by `deepnmt-repro write-configs`; "
        "do not edit (tests check that it matches the registry).",
        f"#   fairseq-hydra-train --config-dir configs --config-name {name}",
        "# from the repository root; DEEPNMT_DATA / DEEPNMT_CHECKPOINTS choose the data and checkpoint roots.",
        f"# Batch: {batch['tokens_per_update']} tokens per update = {REFERENCE_GPUS} GPUs x max_tokens "
        f"{batch['max_tokens']} x update_freq {batch['update_freq']}.  On W GPUs set",
        f"#   optimization.update_freq=[ceil({batch['tokens_per_update']} / ({batch['max_tokens']} * W))]",
        f"# (deepnmt-repro train {exp.name} does this for you, and runs every stage in order).",
    ]
    for ref_kind, ref in ([("data", stage.data)] if stage.data else []) + ([stage.init] if stage.init else []):
        header.append(f"# Needs {ref_kind}: stage '{ref.stage}' of {ref.experiment or exp.name} "
                      "(deepnmt-repro train runs it).")
    text = "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False, allow_unicode=True)
    return f"{name}.yaml", text


def resolved_model(registry: Dict[str, Experiment], exp: Experiment, stage: TrainStage) -> str:
    """The model a stage trains, after the named architecture's defaults (fairseq's parser)."""
    import copy

    import deepnmt_fairseq  # noqa: F401
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    argv, _ = stage_argv(registry, exp, stage)
    names = {grp: argv[argv.index(flag) + 1] for flag, grp in _NAMED.items() if flag in argv}
    args, _ = _parse(argv, names)
    a = copy.copy(args)
    ARCH_CONFIG_REGISTRY[a.arch](a)
    describe = getattr(ARCH_MODEL_REGISTRY[a.arch], "describe", None)  # e.g. rnmt_plus
    if describe is not None:
        return describe(a)
    extra = []
    if a.deep_memory == "msc":
        extra.append(f"MSC blocks {a.msc_block_layers}, fusion {a.msc_fusion}, context {a.msc_context_cell}")
    if a.cad_drop_depth:
        extra.append(f"CAD depth {a.cad_drop_depth} ratio {a.cad_drop_ratio:g}"
                     + (" (literal reading)" if str(getattr(a, "cad_reading", "consistent")) == "literal" else ""))
    if a.rpr_max_relative_position:
        extra.append(f"RPR k={a.rpr_max_relative_position}")
    for key, label in (("gp_group_size", "GP h"), ("gp_decoder_group_size", "GP dec h")):
        if getattr(a, key, 1) > 1:
            extra.append(f"{label}={getattr(a, key)}")
    if a.ssl_rate:
        extra.append(f"skip {a.ssl_mode} {a.ssl_rate:g}")
    if getattr(a, "encoder_layerdrop", 0):
        extra.append(f"LayerDrop {a.encoder_layerdrop:g}")
    return (f"{a.encoder_layers}+{a.decoder_layers} layers, d {a.encoder_embed_dim}, FFN {a.encoder_ffn_embed_dim}, "
            f"{a.encoder_attention_heads} heads, dropout {a.dropout:g} / attention {a.attention_dropout:g} / "
            f"ReLU {a.activation_dropout:g}, {'post' if a.post_norm else 'pre'}-norm, memory {a.deep_memory}"
            + (", shared embeddings" if a.share_all_embeddings else "") + "".join(f", {e}" for e in extra))


def generate_all(registry: Dict[str, Experiment]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for exp in registry.values():
        for stage in exp.train_stages:
            fname, text = build(registry, exp, stage)
            if fname in out:
                raise ValueError(f"two stages write {fname}")
            out[fname] = text
    return out


def write_configs(registry: Dict[str, Experiment], config_dir: Path) -> Tuple[int, int, List[str]]:
    """Write every config; returns (written, unchanged, stale files not in the registry)."""
    config_dir.mkdir(parents=True, exist_ok=True)
    wanted = generate_all(registry)
    written = unchanged = 0
    for fname, text in wanted.items():
        path = config_dir / fname
        if path.exists() and path.read_text(encoding="utf-8") == text:
            unchanged += 1
            continue
        tmp = path.with_suffix(".yaml.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        written += 1
    stale = sorted(p.name for p in config_dir.glob("*.yaml") if p.name not in wanted)
    return written, unchanged, stale


def check_configs(registry: Dict[str, Experiment], config_dir: Path) -> List[str]:
    """Differences between configs/ and what the registry generates (empty: in sync)."""
    wanted = generate_all(registry)
    problems = []
    for fname, text in wanted.items():
        path = config_dir / fname
        if not path.exists():
            problems.append(f"missing {path}")
        elif path.read_text(encoding="utf-8") != text:
            diff = difflib.unified_diff(path.read_text(encoding="utf-8").splitlines(), text.splitlines(),
                                        str(path), "generated", lineterm="", n=1)
            problems.append("\n".join(list(diff)[:20]))
    for p in sorted(config_dir.glob("*.yaml")):
        if p.name not in wanted:
            problems.append(f"{p} is not generated by the registry (stale)")
    return problems


@functools.lru_cache(maxsize=1)
def _schema():
    from fairseq.dataclass.configs import FairseqConfig
    from omegaconf import OmegaConf

    return OmegaConf.structured(FairseqConfig)


def validate(path: Path) -> None:
    """Check a config against fairseq's schema: the typed groups against FairseqConfig, task /
    criterion / optimizer / lr_scheduler against their registered dataclasses, model keys
    against the architecture's options.  Raises on any unknown key or bad value."""
    import deepnmt_fairseq  # noqa: F401
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
    from fairseq.dataclass.utils import merge_with_parent
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY
    from fairseq.optim.lr_scheduler import LR_SCHEDULER_DATACLASS_REGISTRY
    from fairseq.tasks import TASK_DATACLASS_REGISTRY
    from omegaconf import OmegaConf

    raw = OmegaConf.load(path)
    schema = _schema()
    groups = set(schema.keys())
    unknown = [k for k in raw.keys() if k != "hydra" and k not in groups]
    if unknown:
        raise ValueError(f"{path}: unknown config groups {unknown}")
    for group in raw.keys():
        if group != "hydra" and OmegaConf.is_config(schema._get_node(group)):
            OmegaConf.merge(schema[group], raw[group])  # unknown keys / wrong types raise here
    for group, reg in (("task", TASK_DATACLASS_REGISTRY), ("criterion", CRITERION_DATACLASS_REGISTRY),
                       ("optimizer", OPTIMIZER_DATACLASS_REGISTRY), ("lr_scheduler", LR_SCHEDULER_DATACLASS_REGISTRY)):
        sub = raw.get(group)
        if sub is None:
            raise ValueError(f"{path}: no {group} section")
        if sub._name not in reg:
            raise ValueError(f"{path}: unknown {group} {sub._name}")
        merge_with_parent(reg[sub._name](), sub)
    arch = raw.model._name
    if arch not in ARCH_MODEL_REGISTRY:
        raise ValueError(f"{path}: unknown architecture {arch}")
    unknown = set(raw.model.keys()) - model_dests(arch) - {"_name"}
    if unknown:
        raise ValueError(f"{path}: model options {sorted(unknown)} are not options of {arch}")


def main_write(registry, config_dir: Path) -> int:
    written, unchanged, stale = write_configs(registry, config_dir)
    print(f"{config_dir}: {written} written, {unchanged} unchanged", file=sys.stderr)
    if stale:
        print("not generated by the registry (remove them if the experiment was renamed): " + ", ".join(stale),
              file=sys.stderr)
    return 0


def main_check(registry, config_dir: Path) -> int:
    problems = check_configs(registry, config_dir)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} config(s) differ from the registry: run deepnmt-repro write-configs",
              file=sys.stderr)
        return 1
    print(f"{config_dir}: in sync with the registry", file=sys.stderr)
    return 0
