"""Session-wide test set-up shared by tests/ and fuzz/.

Triton reads TRITON_INTERPRET when a kernel is *defined* (at import of the module that
holds it), so it must be set here, before any test module imports fast.kernels.
On a machine without a GPU the kernels then run through Triton's CPU interpreter.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # The test models are tiny: extra intra-op threads only add contention (a 64x128 matmul was
    # 100x slower with 2 threads than with 1 on the 2-core CI machine).
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need CUDA; on a CPU machine they are reported as skipped, never passed."""
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (marker: gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
