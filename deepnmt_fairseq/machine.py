"""What a measurement or a run depends on beyond its command: the machine, in one place.

The benchmarks (speed, device check, deployment speed) and the evidence study record it next to
their numbers, and the quickstart reads it to estimate its own time before it starts.  Only the
standard library and torch (imported when called)."""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Dict, Optional

# the CPU's model name and vector extensions: the speed protocol's (one place; standard library)
from deepnmt_deploy.speed_protocol import cpu_model, vector_extensions  # noqa: F401


def cpu_kernels() -> str:
    """The instruction set torch's CPU kernels use here (``AVX512``, ``AVX2``, ``DEFAULT``...): one
    seeded command gives the same losses on one kind, and its speed differs between kinds."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cores() -> int:
    """The cores this process may run on."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def describe(device: Optional[object] = None) -> Dict[str, object]:
    """Versions, CPU (model, vector extensions, kernels, cores, torch threads) and, on CUDA, the GPU."""
    import torch

    info: Dict[str, object] = {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_model(),
                               "vector_extensions": vector_extensions(), "kernels": cpu_kernels(), "cores": cores(), "threads": torch.get_num_threads()}
    if device is not None:
        info["device"] = str(device)
    if torch.cuda.is_available() and (device is None or str(device).startswith("cuda")):
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    for module in ("fairseq", "ctranslate2"):
        with contextlib.suppress(ImportError):
            info[module] = __import__(module).__version__
    return info
