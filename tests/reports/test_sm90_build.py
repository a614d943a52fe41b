"""reports.bench.kernels.sm90_build: a kernel built for sm_90 on this machine (no GPU), its resources read back.

The suite runs Triton's interpreter (TRITON_INTERPRET=1), whose kernels cannot be built for a GPU, so the build runs
in a child process with it unset, as the register records run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import triton
import triton.language as tl

from reports.bench.kernels.sm90_build import build_resources

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
pytestmark = pytest.mark.skipif(not os.path.exists(CUOBJDUMP), reason="Triton's NVIDIA backend tools are not installed")


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    """out[row] = scale * sum(x[row, :n]) for one row a program, the whole row in one tile."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    values = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(values, axis=0) * scale)


def _build(block: int) -> dict[str, int]:
    return vars(
        build_resources(
            _row_sum_kernel, {"BLOCK": block}, {"out_ptr": "*fp32"}, num_warps=1, num_stages=1, float_args=("scale",)
        )
    )


def _built_in_child(blocks: list[int]) -> list[dict[str, int]]:
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    code = (
        "import json, sys\nfrom tests.reports.test_sm90_build import _build\n"
        f"json.dump([_build(b) for b in {blocks!r}], sys.stdout)"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert child.returncode == 0, child.stderr[-2000:]
    return json.loads(child.stdout)


def test_a_wider_tile_in_the_same_threads_takes_more_registers() -> None:
    """What the register records look for: a row tile 32 times wider in one warp's 32 threads holds more values a
    thread, so the build takes more registers; the narrow one spills nothing."""
    narrow, wide = _built_in_child([128, 4096])
    assert 0 < narrow["registers"] < wide["registers"] <= 255
    assert narrow["stack_bytes"] == 0


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's kernels are the bad input")
def test_an_interpreted_kernel_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="_row_sum_kernel.*TRITON_INTERPRET unset"):
        _build(128)
