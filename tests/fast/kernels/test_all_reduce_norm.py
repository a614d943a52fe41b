"""all_reduce_add_rmsnorm: the one-shot all-reduce fused with the residual add + RMSNorm after it.

One rank on the CPU (Triton's interpreter) or GPU: the arithmetic and the staging, and the argument
checks. Several ranks on one GPU: each rank's kernel on its own CUDA stream of one process, every
rank's buffer and signal pad a plain allocation of that GPU (the barrier and the peer reads are the
same code; only NVLink is missing). Two ranks on two GPUs: two processes over PyTorch's symmetric
memory, as the engine runs it (it refuses two ranks' allocations on one GPU). Every result is
compared, bit for bit, with the unfused sequence computed locally: sum in rank order in fp32 and
round, add the bias, add_rmsnorm. On one GPU also the bounded wait: a peer that never arrives makes the
kernel trap after its timeout, a late one within it does not.
"""

from __future__ import annotations

import os
import socket
import traceback
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing

from fast.kernels.add_rmsnorm import add_rmsnorm
from fast.kernels.all_reduce_norm import MAX_ROWS, all_reduce_add_rmsnorm
from tests.fast.kernels.reference import DEVICE

EPS = 1e-6


def _randn(seed: int, *shape: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype=dtype, device=device)


def _unfused(
    partials: list[torch.Tensor], bias: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    total = torch.zeros_like(partials[0], dtype=torch.float32)
    for term in partials:  # rank order
        total += term.float()
    hidden = total.to(partials[0].dtype)
    if bias is not None:
        hidden = hidden + bias
    return add_rmsnorm(hidden, residual, weight, EPS)


def _one_rank_pointers(buffer: torch.Tensor, pad: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "buffer_ptrs": torch.tensor([buffer.data_ptr()], dtype=torch.int64, device=buffer.device),
        "signal_pad_ptrs": torch.tensor([pad.data_ptr()], dtype=torch.int64, device=buffer.device),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_one_rank_equals_the_unfused_sequence_bit_for_bit(dtype: torch.dtype, with_bias: bool) -> None:
    rows, hidden, offset = 3, 40, 7  # a hidden size that is not a power of two: masked columns
    buffer = torch.zeros(offset + rows * hidden, dtype=dtype, device=DEVICE)
    pad = torch.zeros(rows, dtype=torch.int32, device=DEVICE)
    partial, residual = (
        _randn(1, rows, hidden, dtype=dtype, device=DEVICE),
        _randn(2, rows, hidden, dtype=dtype, device=DEVICE),
    )
    weight = _randn(3, hidden, dtype=dtype, device=DEVICE)
    bias = _randn(4, hidden, dtype=dtype, device=DEVICE) if with_bias else None
    out, residual_out = all_reduce_add_rmsnorm(
        partial, bias, residual, weight, EPS, **_one_rank_pointers(buffer, pad),
        region_offset=offset, region_numel=rows * hidden, rank=0, world_size=1,
    )  # fmt: skip
    expected_out, expected_residual = _unfused([partial], bias, residual, weight)
    assert torch.equal(out, expected_out)
    assert torch.equal(residual_out, expected_residual)
    assert torch.equal(buffer[offset:].view(rows, hidden), partial), "the term is staged in the rank's region"
    assert not pad.any(), "every flag is lowered again after the call"


def test_arguments_are_checked_by_name() -> None:
    buffer, pad = torch.zeros(64, device=DEVICE), torch.zeros(8, dtype=torch.int32, device=DEVICE)
    pointers = _one_rank_pointers(buffer, pad)
    partial, weight = torch.zeros(2, 8, device=DEVICE), torch.ones(8, device=DEVICE)

    def call(**changes: object) -> None:
        arguments: dict[str, object] = {
            "partial": partial, "bias": None, "residual": torch.zeros_like(partial), "weight": weight, "eps": EPS,
            **pointers, "region_offset": 0, "region_numel": 16, "rank": 0, "world_size": 1,
        }  # fmt: skip
        arguments.update(changes)
        all_reduce_add_rmsnorm(**arguments)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="residual must have shape"):
        call(residual=torch.zeros(3, 8, device=DEVICE))
    with pytest.raises(ValueError, match="the region holds 15"):
        call(region_numel=15)
    with pytest.raises(ValueError, match="at most MAX_ROWS"):
        rows = torch.zeros(MAX_ROWS + 1, 8, device=DEVICE)
        call(partial=rows, residual=rows, region_numel=10**6)
    with pytest.raises(ValueError, match="buffer_ptrs must have shape"):
        call(world_size=2, rank=1)
    with pytest.raises(ValueError, match="rank must be in"):
        call(rank=1)
    with pytest.raises(TypeError, match="signal_pad_ptrs must have dtype"):
        call(signal_pad_ptrs=pointers["signal_pad_ptrs"].to(torch.int32))
    for timeout in (0, -1.0, True, "30"):
        with pytest.raises(ValueError, match="barrier_timeout_s must be a positive number of seconds"):
            call(barrier_timeout_s=timeout)


# ----------------------------------------------------------------------------- several ranks on CUDA

HIDDEN = 4096
ROW_COUNTS = (1, 5, MAX_ROWS)
GRAPH_CALLS, GRAPH_REPLAYS = 4, 8
BOUND_S = 90  # a barrier that never opens hangs its kernel: the checks run in a child process


@dataclass(frozen=True)
class Case:
    """One call; its inputs come from `seed`, the same on every rank except each rank's partial."""

    seed: int
    rows: int
    region: int
    with_bias: bool

    def inputs(self, rank: int, world: int, device: torch.device) -> dict[str, object]:
        partials = [_randn(self.seed * 100 + q, self.rows, HIDDEN, dtype=DTYPE, device=device) for q in range(world)]
        return {
            "partials": partials,
            "partial": partials[rank],
            "residual": _randn(self.seed * 100 + 50, self.rows, HIDDEN, dtype=DTYPE, device=device),
            "weight": _randn(self.seed * 100 + 51, HIDDEN, dtype=DTYPE, device=device),
            "bias": _randn(self.seed * 100 + 52, HIDDEN, dtype=DTYPE, device=device) if self.with_bias else None,
            # Allocated before any rank's kernel runs: nothing is allocated while a barrier waits.
            "out": torch.empty(self.rows, HIDDEN, dtype=DTYPE, device=device),
            "residual_out": torch.empty(self.rows, HIDDEN, dtype=DTYPE, device=device),
        }


DTYPE = torch.bfloat16
REGION_NUMEL = MAX_ROWS * HIDDEN


def _eager_cases() -> list[tuple[Case, bool]]:
    cases, seed = [], 0
    for pdl in (False, True):
        for rows in ROW_COUNTS:
            for region in (0, 1):
                for with_bias in (False, True):
                    seed += 1
                    cases.append((Case(seed, rows, region, with_bias), pdl))
    return cases


def _graph_cases(replay: int) -> list[Case]:
    """Calls on alternating regions, as the engine's layers use them, each with new inputs per replay."""
    return [Case(1000 + 10 * replay + i, 1, i % 2, i == 0) for i in range(GRAPH_CALLS)]


def _mismatches(got: tuple[torch.Tensor, torch.Tensor], values: dict[str, object]) -> int:
    expected = _unfused(values["partials"], values["bias"], values["residual"], values["weight"])
    return sum(int((a != b).sum()) for a, b in zip(got, expected, strict=True))


class RankCalls:
    """One rank's view: its pointers to every rank's buffer and pad, and its fused calls."""

    def __init__(self, rank: int, world: int, buffer_ptrs: torch.Tensor, signal_pad_ptrs: torch.Tensor) -> None:
        self.rank, self.world = rank, world
        self.pointers = {"buffer_ptrs": buffer_ptrs, "signal_pad_ptrs": signal_pad_ptrs}

    def __call__(self, case: Case, values: dict[str, object], pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return all_reduce_add_rmsnorm(
            values["partial"], values["bias"], values["residual"], values["weight"], EPS,
            region_offset=case.region * REGION_NUMEL, region_numel=REGION_NUMEL, rank=self.rank,
            world_size=self.world, out=values["out"], residual_out=values["residual_out"], pdl=pdl, **self.pointers,
        )  # fmt: skip


def _refill(captured: list[dict[str, object]], fresh: list[dict[str, object]]) -> None:
    for into, values in zip(captured, fresh, strict=True):
        for name in ("partial", "residual", "weight", "bias"):
            if into[name] is not None:
                into[name].copy_(values[name])
        into["partials"] = values["partials"]


def _streams_check(world: int) -> dict[str, int]:
    """Every rank on its own stream of one GPU; eager calls, then a graph with a branch per rank."""
    device = torch.device("cuda", 0)
    buffers = [torch.zeros(2 * REGION_NUMEL, dtype=DTYPE, device=device) for _ in range(world)]
    pads = [torch.zeros(MAX_ROWS * world, dtype=torch.int32, device=device) for _ in range(world)]
    buffer_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64, device=device)
    ranks = [RankCalls(q, world, buffer_ptrs, pad_ptrs) for q in range(world)]
    streams = [torch.cuda.Stream(device) for _ in range(world)]
    report: dict[str, int] = {}
    for case, pdl in _eager_cases():
        values = [case.inputs(q, world, device) for q in range(world)]
        torch.cuda.synchronize(device)
        results = []
        for q in range(world):
            with torch.cuda.stream(streams[q]):
                results.append(ranks[q](case, values[q], pdl))
        torch.cuda.synchronize(device)
        report[f"eager {case} pdl={pdl}"] = sum(_mismatches(results[q], values[q]) for q in range(world))
    captured = [[case.inputs(q, world, device) for case in _graph_cases(-1)] for q in range(world)]
    torch.cuda.synchronize(device)
    graph, main = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    with torch.cuda.graph(graph, stream=main):
        outputs = []
        for q in range(world):  # fork: one branch per rank, joined at the end of the capture
            streams[q].wait_stream(main)
            with torch.cuda.stream(streams[q]):
                outputs.append([ranks[q](c, v, True) for c, v in zip(_graph_cases(-1), captured[q], strict=True)])
        for stream in streams:
            main.wait_stream(stream)
    for replay in range(GRAPH_REPLAYS):
        for q in range(world):
            _refill(captured[q], [case.inputs(q, world, device) for case in _graph_cases(replay)])
        torch.cuda.synchronize(device)
        graph.replay()
        torch.cuda.synchronize(device)
        report[f"graph replay {replay}"] = sum(
            _mismatches(got, values) for q in range(world) for got, values in zip(outputs[q], captured[q], strict=True)
        )
    if any(int(pad.abs().sum()) for pad in pads):
        report["flags left raised"] = 1
    return report


def _processes_check(rank: int, world: int) -> dict[str, int]:
    """This process's rank on its own GPU, over PyTorch's symmetric memory (as the engine runs it)."""
    import torch.distributed._symmetric_memory as symm_mem

    from fast.parallel import _rendezvous

    device = torch.device("cuda", rank)
    buffer = symm_mem.empty(2 * REGION_NUMEL, dtype=DTYPE, device=device)
    handle = _rendezvous(symm_mem, buffer, dist.group.WORLD.group_name)
    calls = RankCalls(
        rank,
        world,
        torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device),
        torch.tensor(handle.signal_pad_ptrs, dtype=torch.int64, device=device),
    )
    report: dict[str, int] = {}
    for case, pdl in _eager_cases():
        values = case.inputs(rank, world, device)
        report[f"eager {case} pdl={pdl}"] = _mismatches(calls(case, values, pdl), values)
    captured = [case.inputs(rank, world, device) for case in _graph_cases(-1)]
    stream = torch.cuda.Stream(device)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outputs = [calls(c, v, True) for c, v in zip(_graph_cases(-1), captured, strict=True)]
    for replay in range(GRAPH_REPLAYS):
        _refill(captured, [case.inputs(rank, world, device) for case in _graph_cases(replay)])
        torch.cuda.synchronize(device)
        graph.replay()
        torch.cuda.synchronize(device)
        report[f"graph replay {replay}"] = sum(_mismatches(got, v) for got, v in zip(outputs, captured, strict=True))
    return report


def _peer_check(delay_s: float | None, timeout_s: float) -> dict[str, object]:
    """Rank 0 of two on one GPU calls the kernel; rank 1 calls it delay_s later on another stream (None:
    never). Reports whether the host's wait raised, after how long, and the result's mismatches."""
    import time

    device, world, case = torch.device("cuda", 0), 2, Case(7, 3, 0, False)
    buffers = [torch.zeros(REGION_NUMEL, dtype=DTYPE, device=device) for _ in range(world)]
    pads = [torch.zeros(MAX_ROWS * world, dtype=torch.int32, device=device) for _ in range(world)]
    buffer_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64, device=device)
    values = [case.inputs(q, world, device) for q in range(world)]
    streams = [torch.cuda.Stream(device) for _ in range(world)]
    torch.cuda.synchronize(device)
    started = time.monotonic()
    results = []
    try:
        for q in range(world if delay_s is not None else 1):
            if q:
                time.sleep(delay_s)  # rank 0's kernel is waiting at the barrier meanwhile
            with torch.cuda.stream(streams[q]):
                results.append(all_reduce_add_rmsnorm(
                    values[q]["partial"], None, values[q]["residual"], values[q]["weight"], EPS,
                    buffer_ptrs=buffer_ptrs, signal_pad_ptrs=pad_ptrs, region_offset=0, region_numel=REGION_NUMEL,
                    rank=q, world_size=world, out=values[q]["out"], residual_out=values[q]["residual_out"],
                    barrier_timeout_s=timeout_s,
                ))  # fmt: skip
        torch.cuda.synchronize(device)
    except RuntimeError as error:
        return {"raised": str(error), "seconds": time.monotonic() - started}
    mismatches = sum(_mismatches(results[q], values[q]) for q in range(world))
    return {"raised": None, "seconds": time.monotonic() - started, "mismatches": mismatches}


def _child(kind: str, rank: int, world: int, port: int, results) -> None:  # noqa: ANN001
    try:
        if kind == "streams":
            results.put((rank, _streams_check(world)))
            return
        if kind in ("absent peer", "late peer"):
            results.put((rank, _peer_check(None, 0.5) if kind == "absent peer" else _peer_check(1.0, 10.0)))
            return
        os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
        torch.cuda.set_device(rank)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        results.put((rank, _processes_check(rank, world)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # reported to the parent, which fails the test with it
        results.put((rank, traceback.format_exc()))


def _run_children(kind: str, processes: int, world: int) -> dict[int, object]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    children = [context.Process(target=_child, args=(kind, rank, world, port, results)) for rank in range(processes)]
    for child in children:
        child.start()
    try:
        return dict(results.get(timeout=BOUND_S) for _ in children)
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()


def _assert_all_equal(reports: dict[int, object], expected_checks: int) -> None:
    for rank, report in reports.items():
        assert isinstance(report, dict), f"rank {rank} failed:\n{report}"
        bad = {check: count for check, count in report.items() if count}
        assert not bad, f"rank {rank}: mismatching elements {bad}"
        assert len(report) == expected_checks


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_on_streams_of_one_gpu_equal_the_unfused_sequence(world: int) -> None:
    _assert_all_equal(_run_children("streams", 1, world), len(_eager_cases()) + GRAPH_REPLAYS)


@pytest.mark.gpu
def test_a_peer_that_never_arrives_makes_the_kernel_fail_instead_of_waiting_forever() -> None:
    """A killed rank's peers must not spin at the barrier for ever: after barrier_timeout_s (0.5 s here)
    the kernel traps, and the host's synchronisation raises (in a child: the CUDA context is lost)."""
    outcome = _run_children("absent peer", 1, 2)[0]
    assert isinstance(outcome, dict), outcome
    assert outcome["raised"] is not None, outcome
    assert "CUDA" in outcome["raised"] or "launch" in outcome["raised"], outcome
    assert 0.5 <= outcome["seconds"] < 10, outcome


@pytest.mark.gpu
def test_a_late_peer_within_the_timeout_still_meets_the_barrier() -> None:
    """Rank 1 arrives 1 s after rank 0 started waiting (timeout 10 s): no trap, and the exact sums."""
    outcome = _run_children("late peer", 1, 2)[0]
    assert isinstance(outcome, dict), outcome
    assert outcome["raised"] is None, outcome
    assert outcome["seconds"] >= 1.0 and outcome["mismatches"] == 0, outcome


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (symmetric memory takes one rank per GPU)")
def test_two_ranks_on_two_gpus_equal_the_unfused_sequence() -> None:
    _assert_all_equal(_run_children("processes", 2, 2), len(_eager_cases()) + GRAPH_REPLAYS)


# ----------------------------------------------------------------------------- fast.parallel's use of it


def _fused_on_one_rank(max_bytes: int, dtype: torch.dtype = torch.float32):  # noqa: ANN202
    """fast.parallel.FusedAllReduceNorm over a plain buffer and pad standing in for symmetric memory."""
    from types import SimpleNamespace

    from fast.parallel import SYMMETRIC_AREAS, FusedAllReduceNorm, OneShotAllReduce

    buffer = torch.zeros(SYMMETRIC_AREAS * max_bytes // dtype.itemsize, dtype=dtype, device=DEVICE)
    pad = torch.zeros(MAX_ROWS, dtype=torch.int32, device=DEVICE)
    handle = SimpleNamespace(  # it keeps the pad alive: the kernel sees only its address
        buffer_ptrs=[buffer.data_ptr()], signal_pad_ptrs=[pad.data_ptr()], signal_pad_size=pad.numel() * 4, pad=pad
    )
    one_shot = OneShotAllReduce(buffer, handle, "unused", max_bytes)
    return FusedAllReduceNorm(one_shot, rank=0, world_size=1), buffer, handle


def test_the_collectives_stage_each_region_after_the_one_shot_area() -> None:
    """Area 0 is torch's one-shot staging; ATTENTION_REGION and MLP_REGION are areas 1 and 2."""
    from fast.parallel import ATTENTION_REGION, MLP_REGION

    fused, buffer, _ = _fused_on_one_rank(max_bytes=256 * 4)
    region_numel = 256  # fp32
    weight = _randn(9, 8, dtype=torch.float32, device=DEVICE)
    for region, seed in ((ATTENTION_REGION, 10), (MLP_REGION, 20)):
        term = _randn(seed, 2, 8, dtype=torch.float32, device=DEVICE)
        residual = _randn(seed + 1, 2, 8, dtype=torch.float32, device=DEVICE)
        got = fused(term, None, residual, weight, EPS, region, False)
        assert all(map(torch.equal, got, _unfused([term], None, residual, weight)))
        start = (1 + region) * region_numel
        assert torch.equal(buffer[start : start + 16].view(2, 8), term)
    assert not buffer[:region_numel].any(), "the one-shot path's area is left alone"
    assert fused.probe(ATTENTION_REGION) and fused.probe(MLP_REGION)
    with pytest.raises(ValueError, match="region must be ATTENTION_REGION or MLP_REGION"):
        fused(term, None, residual, weight, EPS, 2, False)


def test_the_collectives_take_the_fused_kernel_only_for_what_fits() -> None:
    fused, _, _ = _fused_on_one_rank(max_bytes=256 * 4)
    assert fused.fits(torch.zeros(2, 8, device=DEVICE))
    assert not fused.fits(torch.zeros(2, 8, dtype=torch.float16, device=DEVICE)), "another dtype"
    assert not fused.fits(torch.zeros(5, 64, device=DEVICE)), "more than the region holds"
    assert not fused.fits(torch.zeros(16, 8, device=DEVICE).t()), "columns not contiguous"


def test_the_collectives_refuse_a_handle_that_disagrees_with_the_buffer() -> None:
    from fast.parallel import FusedAllReduceNorm, OneShotAllReduce

    _, buffer, handle = _fused_on_one_rank(max_bytes=256 * 4)
    handle.buffer_ptrs = [buffer.data_ptr() + 4]
    one_shot = OneShotAllReduce(buffer, handle, "unused", 256 * 4)
    with pytest.raises(RuntimeError, match="does not start where its handle says"):
        FusedAllReduceNorm(one_shot, rank=0, world_size=1)
    handle.buffer_ptrs, handle.signal_pad_size = [buffer.data_ptr()], 16
    with pytest.raises(RuntimeError, match="the signal pads hold 16 bytes"):
        FusedAllReduceNorm(one_shot, rank=0, world_size=1)
