"""Packed copies of weight tensors, made once and rebuilt when their tensor changes.

A copy is rebuilt on a new storage or an in-place write (such as loading a checkpoint into
the same parameters). Each copy goes with its tensor (weakref.finalize), before the tensor's
id can be reused.
"""

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

P = TypeVar("P")


class PackedWeights(Generic[P]):
    """`pack(w)` for each weight tensor w, cached beside it."""

    def __init__(self, pack: Callable[[torch.Tensor], P]) -> None:
        self.pack = pack
        # id(weight) -> (its version and storage when packed, the packed copy)
        self.copies: dict[int, tuple[tuple[int, int], P]] = {}

    def __call__(self, w: torch.Tensor) -> P:
        # an inference tensor keeps no version counter (and is written only in inference mode)
        stamp = (-1 if w.is_inference() else w._version, w.data_ptr())
        hit = self.copies.get(id(w))
        if hit is None:
            weakref.finalize(w, self.copies.pop, id(w), None)
        if hit is None or hit[0] != stamp:
            hit = (stamp, self.pack(w))
            self.copies[id(w)] = hit
        return hit[1]
