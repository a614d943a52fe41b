"""Tensor parallelism's communication, all through torch.distributed.

Two process groups span the ranks:

    compute  the default group: NCCL on GPUs, gloo on the CPU. Carries the model's collectives
             (an all-reduce after each row-parallel matmul and after the embedding, the gather of
             the logits), under async scheduling rank 0's sampled tokens (`share_tokens`), and the
             start-up agreements. Bounded timeout.
    control  a gloo group on the CPU. Carries `StepChannel`: once per step rank 0 broadcasts a
             small header and its packed int32 input section (fast.input_batch), never per layer.
             The other ranks wait on it between steps, for as long as the engine idles, so its
             timeout is long; a dead rank 0 still ends the wait at once (the socket closes).

All-reduce paths (`Collectives.all_reduce`): on CUDA, messages of at most ONE_SHOT_MAX_BYTES go
through PyTorch's symmetric-memory one-shot all-reduce (`torch.ops.symm_mem.one_shot_all_reduce*`,
no NVLink multicast), when every rank can set it up and a probe sums correctly; everything else,
and everything where symmetric memory is unavailable, goes through NCCL; on the CPU through gloo.
Which path ran is reported by `Collectives.describe()`.

Fused path (`Collectives.all_reduce_add_rmsnorm`, `fused_norm=True`, where the one-shot path is set
up): the all-reduce after o_proj and after down is summed in one Triton kernel together with the
residual add + RMSNorm that follows it (fast/kernels/all_reduce_norm.py), on two regions of the same
symmetric buffer. That kernel has no closing barrier, so two calls on one region must be separated by
another collective of all ranks. The model makes it so: o_proj uses ATTENTION_REGION and down uses
MLP_REGION, so within a forward consecutive fused calls alternate, and the last layer's down, the
logits' gather and the next embedding's all-reduce lie between forwards.

Measured on two H200s (NVLink), bf16, inside a CUDA graph, when the issue was filed: [1, 4096]
one-shot 6.2 us against NCCL's 17-19 us; [256, 4096] (2 MiB) one-shot 35.5 us against NCCL's
18.7 us. ONE_SHOT_MAX_BYTES sits between them, at decode-batch sizes ([64, 4096] bf16).
"""

from __future__ import annotations

import enum
import importlib
import logging
import os
import types
import warnings
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from fast.kernels.add_rmsnorm import MAX_HIDDEN, add_rmsnorm
from fast.kernels.all_reduce_norm import MAX_ROWS, all_reduce_add_rmsnorm
from spec.errors import TwinferError

logger = logging.getLogger(__name__)

# NVLink multicast (NVLS in NCCL, multimem in symmetric memory) stays off on every rank.
COMMUNICATION_ENVIRONMENT = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
# With NCCL's default error handling a failed or timed-out collective kills the whole process;
# "clean up only" aborts the communicator and raises in the caller, so rank 0 can report it.
NCCL_ERROR_HANDLING = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
ONE_SHOT_MAX_BYTES = 512 * 1024
COMPUTE_TIMEOUT = timedelta(minutes=5)
CONTROL_TIMEOUT = timedelta(days=7)

ONE_SHOT = "symm_mem_one_shot"
FUSED = "fused_all_reduce_add_rmsnorm"
# The symmetric buffer: torch's one-shot staging area, then the fused kernel's two regions.
ATTENTION_REGION, MLP_REGION = 0, 1
SYMMETRIC_AREAS = 3

# Symmetric-memory rendezvous this process has made. torch (before the fix of pytorch#196082) keys
# each rendezvous's store exchange by a per-process sequence number, so ranks whose processes made
# different numbers of rendezvous read different keys and hang; and a group name reused after
# destroy_process_group can find stale per-name state. So the one-shot path is set up only where no
# rank's process has made one before: for the first tensor-parallel engine of a process (a later
# one runs every all-reduce on NCCL, and says so). Mirrors torch's own process-wide state, hence
# module state.
_rendezvous_count = 0


class TensorParallelError(TwinferError, RuntimeError):
    """A tensor-parallel rank failed (raised, was killed, or stopped answering); the engine is unusable."""


def set_communication_environment() -> None:
    """Before init_process_group, in every rank's process."""
    os.environ.update(COMMUNICATION_ENVIRONMENT)
    os.environ.setdefault(*NCCL_ERROR_HANDLING)


@dataclass
class ProcessGroups:
    rank: int
    world_size: int
    device: torch.device
    # None once destroyed: see destroy().
    compute: dist.ProcessGroup | None
    control: dist.ProcessGroup | None
    owns_world: bool  # this code initialised the default group (and so destroys it)

    @property
    def backend(self) -> str:
        return str(dist.get_backend(self.compute)) if self.compute is not None else "destroyed"

    def abort(self) -> None:
        """NCCL: abort the communicators, so that a GPU stream waiting for a dead peer returns.
        The groups are unusable afterwards. Nothing to do for gloo (a dead peer's socket closes)."""
        if self.device.type != "cuda" or not dist.is_initialized():
            return
        try:
            dist.distributed_c10d._abort_process_group(None if self.owns_world else self.compute)
        except Exception:  # the abort API is experimental: report, and let the timeout end the wait
            logger.warning("could not abort the NCCL process group", exc_info=True)

    def destroy(self) -> None:
        """Destroy the groups, then drop this process's references to them.

        destroy_process_group leaves a gloo group's worker threads running for as long as its
        ProcessGroup object lives. An engine still referenced at interpreter exit would then be
        finalised with those threads alive, and that can end the process in std::terminate (SIGABRT,
        see pytorch/pytorch#179291; it failed CI once, on a torchrun rank). So the objects go now."""
        try:
            if dist.is_initialized():  # else destroyed already, or aborted
                if self.control is not None:
                    dist.destroy_process_group(self.control)
                if self.owns_world:
                    dist.destroy_process_group()
        except Exception:  # a group whose peer died may refuse; the process is leaving it anyway
            logger.warning("could not destroy the tensor-parallel process groups cleanly", exc_info=True)
        finally:
            self.compute = self.control = None


def init_process_groups(
    rank: int, world_size: int, device: torch.device, init_method: str, timeout: timedelta = COMPUTE_TIMEOUT
) -> ProcessGroups:
    """Join the ranks (a collective: every rank calls it). Reuses a default group that the caller
    (e.g. a torchrun script) initialised already, if it spans exactly these ranks."""
    set_communication_environment()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns_world = not dist.is_initialized()
    if owns_world:
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
    elif dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise TensorParallelError(
            f"a process group of {dist.get_world_size()} ranks (this is rank {dist.get_rank()}) is already "
            f"initialised in this process; tensor parallelism over {world_size} ranks needs one of its own size"
        )
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return ProcessGroups(rank, world_size, device, dist.group.WORLD, control, owns_world)


# ----------------------------------------------------------------------------- model collectives


class Collectives:
    """The model's collectives over the compute group: sum of partial products, gather of the
    vocabulary-parallel logits, and integer agreements at start-up."""

    def __init__(
        self,
        groups: ProcessGroups,
        dtype: torch.dtype,
        vocab_size: int,
        allow_one_shot: bool = True,
        fused_norm: bool = False,
    ) -> None:
        """fused_norm: all_reduce_add_rmsnorm takes the fused kernel where the one-shot path is set up."""
        self.groups = groups
        self.vocab_size = vocab_size
        self.large_path = "nccl" if groups.device.type == "cuda" else "gloo"
        # All-reduce calls issued from Python, by path: eager steps, and each CUDA-graph capture once
        # (replays run the captured path without passing through here).
        self.calls: Counter[str] = Counter()
        self.one_shot: OneShotAllReduce | None = None
        self.fused: FusedAllReduceNorm | None = None
        self.one_shot_note = "off: not a CUDA device" if groups.device.type != "cuda" else "off: disabled"
        self.fused_note = "off: disabled" if not fused_norm else "off: needs the one-shot path"
        if allow_one_shot and groups.device.type == "cuda":
            self.one_shot, self.one_shot_note = OneShotAllReduce.create(self, dtype)
        if fused_norm and self.one_shot is not None:
            self.fused, self.fused_note = FusedAllReduceNorm.create(self, self.one_shot)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of a contiguous tensor (in place on the NCCL/gloo path)."""
        if self.one_shot is not None and self.one_shot.fits(tensor):
            self.calls[ONE_SHOT] += 1
            return self.one_shot(tensor)
        self.calls[self.large_path] += 1
        dist.all_reduce(tensor, group=self.groups.compute)
        return tensor

    def all_reduce_add_rmsnorm(
        self,
        term: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        *,
        region: int,
        pdl: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden = the sum over ranks of `term` (+ bias); returns (rmsnorm(hidden + residual) * weight,
        hidden + residual). One kernel when the fused path is on and the message fits; otherwise the
        all-reduce, the bias, then add_rmsnorm. region: ATTENTION_REGION or MLP_REGION (module doc)."""
        if self.fused is not None and self.fused.fits(term):
            self.calls[FUSED] += 1
            return self.fused(term, bias, residual, weight, eps, region, pdl)
        hidden = self.all_reduce(term)
        if bias is not None:
            hidden = hidden + bias
        return add_rmsnorm(hidden, residual, weight, eps, pdl=pdl)

    def gather_vocab(self, local: torch.Tensor) -> torch.Tensor:
        """[R, shard] logits of each rank's vocabulary rows -> [R, vocab_size] on every rank."""
        world = self.groups.world_size
        rows, shard = local.shape
        gathered = torch.empty((world * rows, shard), dtype=local.dtype, device=local.device)
        _all_gather(gathered, local.contiguous(), self.groups.compute)
        # Rank r's block holds vocabulary rows [r * shard, (r + 1) * shard); the padding past vocab_size goes.
        logits = gathered.view(world, rows, shard).permute(1, 0, 2).reshape(rows, world * shard)
        return logits[:, : self.vocab_size].contiguous()

    def share_tokens(self, tokens: torch.Tensor) -> None:
        """Rank 0's sampled tokens (int64 [n]) into `tokens` on every rank, queued on the device: the
        other ranks fill the next step's pending rows from them without waiting for the host."""
        dist.broadcast(tokens, src=0, group=self.groups.compute)

    def agree_min(self, value: int) -> int:
        """The smallest of every rank's value (a collective)."""
        tensor = torch.tensor([value], dtype=torch.int64, device=self.groups.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.groups.compute)
        return int(tensor.item())

    def all_agree(self, flag: bool) -> bool:
        return self.agree_min(int(flag)) == 1

    def describe(self) -> dict[str, object]:
        return {
            "world_size": self.groups.world_size,
            "backend": self.groups.backend,
            "small_all_reduce": ONE_SHOT if self.one_shot is not None else self.large_path,
            "large_all_reduce": self.large_path,
            "one_shot_max_bytes": self.one_shot.max_bytes if self.one_shot is not None else 0,
            "one_shot": self.one_shot_note,
            "fused_all_reduce_add_rmsnorm": self.fused_note,
            "all_reduce_calls_issued": dict(self.calls),
        }


def _all_gather(output: torch.Tensor, local: torch.Tensor, group: dist.ProcessGroup) -> None:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single; older versions have only the former.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, local, group=group)


class OneShotAllReduce:
    """Sum over ranks in one kernel on symmetric memory: each rank's input is copied into its own
    buffer, a barrier over the signal pads, then every rank reads all peers' buffers over NVLink
    and sums them in rank order; a closing barrier makes the buffer reusable by the next call."""

    def __init__(self, buffer: torch.Tensor, handle: object, group_name: str, max_bytes: int) -> None:
        self.buffer = buffer  # SYMMETRIC_AREAS areas of max_bytes; this path stages in the first
        self.handle = handle  # the rendezvous's handle: every rank's buffer and signal-pad addresses
        self.group_name = group_name
        self.max_bytes = max_bytes
        self.dtype = buffer.dtype
        ops = torch.ops.symm_mem
        # The copy into the buffer happens inside the kernel where torch has that variant.
        self._copy_in_kernel = hasattr(ops, "one_shot_all_reduce_copy_out")

    @classmethod
    def create(cls, collectives: Collectives, dtype: torch.dtype) -> tuple[OneShotAllReduce | None, str]:
        """The path, when every rank can set it up and a probe sums correctly; else None and why.
        Each step is agreed by all ranks, so they all take the same path."""
        global _rendezvous_count
        groups = collectives.groups
        local_reason = _one_shot_unsupported(dtype)
        if not collectives.all_agree(local_reason is None):
            return None, f"off: {local_reason or 'unsupported on another rank'}"
        if not collectives.all_agree(_rendezvous_count == 0):
            return None, "off: an earlier tensor-parallel engine of this process set up symmetric memory"
        try:
            import torch.distributed._symmetric_memory as symm_mem

            numel = SYMMETRIC_AREAS * ONE_SHOT_MAX_BYTES // dtype.itemsize
            buffer = symm_mem.empty(numel, dtype=dtype, device=groups.device)
            _rendezvous_count += 1
            handle = _rendezvous(symm_mem, buffer, groups.compute.group_name)
            instance: OneShotAllReduce | None = cls(buffer, handle, groups.compute.group_name, ONE_SHOT_MAX_BYTES)
            set_up = True
        except Exception as error:  # an alpha API: any failure means NCCL for every message
            logger.warning("symmetric memory unavailable, all-reduce through NCCL: %s", error)
            instance, set_up = None, False
        if not collectives.all_agree(set_up) or instance is None:
            return None, "off: symmetric-memory set-up failed on a rank"
        probe = torch.full((64,), float(groups.rank + 1), dtype=dtype, device=groups.device)
        expected = groups.world_size * (groups.world_size + 1) / 2
        correct = bool(torch.all(instance(probe) == expected).item())
        if not collectives.all_agree(correct):
            return None, "off: the one-shot probe summed wrongly on a rank"
        return instance, "on"

    def fits(self, tensor: torch.Tensor) -> bool:
        nbytes = tensor.numel() * tensor.element_size()
        # 16-byte multiples keep the kernel's vectorised loads aligned (hidden sizes always are).
        return tensor.dtype == self.dtype and nbytes <= self.max_bytes and nbytes % 16 == 0 and tensor.is_contiguous()

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        staged = self.buffer[: tensor.numel()].view(tensor.shape)
        out = torch.empty_like(tensor)
        ops = torch.ops.symm_mem
        if self._copy_in_kernel:
            ops.one_shot_all_reduce_copy_out(staged, tensor, "sum", self.group_name, out)
        else:
            staged.copy_(tensor)
            ops.one_shot_all_reduce_out(staged, "sum", self.group_name, out)
        return out


class FusedAllReduceNorm:
    """fast/kernels/all_reduce_norm.py on the one-shot path's symmetric buffer: two regions of
    ONE_SHOT_MAX_BYTES after torch's staging area, and the rendezvous's signal pads."""

    def __init__(self, one_shot: OneShotAllReduce, rank: int, world_size: int) -> None:
        device = one_shot.buffer.device
        handle = one_shot.handle
        # The regions are addressed from each rank's buffer start, and the kernel's flags are
        # 4-byte slots [row * world + rank] of the signal pads: both must hold as this assumes.
        if handle.buffer_ptrs[rank] != one_shot.buffer.data_ptr():
            raise RuntimeError("the symmetric buffer does not start where its handle says")
        pad_bytes, needed = getattr(handle, "signal_pad_size", None), MAX_ROWS * world_size * 4
        if pad_bytes is not None and pad_bytes < needed:
            raise RuntimeError(f"the signal pads hold {pad_bytes} bytes; the fused kernel needs {needed}")
        self.dtype = one_shot.dtype
        self.region_numel = one_shot.max_bytes // self.dtype.itemsize
        self.rank, self.world_size = rank, world_size
        self.buffer_ptrs = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device)
        self.signal_pad_ptrs = torch.tensor(handle.signal_pad_ptrs, dtype=torch.int64, device=device)

    @classmethod
    def create(cls, collectives: Collectives, one_shot: OneShotAllReduce) -> tuple[FusedAllReduceNorm | None, str]:
        """The path, when a probe on both regions gives every rank the right sum; else None and why."""
        groups = collectives.groups
        try:
            instance: FusedAllReduceNorm | None = cls(one_shot, groups.rank, groups.world_size)
            correct = all(instance.probe(region) for region in (ATTENTION_REGION, MLP_REGION))
        except Exception as error:  # a kernel that cannot compile or launch here: the unfused path
            logger.warning("the fused all-reduce + RMSNorm is unavailable: %s", error)
            instance, correct = None, False
        if not collectives.all_agree(correct) or instance is None:
            return None, "off: its probe failed on a rank"
        return instance, "on"

    def probe(self, region: int) -> bool:
        """Rank r contributes r + 1 to every element: the residual stream must become the exact sum."""
        device = self.buffer_ptrs.device
        term = torch.full((2, 64), float(self.rank + 1), dtype=self.dtype, device=device)
        residual = torch.zeros_like(term)
        weight = torch.ones(64, dtype=self.dtype, device=device)
        _, summed = self(term, None, residual, weight, 1e-6, region, False)
        return bool(torch.all(summed == self.world_size * (self.world_size + 1) / 2).item())

    def fits(self, term: torch.Tensor) -> bool:
        rows, hidden = term.shape
        return (
            term.dtype == self.dtype
            and rows <= MAX_ROWS
            and hidden <= MAX_HIDDEN
            and term.numel() <= self.region_numel
            and term.stride(1) == 1
        )

    def __call__(
        self,
        term: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        region: int,
        pdl: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if region not in (ATTENTION_REGION, MLP_REGION):
            raise ValueError(f"region must be ATTENTION_REGION or MLP_REGION, got {region!r}")
        return all_reduce_add_rmsnorm(
            term, bias, residual, weight, eps,
            buffer_ptrs=self.buffer_ptrs, signal_pad_ptrs=self.signal_pad_ptrs,
            region_offset=(1 + region) * self.region_numel, region_numel=self.region_numel,
            rank=self.rank, world_size=self.world_size, pdl=pdl,
        )  # fmt: skip


def _rendezvous(symm_mem: types.ModuleType, buffer: torch.Tensor, group_name: str) -> object:
    """The buffer's symmetric-memory handle (peers' buffer and signal-pad addresses)."""
    try:
        return symm_mem.rendezvous(buffer, group_name)
    except RuntimeError:
        # torch versions from before enable_symm_mem_for_group was deprecated need the group enabled first.
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is None:
            raise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(group_name)
        return symm_mem.rendezvous(buffer, group_name)


def _one_shot_unsupported(dtype: torch.dtype) -> str | None:
    """Why this process cannot run the one-shot path, or None."""
    if dtype not in (torch.float32, torch.bfloat16):  # the kernel dispatches on these two only
        return f"the one-shot kernel has no {dtype}"
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
    except ImportError as error:
        return f"torch.distributed._symmetric_memory cannot be imported ({error})"
    ops = torch.ops.symm_mem
    if not (hasattr(ops, "one_shot_all_reduce_out") or hasattr(ops, "one_shot_all_reduce_copy_out")):
        return "this torch has no torch.ops.symm_mem.one_shot_all_reduce_out"
    return None


# ----------------------------------------------------------------------------- per-step broadcast


class StepCommand(enum.IntEnum):
    STEP = 1
    STOP = 2


@dataclass(frozen=True)
class StepHeader:
    """What the other ranks need to replay rank 0's step from its packed input section."""

    command: StepCommand
    num_tokens: int = 0
    num_logit_rows: int = 0
    num_seqs: int = 0
    table_width: int = 0
    max_query_len: int = 0
    max_seq_len: int = 0  # keys of the step's longest sequence (the decode kernel's context)
    graph_size: int = 0  # > 0: replay the decode graph of this batch size; 0: an eager forward
    payload_len: int = 0  # int32 words: the packed input section, then 2 x num_pending
    # Token rows loaded as pending (the pairs follow the packed section), filled from the shared tokens.
    num_pending: int = 0
    # > 0: rank 0 shares this many sampled tokens after the step (Collectives.share_tokens), for the
    # pending rows of the step after it.
    num_shared: int = 0

    def words(self) -> list[int]:
        return [
            int(self.command),
            self.num_tokens,
            self.num_logit_rows,
            self.num_seqs,
            self.table_width,
            self.max_query_len,
            self.max_seq_len,
            self.graph_size,
            self.payload_len,
            self.num_pending,
            self.num_shared,
        ]

    @classmethod
    def from_words(cls, words: list[int]) -> StepHeader:
        return cls(StepCommand(words[0]), *words[1:])


HEADER_WORDS = len(StepHeader(StepCommand.STOP).words())
# One fixed-size message carries the header and, for small steps (decode batches), the whole payload.
MESSAGE_WORDS = 1024
INLINE_WORDS = MESSAGE_WORDS - HEADER_WORDS


class StepChannel:
    """Rank 0 -> every other rank, on the control group: one broadcast per step (two when the
    packed inputs exceed INLINE_WORDS)."""

    def __init__(self, groups: ProcessGroups) -> None:
        self.groups = groups
        self._message = torch.zeros(MESSAGE_WORDS, dtype=torch.int32)

    def send(self, header: StepHeader, payload: torch.Tensor | None = None) -> None:
        """Rank 0. payload: int32 CPU tensor of header.payload_len words."""
        message = self._message
        message[:HEADER_WORDS] = torch.tensor(header.words(), dtype=torch.int32)
        inline = min(header.payload_len, INLINE_WORDS)
        if inline:
            message[HEADER_WORDS : HEADER_WORDS + inline] = payload[:inline]
        dist.broadcast(message, src=0, group=self.groups.control)
        if header.payload_len > inline:
            dist.broadcast(payload[inline : header.payload_len], src=0, group=self.groups.control)

    def receive(self, payload: torch.Tensor) -> StepHeader:
        """Other ranks: waits for rank 0's next message; fills payload[:payload_len]."""
        message = self._message
        dist.broadcast(message, src=0, group=self.groups.control)
        header = StepHeader.from_words(message[:HEADER_WORDS].tolist())
        inline = min(header.payload_len, INLINE_WORDS)
        if inline:
            payload[:inline] = message[HEADER_WORDS : HEADER_WORDS + inline]
        if header.payload_len > inline:
            dist.broadcast(payload[inline : header.payload_len], src=0, group=self.groups.control)
        return header

    def send_stop(self) -> None:
        self.send(StepHeader(StepCommand.STOP))
