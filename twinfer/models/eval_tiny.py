"""Acceptance figures of a `stdlib-tiny` checkpoint, measured with twinfer's reference engine.

    python -m twinfer.models.eval_tiny CHECKPOINT --json OUT.json [--device cuda]

On the held-out files of the corpus (the same path-hash split as `twinfer.models.train_tiny`, read on
this machine), teacher-forced in fp32 and in bf16:
  * held-out loss (mean next-token cross-entropy, nats);
  * in fp32, the fraction of positions where the two largest log-probabilities are more than
    0.25 apart ("confident" positions; acceptance: at least 70%);
  * bf16 against fp32: top-1 agreement on the confident positions (acceptance: at least 99%);
and free-running greedy decoding of held-out prompts in both dtypes: how many generated tokens
stay identical per prompt (acceptance: at least 64 on most of the prompts).

Per-position log-probabilities come from the engine's `prompt_logprobs`. Where the engine does not
return them, they come from the reference model's own forward pass over the paged cache, and
the JSON says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from reference.engine import ReferenceEngine
from reference.model import ForwardBatch, SequenceSlice
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from twinfer.models.train_tiny import END_OF_TEXT, evenly_spaced_windows, load_corpus

logger = logging.getLogger(__name__)

CONFIDENT_GAP = 0.25
MIN_CONFIDENT_FRACTION = 0.70
MIN_CONFIDENT_AGREEMENT = 0.99
MIN_IDENTICAL_GREEDY_TOKENS = 64
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
VIA_PROMPT_LOGPROBS = "engine prompt_logprobs"
VIA_MODEL_FORWARD = "reference model forward over the paged cache (the engine returned no prompt_logprobs)"
VIA_MODEL_FORWARD_AFTER_ERROR = "reference model forward over the paged cache (prompt_logprobs raised an error)"


@dataclass(frozen=True)
class EvalSettings:
    windows: int
    window_len: int
    prompts: int
    prompt_len: int
    new_tokens: int
    block_size: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class TeacherForced:
    """Per predicted position (every window position after the first), concatenated over windows."""

    target_logprob: torch.Tensor  # fp32 [P]
    top1_id: torch.Tensor  # int64 [P]
    top1_logprob: torch.Tensor  # fp32 [P]
    top2_logprob: torch.Tensor  # fp32 [P]
    via: str

    @property
    def gap(self) -> torch.Tensor:
        return self.top1_logprob - self.top2_logprob


@dataclass(frozen=True)
class GreedyRun:
    token_ids: list[list[int]]
    top2_gaps: list[list[float]]  # per generated token, the gap between its two largest logprobs


def _engine(
    checkpoint: Path, dtype: torch.dtype, device: torch.device, settings: EvalSettings, tokens: int
) -> ReferenceEngine:
    config = EngineConfig(
        block_size=settings.block_size,
        num_blocks=tokens // settings.block_size + 4 * max(settings.windows, settings.prompts) + 16,
        max_num_seqs=max(settings.windows, settings.prompts),
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_caching=False,
    )
    return ReferenceEngine.from_pretrained(checkpoint, config, dtype, device)


def teacher_forced(engine: ReferenceEngine, windows: torch.Tensor) -> TeacherForced:
    prompts = [row.tolist() for row in windows]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
    try:
        outputs = engine.generate(prompts, params)
    except Exception as error:  # prompt_logprobs is new in the engine: measure the model anyway
        logger.warning("prompt_logprobs failed (%s); using the reference model's forward directly", error)
        return replace(_teacher_forced_by_forward(engine, windows), via=f"{VIA_MODEL_FORWARD_AFTER_ERROR}: {error!r}")
    if any(output.prompt_logprobs is None for output in outputs):
        logger.warning("the engine returned no prompt_logprobs; using the reference model's forward directly")
        return _teacher_forced_by_forward(engine, windows)
    targets, top1_ids, top1, top2 = [], [], [], []
    for output in outputs:
        for entry in output.prompt_logprobs[1:]:
            targets.append(entry.logprob)
            top1_ids.append(entry.top[0][0])
            top1.append(entry.top[0][1])
            top2.append(entry.top[1][1])
    as_float = lambda values: torch.tensor(values, dtype=torch.float32)
    return TeacherForced(as_float(targets), torch.tensor(top1_ids), as_float(top1), as_float(top2), VIA_PROMPT_LOGPROBS)


@torch.inference_mode()
def _teacher_forced_by_forward(engine: ReferenceEngine, windows: torch.Tensor) -> TeacherForced:
    """One window at a time through the engine's model and (idle) KV cache, all logits kept."""
    length = windows.shape[1]
    device = engine.device
    block_size = engine.config.block_size
    positions = torch.arange(length, device=device)
    block_table = torch.arange(-(-length // block_size), device=device)
    batch = ForwardBatch(positions, positions, (SequenceSlice(0, length, length, block_table),), positions)
    targets, top1_ids, top1, top2 = [], [], [], []
    for row in windows:
        tokens = row.to(device)
        logprobs = torch.log_softmax(engine.model(tokens, batch, engine.cache)[:-1], dim=-1)
        best = logprobs.topk(2, dim=-1)
        targets.append(logprobs.gather(1, tokens[1:, None])[:, 0].cpu())
        top1_ids.append(best.indices[:, 0].cpu())
        top1.append(best.values[:, 0].cpu())
        top2.append(best.values[:, 1].cpu())
    return TeacherForced(torch.cat(targets), torch.cat(top1_ids), torch.cat(top1), torch.cat(top2), VIA_MODEL_FORWARD)


def _max_difference_from_forward(engine: ReferenceEngine, windows: torch.Tensor, result: TeacherForced) -> float:
    direct = _teacher_forced_by_forward(engine, windows)
    count = direct.target_logprob.numel()
    difference = (direct.target_logprob - result.target_logprob[:count]).abs().max()
    return round(difference.item(), 7)


def greedy(engine: ReferenceEngine, prompts: torch.Tensor, new_tokens: int) -> GreedyRun:
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, logprobs=2)
    outputs = engine.generate([row.tolist() for row in prompts], params)
    gaps = [[entry.top[0][1] - entry.top[1][1] for entry in output.logprobs] for output in outputs]
    return GreedyRun([list(output.token_ids) for output in outputs], gaps)


def identical_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    for index, (a, b) in enumerate(zip(first, second, strict=False)):
        if a != b:
            return index
    return min(len(first), len(second))


def _largest(values: torch.Tensor) -> float | None:
    return round(values.max().item(), 5) if values.numel() else None


def _fraction(mask: torch.Tensor) -> float:
    return round(mask.float().mean().item(), 6) if mask.numel() else float("nan")


def compare(reference: TeacherForced, other: TeacherForced) -> dict:
    confident = reference.gap > CONFIDENT_GAP
    agree = reference.top1_id == other.top1_id
    difference = (reference.target_logprob - other.target_logprob).abs()
    return {
        "held_out_loss": round(-other.target_logprob.mean().item(), 5),
        "top1_agreement_all_positions": _fraction(agree),
        "top1_agreement_confident_positions": _fraction(agree[confident]),
        "confident_positions": int(confident.sum()),
        "confident_disagreements": int((~agree[confident]).sum()),
        "largest_fp32_gap_among_disagreements": _largest(reference.gap[~agree]),
        "target_logprob_abs_diff_mean": round(difference.mean().item(), 6),
        "target_logprob_abs_diff_max": round(difference.max().item(), 6),
    }


def greedy_figures(reference: GreedyRun, other: GreedyRun, new_tokens: int) -> dict:
    reaches = [identical_prefix(a, b) for a, b in zip(reference.token_ids, other.token_ids, strict=True)]
    gaps_at_divergence = [
        round(gaps[reach], 5) for reach, gaps in zip(reaches, reference.top2_gaps, strict=True) if reach < new_tokens
    ]
    edges = [edge for edge in (0, 16, 32, MIN_IDENTICAL_GREEDY_TOKENS) if edge < new_tokens] + [new_tokens]
    histogram = {
        f"{low}-{high - 1}": sum(low <= r < high for r in reaches)
        for low, high in zip(edges[:-1], edges[1:], strict=True)
    }
    histogram[f"{new_tokens} (all)"] = sum(r == new_tokens for r in reaches)
    at_least = sum(r >= MIN_IDENTICAL_GREEDY_TOKENS for r in reaches)
    return {
        "identical_tokens_per_prompt": reaches,
        "histogram": histogram,
        "min": min(reaches),
        "median": statistics.median(reaches),
        f"prompts_identical_for_{MIN_IDENTICAL_GREEDY_TOKENS}_or_more": at_least,
        "prompts_fully_identical": sum(r == new_tokens for r in reaches),
        "fp32_top2_gap_at_first_divergence": gaps_at_divergence,
    }


def evaluate(checkpoint: Path, device: torch.device, settings: EvalSettings, max_files: int | None) -> dict:
    from transformers import AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    corpus = load_corpus(max_files=max_files)
    eos_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    stream: list[int] = []
    for document in tokenizer.backend_tokenizer.encode_batch(list(corpus.held_out_texts), add_special_tokens=False):
        stream.extend([*document.ids, eos_id])
    held_out = torch.tensor(stream, dtype=torch.int64)
    windows = evenly_spaced_windows(held_out, settings.windows, settings.window_len)
    prompts = evenly_spaced_windows(held_out, settings.prompts, settings.prompt_len)
    capacity = windows.numel() + prompts.shape[0] * (settings.prompt_len + settings.new_tokens)

    teacher: dict[str, TeacherForced] = {}
    generated: dict[str, GreedyRun] = {}
    sample_text = None
    consistency: dict[str, float] = {}
    for name, dtype in DTYPES.items():
        engine = _engine(checkpoint, dtype, device, settings, capacity)
        teacher[name] = teacher_forced(engine, windows)
        if teacher[name].via == VIA_PROMPT_LOGPROBS:
            consistency[name] = _max_difference_from_forward(engine, windows[:2], teacher[name])
        if engine.has_unfinished:  # a failed prompt_logprobs run left requests behind: start clean
            engine = _engine(checkpoint, dtype, device, settings, capacity)
        generated[name] = greedy(engine, prompts, settings.new_tokens)
        if name == "float32":
            sample = engine.generate(
                [tokenizer.encode("def ", add_special_tokens=False)], SamplingParams(temperature=0.0, max_tokens=48)
            )
            sample_text = "def " + tokenizer.decode(list(sample[0].token_ids))
        del engine
        logger.info("%s done (%.1fs)", name, time.perf_counter() - started)

    fp32 = teacher["float32"]
    confident = fp32.gap > CONFIDENT_GAP
    bf16 = compare(fp32, teacher["bfloat16"])
    greedy_record = greedy_figures(generated["float32"], generated["bfloat16"], settings.new_tokens)
    at_least = greedy_record[f"prompts_identical_for_{MIN_IDENTICAL_GREEDY_TOKENS}_or_more"]
    return {
        "checkpoint": str(checkpoint),
        "python_version": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "engine": "reference",
        "teacher_forcing_via": {name: result.via for name, result in teacher.items()},
        # prompt_logprobs against the model's own forward on the first two windows (a cross-check).
        "prompt_logprobs_vs_forward_max_abs_diff": consistency,
        "settings": asdict(settings),
        "held_out": {
            "files": len(corpus.held_out_paths),
            "tokens": held_out.numel(),
            "windows": windows.shape[0],
            "positions": fp32.target_logprob.numel(),
        },
        "float32": {
            "held_out_loss": round(-fp32.target_logprob.mean().item(), 5),
            f"fraction_gap_above_{CONFIDENT_GAP}": _fraction(confident),
            "median_gap": round(fp32.gap.median().item(), 5),
            "top1_accuracy": _fraction(fp32.top1_id == _targets(windows)),
        },
        "bfloat16_vs_float32": bf16,
        "greedy_bfloat16_vs_float32": {
            "prompts": prompts.shape[0],
            "prompt_tokens": settings.prompt_len,
            "new_tokens": settings.new_tokens,
            **greedy_record,
        },
        "greedy_sample_float32": sample_text,
        "acceptance": {
            f"fp32_gap_above_{CONFIDENT_GAP}_on_at_least_{MIN_CONFIDENT_FRACTION:.0%}": bool(
                _fraction(confident) >= MIN_CONFIDENT_FRACTION
            ),
            f"bf16_top1_agreement_on_confident_at_least_{MIN_CONFIDENT_AGREEMENT:.0%}": bool(
                bf16["top1_agreement_confident_positions"] >= MIN_CONFIDENT_AGREEMENT
            ),
            f"greedy_identical_{MIN_IDENTICAL_GREEDY_TOKENS}_tokens_on_most_prompts": bool(
                at_least * 2 > prompts.shape[0]
            ),
            # `twinfer generate --prompt "def "` should print Python, not a loop of one name.
            "greedy_def_prompt_writes_a_signature": bool(sample_text and SIGNATURE.match(sample_text)),
        },
        "seconds": round(time.perf_counter() - started, 1),
    }


def _targets(windows: torch.Tensor) -> torch.Tensor:
    return windows[:, 1:].reshape(-1)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="a stdlib-tiny checkpoint directory")
    parser.add_argument("--json", type=Path, required=True, help="where to write the figures")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--max-files", type=int, default=None, help="as given to train_tiny for a quick run")
    parser.add_argument("--windows", type=int, default=64, help="held-out windows, teacher-forced (default 64)")
    parser.add_argument("--window-len", type=int, default=512, help="tokens per window (default 512)")
    parser.add_argument("--prompts", type=int, default=32, help="held-out greedy prompts (default 32)")
    parser.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt (default 64)")
    parser.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per prompt (default 128)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    settings = EvalSettings(
        windows=args.windows,
        window_len=args.window_len,
        prompts=args.prompts,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    record = evaluate(args.checkpoint, device, settings, args.max_files)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    print(json.dumps({key: record[key] for key in ("float32", "bfloat16_vs_float32", "acceptance")}, indent=2))
    greedy_record = record["greedy_bfloat16_vs_float32"]
    print(f"greedy identical tokens per prompt: {greedy_record['identical_tokens_per_prompt']}")
    print(f"sample: {record['greedy_sample_float32']!r}")
    return 0 if all(record["acceptance"].values()) else 1


SIGNATURE = re.compile(r"def \w+\([^()]*\):")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m twinfer.models.eval_tiny", description=__doc__.split("\n\n")[0])
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
