"""Shared test setup: one torch thread (tiny tensors on 2 shared cores run faster that way)."""

from collections.abc import Iterator

import pytest
import torch

import kernels  # noqa: F401  (first: settles Triton's mode before torch._dynamo imports triton)


@pytest.fixture(autouse=True, scope="session")
def _single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
