"""Hypothesis strategies and settings shared by the kernel tests.

On CPU the kernels run through Triton's interpreter, which is slow: shapes stay small and
examples few (derandomized, so CI sees the same cases every run). On a GPU the same tests
draw more examples, and the `gpu`-marked tests add the large shapes.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, settings

from tests.fast.kernels.reference import ON_GPU

CPU_DTYPES = [torch.float32, torch.float16]
# bf16 runs only on the GPU (the interpreter cannot do bf16 arithmetic); those cases are marked gpu.
ALL_DTYPES = CPU_DTYPES + [torch.bfloat16]


def kernel_settings(cpu_examples: int, gpu_examples: int = 15) -> settings:
    return settings(
        max_examples=gpu_examples if ON_GPU else cpu_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def sequence_length(block_size: int, max_blocks: int) -> st.SearchStrategy[int]:
    """Lengths that hit the edges: 1, exact multiples of the block size, one past, and anything between."""
    return st.one_of(
        st.just(1),
        st.integers(1, max_blocks).map(lambda n: n * block_size),
        st.integers(1, max_blocks - 1).map(lambda n: n * block_size + 1),
        st.integers(1, max_blocks * block_size),
    )


def seeded_generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator
