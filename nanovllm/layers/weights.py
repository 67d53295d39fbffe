"""What every parameter's weight_loader shares: the check that a checkpoint tensor has the
full, unsharded shape the layer expects, the plain copy, and where a rank's slice goes
(`Placement`, `copy_placed`: the linear layers' sharding)."""
from dataclasses import dataclass

import torch
from torch import nn


class CheckpointTensorError(ValueError):
    """A checkpoint tensor unfit for its parameter; the loader adds its name and file."""


class WeightShapeError(CheckpointTensorError):
    """A checkpoint tensor's full shape differs from the one config.json implies."""

    def __init__(self, shape: tuple, expected: tuple):
        self.shape, self.expected = tuple(shape), tuple(expected)
        super().__init__(f"has shape {list(self.shape)}, config.json implies "
                         f"{list(self.expected)}")


def check_weight_shape(loaded: torch.Tensor, expected) -> None:
    """Refuse `loaded` unless its shape is `expected` (the full, unsharded shape).

    Needed because `copy_` broadcasts and `narrow` only sees one dimension: a wrong tensor
    would load silently or fail with an index error naming neither tensor nor file.
    """
    if tuple(loaded.shape) != tuple(expected):
        raise WeightShapeError(loaded.shape, expected)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Plain copy for parameters that are neither sharded nor packed."""
    check_weight_shape(loaded, param.shape)
    param.data.copy_(loaded)


@dataclass(frozen=True)
class Placement:
    """A checkpoint weight's slice [src, src + size) along `dim` (0: output rows, 1: input
    columns; the full tensor has `full` there) goes to [dst, dst + size) of the parameter."""

    dim: int
    full: int
    src: int
    dst: int
    size: int


def copy_placed(param: torch.Tensor, loaded: torch.Tensor, p: Placement) -> None:
    """Check `loaded` is the full tensor the placement expects, then copy this rank's slice.

    A 1-D tensor (a bias, per-row scales) of a layer split along its input (p.dim == 1) is
    not split: it is copied whole."""
    if param.dim() == 1 and p.dim == 1:
        check_weight_shape(loaded, param.shape)
        param.data.copy_(loaded)
        return
    expected = list(param.shape)
    expected[p.dim] = p.full
    check_weight_shape(loaded, expected)
    param.data.narrow(p.dim, p.dst, p.size).copy_(loaded.narrow(p.dim, p.src, p.size))
