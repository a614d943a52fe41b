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


def pdl_unsupported(device: torch.device) -> str | None:
    """Why programmatic dependent launch cannot run on `device`, or None: it needs a CUDA device of
    compute capability 9.0 or newer, and a Triton with griddepcontrol (tl.extra.cuda.gdc_wait)."""
    if device.type != "cuda":
        return f"programmatic dependent launch needs a CUDA device, not {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"programmatic dependent launch needs compute capability 9.0 or newer; {device} has {major}.{minor}"
    if getattr(getattr(tl.extra, "cuda", None), "gdc_wait", None) is None:
        return f"programmatic dependent launch needs a Triton with gdc_wait (this is {triton.__version__})"
    return None


def check_pdl_device(device: torch.device) -> None:
    """ConfigError, naming the reason, where programmatic dependent launch cannot run."""
    reason = pdl_unsupported(device)
    if reason is not None:
        raise ConfigError(reason)


def resolve_pdl(setting: bool | None, device: torch.device) -> bool:
    """EngineConfig.programmatic_dependent_launch on `device`: None (the default) is on wherever the
    device supports it; True insists (ConfigError where it cannot run); False is off."""
    if setting is None:
        return pdl_unsupported(device) is None
    if setting:
        check_pdl_device(device)
    return setting
