"""The scheduling policy both engines implement, and the plan a scheduler hands its model runner.

Policy, one step (two implementations that follow it make identical decisions):

1. budget = max_num_batched_tokens.
2. Running requests, in the order they were admitted (oldest first), while budget > 0:
   each is given n = min(its uncomputed tokens, budget) tokens -- one for a decoding request,
   the next prefill chunk for one still prefilling (or recomputing after preemption).
   Its block table is grown to cover computed + n tokens. When the pool has too few free
   blocks (free blocks include cached blocks with no holder, evicted least recently freed
   first), the most recently admitted running request is preempted: its blocks are freed
   (its full, hashed blocks stay in the prefix cache), its computed count is reset, and it is
   put at the front of the waiting queue. This repeats until the growth succeeds or the
   request itself was the one preempted (then the running pass ends).
   budget -= n for each request given tokens.
2b. Speculative decoding only (EngineConfig.speculative, spec.speculative), only if nothing
   was preempted in this step: the chunks of step 2 that are a single token and sample are
   the step's decoding chunks; the step is large when there are at least large_batch_rows of
   them (spec.speculative.is_large_batch). Every decoding chunk whose request's acceptance
   gate lets it (spec.speculative.AcceptanceGate.may_propose: not paused and, in a large step,
   a proven high acceptance) asks the proposer, all in one call, for a draft of at most
   draft_limit(K, outputs, max_outputs) = min(K, max_outputs - outputs - 1) tokens (so the
   step can never take the request past max_tokens or max_model_len). Each request the proposer
   gives an empty draft records it in its gate, in running order (AcceptanceGate.
   record_empty_proposal: one drafted token, none accepted, its output count), which may pause
   it. In running order, each
   draft is cut to min(budget, `draft_room`) tokens: draft_room is what the request's table and
   the free blocks can cover beyond its chunk, so a draft never preempts anyone and never
   takes a block a plain step would need from a request scheduled before it. A draft left
   non-empty joins its chunk (a verify chunk: the last token and the draft, n = 1 + len(draft),
   draft_token_ids set), its table grows to cover it, and budget -= len(draft).
   Which requests ask depends on counts alone (gates, output counts, step 2's chunks); only the
   proposer reads token values. So an engine that plans a step before the previous step's token
   values are known can tell whether anyone might ask (fast.scheduler.Scheduler.may_propose_next).
3. Only if nothing was preempted in this step: admission of waiting requests, first come first
   served, while budget > 0 and fewer than max_num_seqs requests run. For the request at the
   head of the queue: its prefix-cache hit is the longest run of leading full blocks of its
   tokens (prompt plus any output, after preemption) found in the cache, limited to
   (num_tokens - 1) // block_size blocks so at least one token is computed
   (`max_prefix_hit_blocks`); a request that asks for prompt logprobs gets no hit, so every
   prompt position is computed and scored. Before a hit block is reused, its stored token ids
   are compared with the request's: a hash collision never serves another prompt's K/V.
   n = min(num_tokens - cached_tokens, budget) (the last admitted prompt is chunked to fit).
   If the pool cannot supply the blocks for cached_tokens + n tokens beyond the hit blocks,
   admission stops (the head of the queue is never skipped). Otherwise it is admitted,
   moved to the back of the running list, and budget -= n.
4. The plan lists the scheduled chunks: running requests in running order, then admitted
   ones in admission order. A chunk samples a token when it reaches the end of the
   request's tokens.

After the model runs, each scheduled request's computed count grows by its chunk; newly full
blocks are hashed (chained) and registered in the prefix cache unless an equal block already
is. A sampled token is appended; the request finishes with STOP on a stop token (an
end-of-sequence id unless ignore_eos, or one of stop_token_ids), or LENGTH when it has
max_tokens output tokens or reaches max_model_len tokens. Finished requests free their
blocks (hashed ones stay cached, freed from the last block to the first so that a prefix's
head outlives its tail).

A verify chunk instead samples at each of its 1 + len(draft) positions (position j with the
noise of output position outputs + j) and appends spec.speculative.accepted_tokens: the
model's tokens up to and including the first that differs from the draft, cut after a stop
token; each is checked for a finish as above (only the last may finish the request). Its
computed count grows by the number of tokens appended (the last token and the accepted draft
tokens; the newest token stays uncomputed, as after a plain step), only those are registered
in the prefix cache, and the blocks past the computed tokens are freed (rolled back) to the
head of the free queue, first block first: they hold no registered token, so reusing them
first evicts nothing from the prefix cache. A request that did not finish records the chunk in
its acceptance gate (AcceptanceGate.record: len(draft) drafted, tokens appended - 1 accepted,
its output count after them), which may pause it. Each request's gate is made when it is added
and dropped when it finishes or is aborted; preemption keeps it.

A request is rejected when added (InvalidRequestError, nothing else changes) when its prompt is
empty, holds ids outside the vocabulary, is not shorter than max_model_len, or when the tokens
it would ever hold in the cache, min(prompt + max_tokens, max_model_len) - 1, need more blocks
than the whole pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduledChunk:
    """`num_tokens` tokens of request `request_id`, starting at token index `start`."""

    request_id: str
    start: int
    num_tokens: int
    samples: bool  # the chunk reaches the request's last token: a new token is sampled
    # A verify chunk (speculative decoding): the draft tokens after the request's last token, the
    # chunk's last len(draft_token_ids) tokens (num_tokens counts them). Empty for every other chunk.
    draft_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepPlan:
    chunks: tuple[ScheduledChunk, ...]
    preempted: tuple[str, ...]  # in the order they were preempted
    admitted: tuple[str, ...]  # in the order they were admitted

    @property
    def num_batched_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


def max_prefix_hit_blocks(num_tokens: int, block_size: int, wants_prompt_logprobs: bool = False) -> int:
    """Most leading full blocks a request of `num_tokens` tokens may take from the prefix cache:
    at least one token is always left to compute (its logits sample the next token), and a
    request that asks for prompt logprobs takes none (every prompt position is scored)."""
    if wants_prompt_logprobs:
        return 0
    return (num_tokens - 1) // block_size


def slot_of(block_table: Sequence[int], position: int, block_size: int) -> int:
    """The KV-cache slot of token `position` of a request: block_id * block_size + offset."""
    return block_table[position // block_size] * block_size + position % block_size


def draft_room(table_blocks: int, free_blocks: int, block_size: int, num_covered: int) -> int:
    """Draft tokens a request whose table of `table_blocks` blocks covers `num_covered` scheduled tokens
    can add with the pool's free blocks alone (no preemption)."""
    return (table_blocks + free_blocks) * block_size - num_covered
