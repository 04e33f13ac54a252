"""Triton's mode, compiled or interpreted, which is fixed when triton is first imported.

`triton.jit` (triton.language's own helpers included) picks compiler or interpreter from
TRITON_INTERPRET when the decorator runs. Importing this module (every import of `kernels`
does) therefore defaults TRITON_INTERPRET=1 where no CUDA device exists, so that Triton
kernels run on CPU tensors; an explicit setting is kept. That only works if `kernels` is
imported before triton is: torch._dynamo imports triton, and transformers' models import
torch._dynamo, so a process that loads those first gets compiled mode (and a clear error
from check_device when it hands Triton CPU tensors).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def interpreting() -> bool:
    """Whether triton's jitted functions were built for the interpreter."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.cdiv, InterpretedFunction)


def check_device(device: torch.device) -> None:
    """Refuse CPU tensors when triton was imported in compiled mode (it cannot run them)."""
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            "Triton kernels on CPU tensors need Triton's interpreter, but triton was imported "
            "in compiled mode (torch._dynamo imports it, and so do transformers' models): "
            "import kernels first, or set TRITON_INTERPRET=1 before triton is first imported"
        )
