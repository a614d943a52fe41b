"""Tensor-parallel figures in one run: the fast engine on 1 and on 2 ranks, and its all-reduce paths.

    python -m reports.bench.tensor_parallel --json reports/results/tensor_parallel/tp_bench.json      # 2 GPUs

On the qwen3-8b shape in bf16 (random weights, written once as a safetensors checkpoint so that each
rank reads only its slices, as a real checkpoint is read):

* decode-bs1 (reports.bench.workloads): time per output token with 1 and with 2 ranks, and their
  ratio (the issue's target: 2 ranks at most 0.7 x 1 rank);
* offline-256: output tokens/s with 1 and with 2 ranks, side by side;
* the all-reduce time of one decode step for both paths, NCCL and the symmetric-memory one-shot:
  2 x num_hidden_layers all-reduces of [rows, hidden] chained inside one CUDA graph, replayed and
  timed with CUDA events on rank 0 (rows 1 is decode-bs1's message), and whether the two paths'
  sums are equal; then the same chains with each all-reduce followed by the add + RMSNorm it feeds,
  beside the fused kernel that does both (fast/kernels/all_reduce_norm.py), and whether it equals
  NCCL followed by add_rmsnorm;
* which paths the 2-rank engine set up (`FastEngine.tensor_parallel_info`).

`--shape tiny --device cpu --scale 0.02` runs the same harness through Triton's interpreter and
gloo (a test of the harness, not a measurement; the all-reduce timing needs CUDA and is skipped).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import os
import socket
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from reports.bench.device import environment
from reports.bench.graph_timing import median_replay_us
from reports.bench.profile import profile_run
from reports.bench.runners import run_on_engine, warm_up_engine
from reports.bench.shapes import SHAPES, ModelShape, random_state_dict
from reports.bench.workloads import Phase, decode_bs1, offline_256
from spec.checkpoint import DTYPES, SHARD_INDEX
from spec.engine_config import EngineConfig

logger = logging.getLogger(__name__)

WEIGHT_SEED = 0
SHARD_BYTES = 4 * 2**30
COMPLETE_MARKER = "COMPLETE"
TPOT_TARGET_RATIO = 0.7
ALL_REDUCE_ROWS = (1, 64, 256)  # decode-bs1's message, the one-shot limit, offline-256's full batch
ALL_REDUCE_REPLAYS = 200


# ----------------------------------------------------------------------------- random checkpoints


def checkpoint_root() -> Path:
    """Where random checkpoints are kept between runs: $TWINFER_CHECKPOINT_DIR, else the temp directory."""
    return Path(os.environ.get("TWINFER_CHECKPOINT_DIR") or Path(tempfile.gettempdir()) / "twinfer-tp-checkpoints")


def random_checkpoint(shape: ModelShape, dtype: torch.dtype, seed: int = WEIGHT_SEED, root: Path | None = None) -> Path:
    """A safetensors checkpoint holding random_state_dict(shape, dtype, seed), written once and reused."""
    directory = (root or checkpoint_root()) / f"{shape.name}-{str(dtype).removeprefix('torch.')}-seed{seed}"
    if (directory / COMPLETE_MARKER).is_file():
        return directory
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    state_dict = random_state_dict(shape.model_config(), dtype, device, seed)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, files = 0, 0

    def flush() -> None:
        nonlocal shard, shard_bytes, files
        files += 1
        name = f"model-{files:05d}.safetensors"
        save_file(shard, str(directory / name))
        weight_map.update(dict.fromkeys(shard, name))
        shard, shard_bytes = {}, 0

    for name in list(state_dict):
        tensor = state_dict.pop(name).cpu().contiguous()
        shard[name] = tensor
        shard_bytes += tensor.numel() * tensor.element_size()
        if shard_bytes >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    (directory / SHARD_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (directory / "config.json").write_text(json.dumps(shape.config_dict(), indent=1))
    (directory / COMPLETE_MARKER).write_text("")
    logger.info("wrote %s (%d files)", directory, files)
    del state_dict
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the drawn weights' memory goes back before any engine sizes its KV pool
    return directory


# ----------------------------------------------------------------------------- all-reduce paths


def measure_all_reduce(shape: ModelShape, dtype: torch.dtype, world_size: int = 2) -> dict[str, object]:
    """Per-step all-reduce time of each path on `world_size` GPUs (spawned processes; rank 0 reports)."""
    result_file = Path(tempfile.mkstemp(suffix=".json")[1])
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    torch.multiprocessing.start_processes(
        _all_reduce_worker,
        args=(world_size, init_method, shape.hidden_size, 2 * shape.num_hidden_layers, dtype, str(result_file)),
        nprocs=world_size,
        start_method="spawn",
    )
    result = json.loads(result_file.read_text())
    result_file.unlink()
    return result


def _all_reduce_worker(
    rank: int, world_size: int, init_method: str, hidden: int, calls: int, dtype: torch.dtype, result_file: str
) -> None:
    import torch.distributed as dist

    from fast.parallel import FUSED, ONE_SHOT, Collectives, init_process_groups

    device = torch.device("cuda", rank)
    groups = init_process_groups(rank, world_size, device, init_method)
    collectives = Collectives(groups, dtype, vocab_size=1, fused_norm=True)

    def nccl(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, group=groups.compute)
        return tensor

    record: dict[str, object] = {
        "world_size": world_size,
        "dtype": str(dtype).removeprefix("torch."),
        "all_reduces_per_step": calls,
        "method": f"{calls} all-reduces of [rows, {hidden}] chained in one CUDA graph; median of "
        f"{ALL_REDUCE_REPLAYS} replays timed one by one with CUDA events on rank 0",
        "one_shot": collectives.one_shot_note,
        "fused": collectives.fused_note,
        "with_add_rmsnorm": "each all-reduce followed by the residual add + RMSNorm it feeds in the model "
        f"(`{FUSED}`: the two in one kernel), chained the same way",
        "rows": {},
    }
    for rows in ALL_REDUCE_ROWS:
        probe = torch.zeros((rows, hidden), dtype=dtype, device=device)
        paths: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"nccl": nccl}
        if collectives.one_shot is not None and collectives.one_shot.fits(probe):
            paths[ONE_SHOT] = collectives.one_shot
        entry: dict[str, object] = {"message_bytes": probe.numel() * probe.element_size()}
        for name, reduce in paths.items():
            entry[name] = _time_chain(reduce, probe, calls, device)
        norm_paths = {name: _then_add_rmsnorm(reduce) for name, reduce in paths.items()}
        if collectives.fused is not None and collectives.fused.fits(probe):
            norm_paths[FUSED] = partial(collectives.fused, bias=None, eps=1e-6, pdl=False)
        entry["with_add_rmsnorm"] = {
            name: _time_norm_chain(reduce_norm, probe, calls, device) for name, reduce_norm in norm_paths.items()
        }
        data = torch.randn((rows, hidden), generator=torch.Generator(device).manual_seed(rank), device=device)
        data = data.to(dtype)
        if ONE_SHOT in paths:
            entry["paths_sum_equal"] = bool(torch.equal(nccl(data.clone()), collectives.one_shot(data.clone())))
        if FUSED in norm_paths:
            residual, weight = torch.ones_like(data), torch.ones(hidden, dtype=dtype, device=device)
            fused = norm_paths[FUSED](data.clone(), residual=residual, weight=weight, region=0)
            unfused = norm_paths["nccl"](data.clone(), residual=residual, weight=weight, region=0)
            entry["fused_equals_nccl_then_add_rmsnorm"] = all(map(torch.equal, fused, unfused))
        record["rows"][str(rows)] = entry
    if rank == 0:
        Path(result_file).write_text(json.dumps(record))
    groups.destroy()


def _then_add_rmsnorm(reduce: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    from fast.kernels.add_rmsnorm import add_rmsnorm

    def reduce_norm(term: torch.Tensor, *, residual: torch.Tensor, weight: torch.Tensor, region: int):
        return add_rmsnorm(reduce(term), residual, weight, 1e-6)

    return reduce_norm


def _time_chain(reduce: Callable[[torch.Tensor], torch.Tensor], probe: torch.Tensor, calls: int, device) -> dict:
    def step() -> None:
        value = probe  # zeros: the chained sums stay finite, and timing does not depend on values
        for _ in range(calls):
            value = reduce(value)

    return _time_graph(step, calls, device)


def _time_norm_chain(reduce_norm: Callable, probe: torch.Tensor, calls: int, device) -> dict:
    """Each call's normalised output is the next one's term, its residual the next residual; the
    fused kernel's two regions alternate, as the model's o_proj and down do."""
    weight = torch.ones(probe.shape[1], dtype=probe.dtype, device=device)

    def step() -> None:
        term, residual = probe, probe
        for index in range(calls):
            term, residual = reduce_norm(term, residual=residual, weight=weight, region=index % 2)

    return _time_graph(step, calls, device)


def _time_graph(step: Callable[[], None], calls: int, device) -> dict:
    with torch.cuda.device(device):
        per_step_us = median_replay_us(step, ALL_REDUCE_REPLAYS, warmup=20)
    return {"per_step_us": per_step_us, "per_all_reduce_us": per_step_us / calls}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ----------------------------------------------------------------------------- the engine on 1 and 2 ranks


def run_engine(
    checkpoint: Path,
    ranks: int,
    dtype: torch.dtype,
    device: torch.device,
    phases: list[tuple[Phase, int]],
    profile: bool = False,
    base: EngineConfig | None = None,
) -> dict[str, object]:
    """Each (phase, runs) on one fast engine of `ranks` ranks, after a warm-up request. One engine
    serves every phase: a process sets up the one-shot all-reduce for its first tensor-parallel
    engine only (fast.parallel), so a second 2-rank engine here would measure NCCL alone.
    profile: one more, untimed run of each phase under torch.profiler, in rank 0's process (its
    GPU's kernels, the time its all-reduce kernels wait for the other rank included).
    base: the engine settings besides the rank count (async scheduling, PDL); the batch limits are the
    engine's defaults for the device unless base gives them."""
    from fast.engine import FastEngine
    from reports.bench.harness import phase_metrics, run_record

    engine_config = dataclasses.replace(base or EngineConfig(), tensor_parallel_size=ranks)
    result: dict[str, object] = {"ranks": ranks}
    with FastEngine.from_pretrained(checkpoint, engine_config, dtype, device) as engine:
        result["engine_config"] = dataclasses.asdict(engine.config)
        warm_up_engine(engine)
        for phase, count in phases:
            runs = [run_on_engine(engine, phase, progress=True) for _ in range(count)]
            result[phase.label] = {"metrics": phase_metrics(runs), "runs": [run_record(run) for run in runs]}
            if profile:
                result[phase.label]["profile"] = profile_run(partial(run_on_engine, engine, phase, False), device)[1]
        result["tensor_parallel"] = engine.tensor_parallel_info()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def run(args: argparse.Namespace) -> dict[str, object]:
    shape, dtype, device = SHAPES[args.shape], DTYPES[args.dtype], torch.device(args.device)
    checkpoint = random_checkpoint(shape, dtype, root=args.checkpoint_dir)
    decode, offline = decode_bs1(args.scale), offline_256(args.scale)
    record: dict[str, object] = {
        "record": "twinfer tp_bench",
        "shape": shape.record(),
        "dtype": args.dtype,
        "environment": environment(device, None),
        "weight_seed": WEIGHT_SEED,
        "workloads": {"decode-bs1": decode.record(), "offline-256": offline.record()},
        "decode_bs1_repeats": args.repeats,
        "async_scheduling": args.async_scheduling,
        "programmatic_dependent_launch": args.programmatic_dependent_launch,
        "fused_all_reduce_norm": args.fused_all_reduce_norm,
    }
    if device.type == "cuda" and torch.cuda.device_count() >= 2:
        record["all_reduce"] = measure_all_reduce(shape, dtype)
    else:
        record["all_reduce"] = {"skipped": "needs 2 CUDA GPUs"}
    _save(record, args.json)
    engines: dict[str, dict[str, object]] = {}
    record["engines"] = engines
    for ranks in args.ranks:
        phases = [(phase, args.repeats) for phase in decode.phases] + [(phase, 1) for phase in offline.phases]
        base = EngineConfig(
            async_scheduling=args.async_scheduling,
            programmatic_dependent_launch=args.programmatic_dependent_launch,
            fused_all_reduce_norm=args.fused_all_reduce_norm,
        )
        engines[str(ranks)] = run_engine(checkpoint, ranks, dtype, device, phases, args.profile, base)
        _save(record, args.json)
    record["summary"] = summary(engines)
    _save(record, args.json)
    return record


def summary(engines: dict[str, dict[str, object]]) -> dict[str, object]:
    """TPOT and throughput by ranks, and the 2-over-1 TPOT ratio against the target."""
    tpot = {ranks: runs["batch-1"]["metrics"]["tpot_s"] for ranks, runs in engines.items()}
    throughput = {ranks: runs["offline"]["metrics"]["output_tokens_per_s"] for ranks, runs in engines.items()}
    result: dict[str, object] = {"decode_bs1_tpot_s": tpot, "offline_256_output_tokens_per_s": throughput}
    profiled = {ranks: runs["batch-1"]["profile"] for ranks, runs in engines.items() if "profile" in runs["batch-1"]}
    if profiled:  # decode-bs1 on rank 0's GPU, per step: busy time, and the communication kernels' share of it
        result["decode_bs1_rank0_per_step_ms"] = {
            ranks: {
                "gpu_busy": profile["gpu_busy_s_per_step"] * 1e3,
                "communication_kernels": profile["kernel_time_s_by_kind"].get("all-reduce / communication", 0.0)
                * 1e3
                / profile["num_steps"],
            }
            for ranks, profile in profiled.items()
            if profile["num_steps"]
        }
    if tpot.get("1") and tpot.get("2"):
        ratio = tpot["2"] / tpot["1"]
        result["decode_bs1_tpot_ratio_2_over_1"] = ratio
        result["target_ratio_at_most"] = TPOT_TARGET_RATIO
        result["meets_target"] = ratio <= TPOT_TARGET_RATIO
    return result


def _save(record: dict[str, object], path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the record here (after each engine, and at the end)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ranks", type=lambda text: [int(x) for x in text.split(",")], default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="decode-bs1 runs per engine (median kept)")
    parser.add_argument("--scale", type=float, default=1.0, help="< 1 shrinks the workloads (harness tests only)")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="where random checkpoints are kept")
    parser.add_argument(
        "--async-scheduling", action="store_true", help="every engine schedules, loads and launches each step ahead"
    )
    parser.add_argument(
        "--programmatic-dependent-launch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every engine's Triton kernels launch with programmatic dependent launch (sm90+); "
        "default: where the GPU supports it (EngineConfig's default)",
    )
    parser.add_argument(
        "--fused-all-reduce-norm",
        action="store_true",
        help="every engine fuses its decode-sized all-reduces with the add + RMSNorm after them (2+ ranks)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after each phase's timed runs, one more under torch.profiler in rank 0's process (kernel time "
        "by kind, the all-reduce kernels' waits included; host time in torch.distributed calls)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    record = run(args)
    print(json.dumps(record["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
