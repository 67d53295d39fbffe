"""What every parameter's weight_loader shares: the check that a checkpoint tensor has the
full, unsharded shape the layer expects, and the plain copy."""
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
