"""Group-permutation training, GP (Li et al. 2021, "Group-Permutation Training").

The N layers of a stack are split into M contiguous groups of h = N / M layers.
In every training forward pass each group computes its layers in an order drawn
uniformly from all h! permutations, independently per group, from torch's
global RNG.  Evaluation and inference use the original order.
"""

from __future__ import annotations

from typing import List

import torch


def check_group_size(num_layers: int, group_size: int, flag: str = "--gp-group-size") -> None:
    if group_size < 1:
        raise ValueError(f"{flag} must be >= 1, got {group_size}")
    if num_layers % group_size != 0:
        raise ValueError(
            f"{flag}={group_size} does not divide the number of layers ({num_layers}): "
            f"GP needs contiguous groups of equal size h = N / M"
        )


def layer_order(num_layers: int, group_size: int, training: bool) -> List[int]:
    """Computation order of the layers for one forward pass."""
    if not training or group_size <= 1:
        return list(range(num_layers))
    check_group_size(num_layers, group_size)
    order: List[int] = []
    for start in range(0, num_layers, group_size):
        perm = torch.randperm(group_size).tolist()
        order.extend(start + i for i in perm)
    return order
