"""Continuous-batching scheduler with chunked prefill and recompute preemption, on constant-time structures.

It follows the policy written in spec.scheduling step for step and makes the same decisions as
the reference scheduler (same plans, hits, preemptions and block ids); read that docstring first.
What differs is the bookkeeping:

- the running requests are an insertion-ordered dict (admission order), so finishing or
  preempting one is O(1) and `update` finds a chunk's request without a scan;
- each unfinished request keeps a read-in-place view of its tokens and its block-hash chain
  from the moment it is added: admission looks the prefix up with hashes computed once, and
  the allocator registers full blocks from the same chain;
- `snapshot` (the spec's state view, for invariant checks) is built only when asked for;
- the per-step loops do only what a step can change (a decoding request's usual step: its new
  token fits in its last block, fills no block and finishes nothing): each running request keeps
  its block table and its spec.request.FinishLimits from admission (`_Admitted`), so `schedule` asks
  the allocator for blocks only when the table is full, and `update` registers blocks only when one
  filled and checks a new token against limits it does not recompute.

It changes a `Request` only through its methods (spec.request's contract).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

from fast.block_allocator import BlockAllocator, BlockHashChain
from spec.block_hash import HashFunction, hash_block
from spec.engine_config import EngineConfig
from spec.invariants import RequestState, SchedulerSnapshot
from spec.request import FinishLimits, FinishReason, Request, RequestStatus
from spec.scheduling import ScheduledChunk, StepPlan, draft_room, max_prefix_hit_blocks
from spec.speculative import AcceptanceGate, DraftProposer, draft_limit, is_large_batch, make_ngram_proposer


class RequestTokens(Sequence[int]):
    """A request's prompt then output tokens, read in place: slicing copies only the slice."""

    __slots__ = ("_request",)

    def __init__(self, request: Request) -> None:
        self._request = request

    def __len__(self) -> int:
        return self._request.num_tokens

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        prompt, output = self._request.prompt_token_ids, self._request.output_token_ids
        if isinstance(index, slice):
            start, stop, step = index.indices(len(prompt) + len(output))
            if step != 1:
                return tuple(self[position] for position in range(start, stop, step))
            if stop <= len(prompt):
                return prompt[start:stop]
            if start >= len(prompt):
                return tuple(output[start - len(prompt) : stop - len(prompt)])
            return prompt[start:] + tuple(output[: stop - len(prompt)])
        position = index + len(prompt) + len(output) if index < 0 else index
        if not 0 <= position < len(prompt) + len(output):
            raise IndexError(f"token index {index} out of range for {len(prompt) + len(output)} tokens")
        return prompt[position] if position < len(prompt) else output[position - len(prompt)]


@dataclass(frozen=True, slots=True)
class _Tracked:
    """What the scheduler keeps for one unfinished request."""

    request: Request
    tokens: RequestTokens
    chain: BlockHashChain


class _Admitted:
    """What a running request's steps read, set when it is admitted: the allocator's block table
    (grown in place until the request is freed) and when a new token finishes the request."""

    __slots__ = ("limits", "table")

    def __init__(self, request: Request, table: array[int], eos_token_ids: frozenset[int], model_len: int) -> None:
        self.table = table
        self.limits = FinishLimits.of(request.params, len(request.prompt_token_ids), eos_token_ids, model_len)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        eos_token_ids: Sequence[int] = (),
        hash_function: HashFunction = hash_block,
        proposer: DraftProposer | None = None,
    ) -> None:
        """proposer: drafts for speculative decoding (config.speculative); None: prompt lookup where the
        method is "ngram" (a draft model is the engine's to build)."""
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        if config.speculative is not None and proposer is None:
            proposer = make_ngram_proposer(config.speculative)
        self.proposer = proposer if config.speculative is not None else None
        self.allocator = BlockAllocator(
            config.pool_blocks, config.block_size, config.enable_prefix_caching, hash_function
        )
        self.waiting: deque[Request] = deque()
        self._running: dict[str, Request] = {}  # admission order, oldest first
        # Every unfinished request, whatever its queue (the invariant checks see one that falls out of both).
        self._tracked: dict[str, _Tracked] = {}
        self._admitted: dict[str, _Admitted] = {}  # running request id -> its state from admission
        self._plan: StepPlan | None = None  # the plan scheduled and not yet updated (its counts: snapshot)
        self._admission: dict[str, tuple[int, int]] = {}  # request id -> (cached tokens, tokens) at admission
        self._gates: dict[str, AcceptanceGate] = {}  # request id -> when it proposes (speculative decoding only)

    @property
    def running(self) -> list[Request]:
        """The running requests, oldest admission first (a new list on each access)."""
        return list(self._running.values())

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self._running)

    def add(self, request: Request) -> None:
        chain = BlockHashChain(self.config.block_size, self.allocator.hash_function)
        self._tracked[request.request_id] = _Tracked(request, RequestTokens(request), chain)
        self.waiting.append(request)
        if self.config.speculative is not None:
            self._gates[request.request_id] = AcceptanceGate(self.config.speculative)

    # -- one step ----------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[str] = []
        admitted_states, tokens_per_block = self._admitted, self.config.block_size

        # Preemption only ever removes the newest running requests, so the prefix of this list
        # up to len(self._running) stays exactly the running set.
        in_admission_order = list(self._running.values())
        index = 0
        while index < len(self._running) and budget > 0:
            request = in_admission_order[index]
            # Read once: growing the table (or preempting others) does not change this request's counts.
            computed, total = request.num_computed_tokens, request.num_tokens
            num_tokens = min(total - computed, budget)
            end = computed + num_tokens
            # The allocator only when the table lacks room (allocate_slots would change nothing
            # otherwise): skipping the call on the other steps saved ~0.1 ms a full-batch step.
            if end > len(admitted_states[request.request_id].table) * tokens_per_block and not self._grow_or_preempt(
                request, end, preempted
            ):
                break
            chunks.append(ScheduledChunk(request.request_id, computed, num_tokens, end == total))
            budget -= num_tokens
            index += 1

        admitted: list[str] = []
        if not preempted:
            if self.proposer is not None:
                budget = self._add_drafts(chunks, budget)
            self._admit_waiting(budget, chunks, admitted)
        self._plan = StepPlan(chunks=tuple(chunks), preempted=tuple(preempted), admitted=tuple(admitted))
        return self._plan

    def _admit_waiting(self, budget: int, chunks: list[ScheduledChunk], admitted: list[str]) -> None:
        """Admit from the head of the waiting queue while the budget, max_num_seqs and the pool allow."""
        while self.waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            request = self.waiting[0]
            num_tokens = self._try_admit(self._tracked[request.request_id], budget)
            if num_tokens is None:
                return
            self.waiting.popleft()
            self._running[request.request_id] = request
            admitted.append(request.request_id)
            start = request.num_computed_tokens
            chunks.append(
                ScheduledChunk(request.request_id, start, num_tokens, start + num_tokens == request.num_tokens)
            )
            budget -= num_tokens

    def _add_drafts(self, chunks: list[ScheduledChunk], budget: int) -> int:
        """Speculative decoding (spec.scheduling step 2b): drafts join the decoding chunks as far as the
        budget and the free blocks allow; the budget left."""
        if budget <= 0:
            return budget
        running, admitted = self._running, self._admitted
        decoding = [index for index, chunk in enumerate(chunks) if chunk.num_tokens == 1 and chunk.samples]
        large_batch = is_large_batch(self.config.speculative, len(decoding))
        candidates: list[tuple[int, Request, int]] = []  # (chunk index, request, draft limit)
        for index in decoding:
            request = running[chunks[index].request_id]
            limit = self._draft_limit(request, large_batch)
            if limit > 0:
                candidates.append((index, request, limit))
        if not candidates:
            return budget
        drafts = self.proposer.propose(
            [request.all_token_ids for _, request, _ in candidates], [limit for *_, limit in candidates]
        )
        for (_, request, _), draft in zip(candidates, drafts, strict=True):
            if not draft:
                self._gates[request.request_id].record_empty_proposal(len(request.output_token_ids))
        allocator, block_size = self.allocator, self.config.block_size
        for (index, request, limit), draft in zip(candidates, drafts, strict=True):
            if budget <= 0:
                break
            request_id, covered = request.request_id, request.num_tokens
            room = draft_room(len(admitted[request_id].table), allocator.num_free_blocks, block_size, covered)
            draft = tuple(draft[: min(limit, budget, room)])
            if not draft:
                continue
            if not allocator.allocate_slots(request_id, covered + len(draft)):
                raise RuntimeError("allocator refused blocks that draft_room counted as free")
            chunk = chunks[index]
            chunks[index] = ScheduledChunk(request_id, chunk.start, 1 + len(draft), True, draft)
            budget -= len(draft)
        return budget

    def _draft_limit(self, request: Request, large_batch: bool) -> int:
        """The most draft tokens a decoding running request asks for in this step (0: none), from counts
        alone: its gate's state and its output count (so `may_propose_next` can tell ahead)."""
        num_outputs = len(request.output_token_ids)
        if not self._gates[request.request_id].may_propose(num_outputs, large_batch):
            return 0
        max_outputs = self._admitted[request.request_id].limits.max_outputs
        return draft_limit(self.config.speculative.num_speculative_tokens, num_outputs, max_outputs)

    # -- a plan made ahead (EngineConfig.async_scheduling) ---------------------------------------

    def may_propose_next(self) -> bool:
        """Whether the next `schedule` might ask the proposer for a draft (spec.scheduling step 2b). Told from
        counts alone, so the engine can ask it before the last step's token values are known: a plan made
        ahead must propose nothing, since the proposer reads the request's tokens (pending ones then).

        It replays step 2's budget over the running requests as if the pool grows every table (nothing is
        preempted): then step 2b sees exactly these decoding chunks and this budget, and the answer is
        exact. Where the step does preempt, nothing proposes, yet this may say True: conservative (the
        engine then waits for the tokens and schedules step by step, which is always correct). Which
        requests the pool preempts needs the allocator's own run; those steps are rare."""
        if self.proposer is None:
            return False
        budget, num_decoding = self.config.max_num_batched_tokens, 0
        for request in self._running.values():
            if budget <= 0:
                return False  # step 2 ends with no budget left: step 2b adds no draft
            uncomputed = request.num_tokens - request.num_computed_tokens
            budget -= min(uncomputed, budget)
            num_decoding += uncomputed == 1  # a single-token chunk that samples: a decoding chunk
        if budget <= 0:
            return False
        large_batch = is_large_batch(self.config.speculative, num_decoding)
        return any(
            request.num_tokens - request.num_computed_tokens == 1 and self._draft_limit(request, large_batch) > 0
            for request in self._running.values()
        )

    def finishes_by_length_only(self, request_ids: Iterable[str]) -> bool:
        """Whether none of these running requests can be finished by the value of its next token."""
        admitted = self._admitted
        return all(admitted[request_id].limits.by_length_only for request_id in request_ids)

    def stop_token_ids(self, request_id: str) -> frozenset[int]:
        """The tokens that finish this running request (its limits from admission)."""
        return self._admitted[request_id].limits.stop_token_ids

    def admit_more(self) -> StepPlan:
        """The scheduled plan with the admissions a request added (or a queue head aborted) since it was
        made allows: the plan `schedule` would make now. Its running chunks are unchanged (they do not
        depend on the waiting queue), and its admission loop stopped at an empty queue, the budget,
        max_num_seqs or a head the pool could not take; resuming it from there with the remaining budget
        admits what a fresh admission loop would. A plan that preempted admits nothing, as in `schedule`."""
        plan = self._scheduled_plan()
        if plan.preempted:
            return plan
        chunks, admitted = list(plan.chunks), list(plan.admitted)
        budget = self.config.max_num_batched_tokens - sum(chunk.num_tokens for chunk in chunks)
        self._admit_waiting(budget, chunks, admitted)
        self._plan = StepPlan(chunks=tuple(chunks), preempted=plan.preempted, admitted=tuple(admitted))
        return self._plan

    def drop_from_plan(self, request_id: str, admit: bool = True) -> StepPlan:
        """The scheduled plan without an aborted request, then (admit) admit_more. Exactly `schedule`'s
        plan unless the request had a chunk in it: its blocks were freed after the plan grew others' tables
        or preempted for room, and a request admitted into the plan keeps the chunk the aborted one's
        budget left it; `schedule` would have made all of these with the blocks and budget free.
        admit=False: the plan is already running on the device and can take no one more."""
        plan = self._scheduled_plan()
        self._plan = StepPlan(
            chunks=tuple(chunk for chunk in plan.chunks if chunk.request_id != request_id),
            preempted=tuple(other for other in plan.preempted if other != request_id),
            admitted=tuple(other for other in plan.admitted if other != request_id),
        )
        return self.admit_more() if admit else self._plan

    def _scheduled_plan(self) -> StepPlan:
        if self._plan is None:
            raise RuntimeError("no plan is scheduled: the scheduler's last call was update")
        return self._plan

    def _grow_or_preempt(self, request: Request, num_tokens: int, preempted: list[str]) -> bool:
        """Cover `num_tokens` of `request`, preempting the newest running requests if needed.
        False when `request` itself had to be preempted."""
        while not self.allocator.allocate_slots(request.request_id, num_tokens):
            _, victim = self._running.popitem()  # the most recently admitted
            self.allocator.free(victim.request_id)
            victim.preempt()
            self._admission.pop(victim.request_id, None)
            self._admitted.pop(victim.request_id, None)
            self.waiting.appendleft(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _try_admit(self, tracked: _Tracked, budget: int) -> int | None:
        """Admit the head of the waiting queue if the pool allows; the number of tokens scheduled."""
        request, block_size = tracked.request, self.config.block_size
        total_tokens = request.num_tokens
        max_hit_blocks = max_prefix_hit_blocks(total_tokens, block_size, request.params.prompt_logprobs is not None)
        hit_blocks = self.allocator.cached_prefix(tracked.tokens, max_hit_blocks, tracked.chain)
        num_cached = len(hit_blocks) * block_size
        num_tokens = min(total_tokens - num_cached, budget)
        if not self.allocator.can_admit(num_cached + num_tokens, hit_blocks):
            return None
        self.allocator.admit(request.request_id, hit_blocks, tracked.chain)
        if not self.allocator.allocate_slots(request.request_id, num_cached + num_tokens):
            raise RuntimeError("allocator refused blocks that can_admit promised")
        request.admit(num_cached)
        self._admission[request.request_id] = (num_cached, total_tokens)
        # A readmitted (preempted) request's entry is replaced: its old table was freed.
        self._admitted[request.request_id] = _Admitted(
            request, self.allocator.block_table(request.request_id), self.eos_token_ids, self.config.model_len
        )
        return num_tokens

    def update(self, plan: StepPlan, sampled: Mapping[str, int | Sequence[int]]) -> list[Request]:
        """Apply a step's results: computed counts, prefix-cache registration, new tokens, finishes.
        `sampled` maps each sampling chunk's request id to its new token (a verify chunk's: its tokens, in
        order). Returns finished requests."""
        finished: list[Request] = []
        running, tracked, allocator, admitted = self._running, self._tracked, self.allocator, self._admitted
        block_size = self.config.block_size
        for chunk in plan.chunks:
            request_id = chunk.request_id
            request = running[request_id]
            if chunk.draft_token_ids:
                if self._update_verified(request, len(chunk.draft_token_ids), sampled[request_id]):
                    finished.append(request)
                continue
            old_computed = request.num_computed_tokens
            request.advance_computed(chunk.num_tokens)
            new_computed = request.num_computed_tokens
            # Registration considers full blocks only (the allocator has considered the first
            # old_computed // block_size of them already), so it has work only when a block filled.
            if new_computed // block_size > old_computed // block_size:
                allocator.commit_tokens(request_id, tracked[request_id].tokens, old_computed, new_computed)
            if chunk.samples:
                token = sampled[request_id]
                request.append_token(token)
                # spec.request.finish_reason's rules, from limits computed once at admission.
                reason = admitted[request_id].limits.reason(token, len(request.output_token_ids))
                if reason is not None:
                    self._finish(request, reason)
                    finished.append(request)
        self._plan = None
        return finished

    def _update_verified(self, request: Request, num_drafted: int, tokens: int | Sequence[int]) -> bool:
        """Apply a verify chunk's tokens (spec.speculative.accepted_tokens) and record its acceptance; whether
        the request finished."""
        tokens = (tokens,) if isinstance(tokens, int) else tuple(tokens)
        request_id = request.request_id
        limits = self._admitted[request_id].limits
        reason = None
        for token in tokens:
            if reason is not None:
                raise RuntimeError(f"request {request_id!r} got tokens after it finished ({reason.value})")
            request.append_token(token)
            reason = limits.reason(token, len(request.output_token_ids))
        old_computed = request.num_computed_tokens
        # The last token and the accepted draft tokens have K/V; the newest token does not (yet).
        request.advance_computed(len(tokens))
        new_computed = request.num_computed_tokens
        self.allocator.commit_tokens(request_id, self._tracked[request_id].tokens, old_computed, new_computed)
        self.allocator.truncate(request_id, new_computed)
        if reason is not None:
            self._finish(request, reason)
            return True
        self._gates[request_id].record(num_drafted, len(tokens) - 1, len(request.output_token_ids))
        return False

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status is RequestStatus.RUNNING:
            del self._running[request.request_id]
            self.allocator.free(request.request_id)
        else:
            self.waiting.remove(request)
        self._admission.pop(request.request_id, None)
        self._admitted.pop(request.request_id, None)
        self._tracked.pop(request.request_id, None)
        self._gates.pop(request.request_id, None)
        request.finish(reason)

    def abort(self, request: Request) -> None:
        self._finish(request, FinishReason.ABORT)

    def fail(self, request: Request) -> None:
        """Finish a request with ERROR wherever it is (its newest token was unsampleable: spec.request)."""
        self._finish(request, FinishReason.ERROR)

    # -- inspection --------------------------------------------------------------------------

    def snapshot(self) -> SchedulerSnapshot:
        chunks = self._plan.chunks if self._plan else ()
        scheduled = {chunk.request_id: chunk.num_tokens for chunk in chunks}
        drafted = {chunk.request_id: len(chunk.draft_token_ids) for chunk in chunks if chunk.draft_token_ids}
        requests = {}
        for request_id, tracked in self._tracked.items():
            request = tracked.request
            cached, tokens = self._admission.get(request_id, (0, request.num_tokens))
            requests[request_id] = RequestState(
                request_id=request_id,
                token_ids=tuple(tracked.tokens[:]),
                num_computed_tokens=request.num_computed_tokens,
                num_scheduled_tokens=scheduled.get(request_id, 0),
                cached_tokens_at_admission=cached,
                tokens_at_admission=tokens,
                num_draft_tokens=drafted.get(request_id, 0),
                draft_gate=gate.state() if (gate := self._gates.get(request_id)) else None,
            )
        return SchedulerSnapshot(
            config=self.config,
            waiting=tuple(r.request_id for r in self.waiting),
            running=tuple(self._running),
            requests=requests,
            allocator=self.allocator.snapshot(),
        )
