"""Continuous-batching scheduler with chunked prefill and recompute preemption.

It follows the policy written in spec.scheduling step for step; read that docstring first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from reference.block_allocator import BlockAllocator
from spec.block_hash import HashFunction, hash_block
from spec.engine_config import EngineConfig
from spec.invariants import RequestState, SchedulerSnapshot
from spec.request import FinishLimits, FinishReason, Request, RequestStatus, finish_reason
from spec.scheduling import ScheduledChunk, StepPlan, draft_room, max_prefix_hit_blocks
from spec.speculative import AcceptanceGate, DraftProposer, draft_limit, is_large_batch, make_ngram_proposer


class Scheduler:
    """Changes a `Request` only through its methods (spec.request's contract)."""

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
        self.running: list[Request] = []
        # Every unfinished request, whatever its queue: redundant with the queues on purpose, so
        # a request that falls out of both is visible to the invariant checks.
        self._active: dict[str, Request] = {}
        self._scheduled: dict[str, int] = {}  # request id -> tokens scheduled in the current step
        self._drafted: dict[str, int] = {}  # request id -> draft tokens of its verify chunk in the current step
        self._admission: dict[str, tuple[int, int]] = {}  # request id -> (cached tokens, tokens) at admission
        self._gates: dict[str, AcceptanceGate] = {}  # request id -> when it proposes (speculative decoding only)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self._active[request.request_id] = request
        self.waiting.append(request)
        if self.config.speculative is not None:
            self._gates[request.request_id] = AcceptanceGate(self.config.speculative)

    # -- one step ----------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[str] = []
        self._scheduled = {}
        self._drafted = {}

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_tokens = min(request.num_uncomputed_tokens, budget)
            if not self._grow_or_preempt(request, request.num_computed_tokens + num_tokens, preempted):
                break
            chunks.append(self._chunk(request, num_tokens))
            budget -= num_tokens
            index += 1

        admitted: list[str] = []
        if not preempted:
            budget = self._add_drafts(chunks, budget)
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                request = self.waiting[0]
                num_tokens = self._try_admit(request, budget)
                if num_tokens is None:
                    break
                self.waiting.popleft()
                self.running.append(request)
                admitted.append(request.request_id)
                chunks.append(self._chunk(request, num_tokens))
                budget -= num_tokens
        return StepPlan(chunks=tuple(chunks), preempted=tuple(preempted), admitted=tuple(admitted))

    def _add_drafts(self, chunks: list[ScheduledChunk], budget: int) -> int:
        """Speculative decoding (spec.scheduling step 2b): drafts join the decoding chunks as far as the
        budget and the free blocks allow; the budget left."""
        if self.proposer is None or budget <= 0:
            return budget
        by_id = {request.request_id: request for request in self.running}
        decoding = [index for index, chunk in enumerate(chunks) if chunk.num_tokens == 1 and chunk.samples]
        large_batch = is_large_batch(self.config.speculative, len(decoding))
        candidates: list[tuple[int, Request, int]] = []  # (chunk index, request, draft limit)
        for index in decoding:
            request = by_id[chunks[index].request_id]
            if self._gates[request.request_id].may_propose(len(request.output_token_ids), large_batch):
                limits = FinishLimits.of(
                    request.params, len(request.prompt_token_ids), self.eos_token_ids, self.config.model_len
                )
                limit = draft_limit(
                    self.config.speculative.num_speculative_tokens, len(request.output_token_ids), limits.max_outputs
                )
                if limit > 0:
                    candidates.append((index, request, limit))
        if not candidates:
            return budget
        drafts = self.proposer.propose([r.all_token_ids for _, r, _ in candidates], [limit for *_, limit in candidates])
        for (_, request, _), draft in zip(candidates, drafts, strict=True):
            if not draft:  # the proposer had nothing: recorded as a rejected draft token (spec.scheduling 2b)
                self._gates[request.request_id].record_empty_proposal(len(request.output_token_ids))
        for (index, request, limit), draft in zip(candidates, drafts, strict=True):
            if budget <= 0:
                break
            covered = request.num_tokens  # the chunk's one token is the request's last
            room = draft_room(
                len(self.allocator.block_table(request.request_id)),
                self.allocator.num_free_blocks,
                self.config.block_size,
                covered,
            )
            draft = tuple(draft[: min(limit, budget, room)])
            if not draft:
                continue
            if not self.allocator.allocate_slots(request.request_id, covered + len(draft)):
                raise RuntimeError("allocator refused blocks that draft_room counted as free")
            chunk = chunks[index]
            chunks[index] = ScheduledChunk(chunk.request_id, chunk.start, 1 + len(draft), True, draft)
            self._scheduled[request.request_id] = 1 + len(draft)
            self._drafted[request.request_id] = len(draft)
            budget -= len(draft)
        return budget

    def _grow_or_preempt(self, request: Request, num_tokens: int, preempted: list[str]) -> bool:
        """Cover `num_tokens` of `request`, preempting the newest running requests if needed.
        False when `request` itself had to be preempted."""
        while not self.allocator.allocate_slots(request.request_id, num_tokens):
            victim = self.running.pop()
            self.allocator.free(victim.request_id)
            victim.preempt()
            self._admission.pop(victim.request_id, None)
            self.waiting.appendleft(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _try_admit(self, request: Request, budget: int) -> int | None:
        """Admit the head of the waiting queue if the pool allows; the number of tokens scheduled."""
        token_ids = request.all_token_ids
        wants_prompt_logprobs = request.params.prompt_logprobs is not None
        max_hit_blocks = max_prefix_hit_blocks(len(token_ids), self.config.block_size, wants_prompt_logprobs)
        hit_blocks = self.allocator.cached_prefix(token_ids, max_hit_blocks)
        num_cached = len(hit_blocks) * self.config.block_size
        num_tokens = min(len(token_ids) - num_cached, budget)
        if not self.allocator.can_admit(num_cached + num_tokens, hit_blocks):
            return None
        self.allocator.admit(request.request_id, hit_blocks)
        if not self.allocator.allocate_slots(request.request_id, num_cached + num_tokens):
            raise RuntimeError("allocator refused blocks that can_admit promised")
        request.admit(num_cached)
        self._admission[request.request_id] = (num_cached, len(token_ids))
        return num_tokens

    def _chunk(self, request: Request, num_tokens: int) -> ScheduledChunk:
        self._scheduled[request.request_id] = num_tokens
        start = request.num_computed_tokens
        return ScheduledChunk(
            request_id=request.request_id,
            start=start,
            num_tokens=num_tokens,
            samples=start + num_tokens == request.num_tokens,
        )

    def update(self, plan: StepPlan, sampled: Mapping[str, int | Sequence[int]]) -> list[Request]:
        """Apply a step's results: computed counts, prefix-cache registration, new tokens, finishes.
        `sampled` maps each sampling chunk's request id to its new token (a verify chunk's: its tokens, in
        order). Returns finished requests."""
        by_id = {request.request_id: request for request in self.running}
        finished: list[Request] = []
        for chunk in plan.chunks:
            request = by_id[chunk.request_id]
            if chunk.draft_token_ids:
                if self._update_verified(request, len(chunk.draft_token_ids), sampled[request.request_id]):
                    finished.append(request)
                continue
            old_computed = request.num_computed_tokens
            request.advance_computed(chunk.num_tokens)
            self.allocator.commit_tokens(
                request.request_id, request.all_token_ids, old_computed, request.num_computed_tokens
            )
            if chunk.samples:
                request.append_token(sampled[request.request_id])
                reason = finish_reason(request, self.eos_token_ids, self.config.model_len)
                if reason is not None:
                    self._finish(request, reason)
                    finished.append(request)
        self._scheduled = {}
        self._drafted = {}
        return finished

    def _update_verified(self, request: Request, num_drafted: int, tokens: int | Sequence[int]) -> bool:
        """Apply a verify chunk's tokens (spec.speculative.accepted_tokens) and record its acceptance; whether
        the request finished."""
        tokens = (tokens,) if isinstance(tokens, int) else tuple(tokens)
        reason = None
        for token in tokens:
            if reason is not None:
                raise RuntimeError(f"request {request.request_id!r} got tokens after it finished ({reason.value})")
            request.append_token(token)
            reason = finish_reason(request, self.eos_token_ids, self.config.model_len)
        old_computed = request.num_computed_tokens
        # The last token and the accepted draft tokens have K/V; the newest token does not (yet).
        request.advance_computed(len(tokens))
        new_computed = request.num_computed_tokens
        self.allocator.commit_tokens(request.request_id, request.all_token_ids, old_computed, new_computed)
        self.allocator.truncate(request.request_id, request.num_computed_tokens)
        if reason is not None:
            self._finish(request, reason)
            return True
        self._gates[request.request_id].record(num_drafted, len(tokens) - 1, len(request.output_token_ids))
        return False

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self.allocator.free(request.request_id)
        else:
            self.waiting.remove(request)
        self._admission.pop(request.request_id, None)
        self._active.pop(request.request_id, None)
        self._gates.pop(request.request_id, None)
        request.finish(reason)

    def abort(self, request: Request) -> None:
        self._finish(request, FinishReason.ABORT)

    def fail(self, request: Request) -> None:
        """Finish a request with ERROR wherever it is (its newest token was unsampleable: spec.request)."""
        self._finish(request, FinishReason.ERROR)

    # -- inspection --------------------------------------------------------------------------

    def snapshot(self) -> SchedulerSnapshot:
        requests = {}
        for request in self._active.values():
            cached, tokens = self._admission.get(request.request_id, (0, request.num_tokens))
            requests[request.request_id] = RequestState(
                request_id=request.request_id,
                token_ids=tuple(request.all_token_ids),
                num_computed_tokens=request.num_computed_tokens,
                num_scheduled_tokens=self._scheduled.get(request.request_id, 0),
                cached_tokens_at_admission=cached,
                tokens_at_admission=tokens,
                num_draft_tokens=self._drafted.get(request.request_id, 0),
                draft_gate=gate.state() if (gate := self._gates.get(request.request_id)) else None,
            )
        return SchedulerSnapshot(
            config=self.config,
            waiting=tuple(r.request_id for r in self.waiting),
            running=tuple(r.request_id for r in self.running),
            requests=requests,
            allocator=self.allocator.snapshot(),
        )
