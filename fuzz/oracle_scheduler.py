"""An independent oracle of the scheduling policy, written from spec.scheduling's docstring.

It is the policy in the docstring's own words and order, over the plain pool model; it knows
nothing of reference/scheduler.py. The twin check holds every registered scheduler to the
decisions it makes, step by step. Its block ids are its own (decisions never depend on them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from fuzz.pool_model import PoolModel
from fuzz.workload import RequestScript
from spec.engine_config import EngineConfig
from spec.request import FinishReason
from spec.scheduling import ScheduledChunk, StepPlan
from spec.speculative import propose_ngram


@dataclass
class OracleRequest:
    script: RequestScript
    output: list[int] = field(default_factory=list)
    computed: int = 0
    # Its acceptance gate (spec.speculative.AcceptanceGate, in the oracle's own words): the (drafted,
    # accepted) counts of its verify chunks since it last paused, when it may propose again, the next
    # pause's length (None: the configured start) and whether its next verify is a probe.
    verifies: list[tuple[int, int]] = field(default_factory=list)
    resume_at: int = 0
    backoff: int = 0  # set when added
    probing: bool = False

    def gate_state(self) -> tuple[int, int, bool, tuple[tuple[int, int], ...]]:
        """As spec.speculative.AcceptanceGate.state: (resume_at, backoff, probing, window)."""
        return self.resume_at, self.backoff, self.probing, tuple(self.verifies)

    @property
    def request_id(self) -> str:
        return self.script.request_id

    @property
    def tokens(self) -> list[int]:
        return [*self.script.prompt, *self.output]


class OracleScheduler:
    def __init__(self, config: EngineConfig, eos_token_ids: Sequence[int]) -> None:
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pool = PoolModel.from_free_queue(config.block_size, range(config.num_blocks), config.enable_prefix_caching)
        self.waiting: list[OracleRequest] = []  # index 0 is the head
        self.running: list[OracleRequest] = []  # oldest admission first
        self.finish_reasons: dict[str, FinishReason] = {}
        # What the acceptance gates did (the fuzzer's coverage): pauses, probes judged, decoding chunks kept
        # from proposing by a pause or by a large step.
        self.gate_events: Counter[str] = Counter()

    def add(self, script: RequestScript) -> None:
        request = OracleRequest(script)
        if self.config.speculative is not None:
            request.backoff = self.config.speculative.backoff_outputs
        self.waiting.append(request)

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens  # 1.
        chunks: list[ScheduledChunk] = []
        preempted: list[str] = []

        position = 0  # 2. running requests, oldest first, while budget > 0
        while position < len(self.running) and budget > 0:
            request = self.running[position]
            n = min(len(request.tokens) - request.computed, budget)
            if not self._grow_preempting_newest(request, request.computed + n, preempted):
                break  # the request itself was preempted: the running pass ends
            chunks.append(self._chunk(request, n))
            budget -= n
            position += 1

        admitted: list[str] = []
        if not preempted and self.config.speculative is not None:  # 2b. drafts
            budget = self._draft(chunks, budget)
        if not preempted:  # 3. admission, first come first served
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                head = self.waiting[0]
                hit = self.pool.cached_prefix(head.tokens)
                cached_tokens = len(hit) * self.config.block_size
                n = min(len(head.tokens) - cached_tokens, budget)
                if not self.pool.can_admit(cached_tokens + n, hit):
                    break  # the head of the queue is never skipped
                self.waiting.pop(0)
                self.pool.admit(head.request_id, hit)
                assert self.pool.grow(head.request_id, cached_tokens + n), "oracle: can_admit promised these blocks"
                head.computed = cached_tokens
                self.running.append(head)
                admitted.append(head.request_id)
                chunks.append(self._chunk(head, n))
                budget -= n
        return StepPlan(chunks=tuple(chunks), preempted=tuple(preempted), admitted=tuple(admitted))  # 4.

    def _draft(self, chunks: list[ScheduledChunk], budget: int) -> int:
        """Prompt lookup's drafts join the single-token sampling chunks, in running order, cut to the
        token budget and to what the free blocks cover (never a preemption)."""
        speculative = self.config.speculative
        by_id = {request.request_id: request for request in self.running}
        decoding = [index for index, chunk in enumerate(chunks) if chunk.num_tokens == 1 and chunk.samples]
        rows = speculative.large_batch_rows
        large = rows is not None and len(decoding) >= rows
        if budget <= 0:  # no budget left by the plain chunks: nobody is asked
            return budget
        for index in decoding:
            chunk = chunks[index]
            request = by_id[chunk.request_id]
            if not self._may_propose(request, large):
                continue
            max_outputs = min(request.script.max_tokens, self.config.model_len - len(request.script.prompt))
            limit = min(speculative.num_speculative_tokens, max_outputs - len(request.output) - 1)
            if limit <= 0:
                continue
            draft = propose_ngram(request.tokens, limit, speculative.ngram_min, speculative.ngram_max)
            if not draft:  # asked, nothing found: judged as one rejected draft token, whatever the budget
                self.gate_events["empty_proposals"] += 1
                self._judge(request, 1, 0)
                continue
            if budget <= 0:
                continue
            covered = len(request.tokens)
            fits = (len(self.pool.tables[request.request_id]) + self.pool.num_free_blocks) * self.config.block_size
            draft = draft[: min(budget, fits - covered)]
            if not draft:
                continue
            assert self.pool.grow(request.request_id, covered + len(draft)), "oracle: the free blocks cover the draft"
            chunks[index] = ScheduledChunk(chunk.request_id, chunk.start, 1 + len(draft), True, tuple(draft))
            budget -= len(draft)
        return budget

    def _may_propose(self, request: OracleRequest, large: bool) -> bool:
        """Not paused and, in a large step, a full window of verifies that accepted at least the large-step
        rate of their drafts."""
        speculative = self.config.speculative
        if len(request.output) < request.resume_at:
            self.gate_events["skipped_paused"] += 1
            return False
        if not large:
            return True
        full = len(request.verifies) == speculative.acceptance_window
        drafted = sum(d for d, _ in request.verifies)
        if full and sum(a for _, a in request.verifies) >= speculative.large_batch_acceptance_rate * drafted:
            return True
        self.gate_events["skipped_large_step"] += 1
        return False

    def _judge(self, request: OracleRequest, drafted: int, accepted: int) -> None:
        """After a verify chunk of a request that goes on: its window keeps the newest W verifies; judged on a
        full window or a probe, a rate below min_acceptance_rate pauses it for backoff outputs (doubling, at
        most the maximum), clears the window and makes the next verify a probe; passing resets backoff."""
        speculative = self.config.speculative
        window = speculative.acceptance_window
        request.verifies = [*request.verifies, (drafted, accepted)][-window:]
        if not request.probing and len(request.verifies) < window:
            return
        if request.probing:
            self.gate_events["probes"] += 1
        total_drafted = sum(d for d, _ in request.verifies)
        total_accepted = sum(a for _, a in request.verifies)
        if total_accepted >= speculative.min_acceptance_rate * total_drafted:
            request.probing = False
            request.backoff = speculative.backoff_outputs
            return
        self.gate_events["pauses"] += 1
        request.resume_at = len(request.output) + request.backoff
        request.backoff = min(2 * request.backoff, speculative.max_backoff_outputs)
        request.verifies = []
        request.probing = True

    def _grow_preempting_newest(self, request: OracleRequest, num_tokens: int, preempted: list[str]) -> bool:
        while not self.pool.grow(request.request_id, num_tokens):
            victim = self.running.pop()  # the most recently admitted
            self.pool.free(victim.request_id)
            victim.computed = 0
            self.waiting.insert(0, victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    @staticmethod
    def _chunk(request: OracleRequest, n: int) -> ScheduledChunk:
        start = request.computed
        return ScheduledChunk(request.request_id, start, n, samples=start + n == len(request.tokens))

    def update(self, plan: StepPlan, sampled: dict[str, int | tuple[int, ...]]) -> list[str]:
        """Apply the step; the ids of the requests that finished, in plan order."""
        by_id = {request.request_id: request for request in self.running}
        finished: list[str] = []
        for chunk in plan.chunks:
            request = by_id[chunk.request_id]
            if chunk.draft_token_ids:
                if self._verify(request, chunk, sampled[request.request_id]):
                    finished.append(request.request_id)
                continue
            request.computed += chunk.num_tokens
            self.pool.commit(request.request_id, request.tokens, request.computed)
            if not chunk.samples:
                continue
            request.output.append(sampled[request.request_id])
            reason = self._finish_reason(request)
            if reason is not None:
                self.running.remove(request)
                self.pool.free(request.request_id)
                self.finish_reasons[request.request_id] = reason
                finished.append(request.request_id)
        return finished

    def _verify(self, request: OracleRequest, chunk: ScheduledChunk, tokens: int | tuple[int, ...]) -> bool:
        """A verify chunk's tokens appended one by one (each checked for a finish); the computed count
        grows by their number, the rest of the table is rolled back. Whether the request finished."""
        tokens = (tokens,) if isinstance(tokens, int) else tokens
        reason = None
        for token in tokens:
            assert reason is None, f"oracle: {request.request_id!r} got tokens after it finished"
            request.output.append(token)
            reason = self._finish_reason(request)
        request.computed += len(tokens)
        self.pool.commit(request.request_id, request.tokens, request.computed)
        self.pool.truncate(request.request_id, request.computed)
        if reason is None:
            self._judge(request, len(chunk.draft_token_ids), len(tokens) - 1)
            return False
        self.running.remove(request)
        self.pool.free(request.request_id)
        self.finish_reasons[request.request_id] = reason
        return True

    def _finish_reason(self, request: OracleRequest) -> FinishReason | None:
        script = request.script
        token = request.output[-1]
        if (token in self.eos_token_ids and not script.ignore_eos) or token in script.stop_token_ids:
            return FinishReason.STOP
        if len(request.output) >= script.max_tokens or len(request.tokens) >= self.config.model_len:
            return FinishReason.LENGTH
        return None

    def abort(self, request_id: str) -> None:
        for queue in (self.running, self.waiting):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    if queue is self.running:
                        self.pool.free(request_id)
                    self.finish_reasons[request_id] = FinishReason.ABORT
                    return
        raise KeyError(f"oracle: no active request {request_id!r}")

    def gate_states(self) -> dict[str, tuple[int, int, bool, tuple[tuple[int, int], ...]]]:
        """Every unfinished request's acceptance gate (speculative decoding only)."""
        if self.config.speculative is None:
            return {}
        return {request.request_id: request.gate_state() for request in (*self.waiting, *self.running)}

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
