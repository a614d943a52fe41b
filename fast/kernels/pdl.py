"""Programmatic dependent launch (PDL, Hopper and newer): a kernel may start while the one before it in
the stream is still finishing.

At batch-1 decode a layer is a chain of small kernels (norm, GEMV, q/k norm + RoPE + KV store,
attention split and reduce, GEMV, norm, GEMV, SiLU, GEMV), each a few microseconds, so the time
between one kernel's last blocks and the next kernel's first ones is a visible share of the step.
With PDL a kernel launched with `launch_pdl=True` may be scheduled once its predecessor has called
`griddepcontrol.launch_dependents` (or exited); it then blocks in `griddepcontrol.wait` until the
predecessor has finished and its writes are visible.

The rule every kernel here follows is the simplest safe one: `wait_then_release(USE_PDL)` is the
first thing it does, before any load or store, so nothing it reads or writes can race with the
kernel before it (nor with the one after it, which waits in turn), and it releases its dependents at
once. What overlaps is launch, block scheduling and the predecessor's tail, never memory traffic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from spec.errors import ConfigError


@triton.jit
def wait_then_release(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # the previous kernel has finished and its writes are visible
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel may be scheduled from now on


def check_pdl_device(device: torch.device) -> None:
    """Programmatic dependent launch needs a CUDA device of compute capability 9.0 or newer."""
    if device.type != "cuda":
        raise ConfigError(f"programmatic dependent launch needs a CUDA device, not {device.type}")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        raise ConfigError(
            f"programmatic dependent launch needs compute capability 9.0 or newer; {device} has {major}.{minor}"
        )
    if getattr(getattr(tl.extra, "cuda", None), "gdc_wait", None) is None:
        raise ConfigError(f"programmatic dependent launch needs a Triton with gdc_wait (this is {triton.__version__})")
