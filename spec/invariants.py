"""Block-allocator and scheduler invariants as executable checks over state snapshots.

Engines export a snapshot of their state (the types below); `check_allocator` and
`check_scheduler` verify one snapshot, and `InvariantMonitor` adds the checks that need
history (a hashed block never changes; every admitted request finishes exactly once).
A broken invariant raises `InvariantViolation` whose `invariant` attribute names it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from spec.block_hash import NO_PARENT, HashFunction, hash_block, hash_full_blocks
from spec.engine_config import EngineConfig
from spec.errors import InvariantViolation

# Invariant names, as they appear in InvariantViolation.invariant.
BLOCKS_PARTITIONED = "blocks-partitioned"
REF_COUNT_MATCHES_TABLES = "ref-count-matches-tables"
HASH_MAP_MATCHES_CONTENT = "hash-map-matches-content"
HASHED_BLOCK_IMMUTABLE = "hashed-block-immutable"
BLOCK_TABLE_COVERS_TOKENS = "block-table-covers-tokens"
TABLE_CONTENT_MATCHES_REQUEST = "table-content-matches-request"
PREFIX_HIT_WHOLE_BLOCKS = "prefix-hit-whole-blocks"
ONE_QUEUE_PER_REQUEST = "one-queue-per-request"
RUNNING_WITHIN_MAX_NUM_SEQS = "running-within-max-num-seqs"
STEP_WITHIN_TOKEN_BUDGET = "step-within-token-budget"
COMPUTED_WITHIN_TOKENS = "computed-within-tokens"
FINISHES_EXACTLY_ONCE = "finishes-exactly-once"
IDLE_HOLDS_ONLY_CACHE = "idle-holds-only-cache"

ALL_INVARIANTS = (
    BLOCKS_PARTITIONED,
    REF_COUNT_MATCHES_TABLES,
    HASH_MAP_MATCHES_CONTENT,
    HASHED_BLOCK_IMMUTABLE,
    BLOCK_TABLE_COVERS_TOKENS,
    TABLE_CONTENT_MATCHES_REQUEST,
    PREFIX_HIT_WHOLE_BLOCKS,
    ONE_QUEUE_PER_REQUEST,
    RUNNING_WITHIN_MAX_NUM_SEQS,
    STEP_WITHIN_TOKEN_BUDGET,
    COMPUTED_WITHIN_TOKENS,
    FINISHES_EXACTLY_ONCE,
    IDLE_HOLDS_ONLY_CACHE,
)


@dataclass(frozen=True)
class BlockState:
    """One KV block. `block_hash` is set only for full blocks registered in the prefix cache;
    `token_ids` and `parent_hash` are the content the hash was computed from."""

    block_id: int
    ref_count: int
    block_hash: int | None = None
    parent_hash: int | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AllocatorSnapshot:
    num_blocks: int
    block_size: int
    free_block_ids: tuple[int, ...]  # the free queue, next to be reused first
    blocks: tuple[BlockState, ...]  # indexed by block id
    cached_blocks: dict[int, int]  # block hash -> block id (the prefix cache)
    block_tables: dict[str, tuple[int, ...]]  # request id -> block ids, in token order
    hash_function: HashFunction = hash_block  # the allocator's block hash (tests inject colliding ones)


@dataclass(frozen=True)
class RequestState:
    request_id: str
    token_ids: tuple[int, ...]  # prompt plus output so far
    num_computed_tokens: int  # tokens whose K/V are in the cache
    num_scheduled_tokens: int  # tokens scheduled in the current step (0 between steps)
    cached_tokens_at_admission: int  # prefix-cache hit at the last admission
    tokens_at_admission: int  # len(token_ids) at the last admission
    # Of num_scheduled_tokens: draft tokens of a verify chunk (speculative decoding), not in token_ids.
    num_draft_tokens: int = 0
    # Speculative decoding: its acceptance gate (spec.speculative.AcceptanceGate.state), so that two
    # schedulers' snapshots differ where their gates do. None without speculation.
    draft_gate: tuple | None = None


@dataclass(frozen=True)
class SchedulerSnapshot:
    config: EngineConfig
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    requests: dict[str, RequestState]  # every unfinished request, from a registry kept apart from the queues
    allocator: AllocatorSnapshot


def _fail(invariant: str, detail: str) -> None:
    raise InvariantViolation(invariant, detail)


def check_allocator(snapshot: AllocatorSnapshot) -> None:
    """Invariants of the block pool alone."""
    _check_partition(snapshot)
    _check_ref_counts(snapshot)
    _check_hash_map(snapshot)


def _check_partition(snapshot: AllocatorSnapshot) -> None:
    free = snapshot.free_block_ids
    if len(set(free)) != len(free):
        _fail(
            BLOCKS_PARTITIONED,
            f"the free queue holds a block twice: {sorted(k for k, v in Counter(free).items() if v > 1)}",
        )
    if len(snapshot.blocks) != snapshot.num_blocks:
        _fail(BLOCKS_PARTITIONED, f"{len(snapshot.blocks)} block states for a pool of {snapshot.num_blocks}")
    free_set = set(free)
    for block in snapshot.blocks:
        is_free = block.block_id in free_set
        if block.ref_count < 0:
            _fail(BLOCKS_PARTITIONED, f"block {block.block_id} has negative ref count {block.ref_count}")
        if is_free and block.ref_count != 0:
            _fail(BLOCKS_PARTITIONED, f"block {block.block_id} is free but has ref count {block.ref_count}")
        if not is_free and block.ref_count == 0:
            _fail(
                BLOCKS_PARTITIONED,
                f"block {block.block_id} is neither free nor used (ref count 0, not in the free queue)",
            )
    unknown = [b for b in free if not 0 <= b < snapshot.num_blocks]
    if unknown:
        _fail(BLOCKS_PARTITIONED, f"free queue holds unknown blocks {unknown}")


def _check_ref_counts(snapshot: AllocatorSnapshot) -> None:
    holders: Counter[int] = Counter()
    for request_id, table in snapshot.block_tables.items():
        if len(set(table)) != len(table):
            _fail(REF_COUNT_MATCHES_TABLES, f"request {request_id!r} holds a block twice: {list(table)}")
        holders.update(table)
    for block in snapshot.blocks:
        if block.ref_count != holders[block.block_id]:
            _fail(
                REF_COUNT_MATCHES_TABLES,
                f"block {block.block_id} has ref count {block.ref_count} "
                f"but {holders[block.block_id]} block tables hold it",
            )


def _check_hash_map(snapshot: AllocatorSnapshot) -> None:
    for block_hash, block_id in snapshot.cached_blocks.items():
        if not 0 <= block_id < snapshot.num_blocks:
            _fail(HASH_MAP_MATCHES_CONTENT, f"hash map points {block_hash:#x} at unknown block {block_id}")
        block = snapshot.blocks[block_id]
        if block.block_hash != block_hash:
            _fail(
                HASH_MAP_MATCHES_CONTENT,
                f"hash map points {block_hash:#x} at block {block_id}, whose hash is {block.block_hash}",
            )
    for block in snapshot.blocks:
        if block.block_hash is None:
            continue
        if snapshot.cached_blocks.get(block.block_hash) != block.block_id:
            _fail(
                HASH_MAP_MATCHES_CONTENT,
                f"block {block.block_id} carries hash {block.block_hash:#x} the hash map does not point at it",
            )
        if block.token_ids is None or len(block.token_ids) != snapshot.block_size:
            _fail(HASH_MAP_MATCHES_CONTENT, f"hashed block {block.block_id} is not full: {block.token_ids}")
        parent = NO_PARENT if block.parent_hash is None else block.parent_hash
        if snapshot.hash_function(parent, block.token_ids) != block.block_hash:
            _fail(HASH_MAP_MATCHES_CONTENT, f"block {block.block_id}'s hash does not match its content")


def check_scheduler(snapshot: SchedulerSnapshot) -> None:
    """Invariants of the scheduler and of how its requests use the allocator."""
    check_allocator(snapshot.allocator)
    config = snapshot.config
    _check_queues(snapshot)
    if len(snapshot.running) > config.max_num_seqs:
        _fail(RUNNING_WITHIN_MAX_NUM_SEQS, f"{len(snapshot.running)} running > max_num_seqs {config.max_num_seqs}")
    scheduled = sum(state.num_scheduled_tokens for state in snapshot.requests.values())
    if scheduled > config.max_num_batched_tokens:
        _fail(
            STEP_WITHIN_TOKEN_BUDGET,
            f"{scheduled} tokens scheduled > max_num_batched_tokens {config.max_num_batched_tokens}",
        )
    for request_id in snapshot.waiting:
        _check_waiting_request(snapshot, snapshot.requests[request_id])
    for request_id in snapshot.running:
        _check_running_request(snapshot, snapshot.requests[request_id])
    stray = set(snapshot.allocator.block_tables) - set(snapshot.running)
    if stray:
        _fail(BLOCK_TABLE_COVERS_TOKENS, f"requests that are not running hold blocks: {sorted(stray)}")
    if not snapshot.waiting and not snapshot.running:
        held = [b.block_id for b in snapshot.allocator.blocks if b.ref_count > 0]
        if held:
            _fail(IDLE_HOLDS_ONLY_CACHE, f"no request is active but blocks {held} are held")


def _check_queues(snapshot: SchedulerSnapshot) -> None:
    seen = Counter([*snapshot.waiting, *snapshot.running])
    twice = sorted(request_id for request_id, count in seen.items() if count > 1)
    if twice:
        _fail(ONE_QUEUE_PER_REQUEST, f"requests in two queues (or twice in one): {twice}")
    if set(seen) != set(snapshot.requests):
        lost = sorted(set(snapshot.requests) - set(seen))
        _fail(
            ONE_QUEUE_PER_REQUEST,
            f"active requests in no queue: {lost}; unknown in queues: {sorted(set(seen) - set(snapshot.requests))}",
        )


def _check_waiting_request(snapshot: SchedulerSnapshot, state: RequestState) -> None:
    if state.num_scheduled_tokens or state.num_computed_tokens:
        _fail(
            COMPUTED_WITHIN_TOKENS,
            f"waiting request {state.request_id!r} has {state.num_computed_tokens} computed and "
            f"{state.num_scheduled_tokens} scheduled tokens",
        )


def _check_running_request(snapshot: SchedulerSnapshot, state: RequestState) -> None:
    block_size = snapshot.config.block_size
    covered = state.num_computed_tokens + state.num_scheduled_tokens
    drafts = state.num_draft_tokens
    speculative = snapshot.config.speculative
    max_drafts = speculative.num_speculative_tokens if speculative is not None else 0
    # A verify chunk covers the request's last token and its draft: nothing else, so drafts extend only
    # a request whose one uncomputed token is scheduled.
    is_verify = drafts == 0 or (
        state.num_computed_tokens + 1 == len(state.token_ids) and state.num_scheduled_tokens == 1 + drafts
    )
    if not (
        0 <= state.num_computed_tokens
        and covered <= len(state.token_ids) + drafts
        and state.num_scheduled_tokens >= 0
        and 0 <= drafts <= max_drafts
        and is_verify
    ):
        _fail(
            COMPUTED_WITHIN_TOKENS,
            f"request {state.request_id!r}: {state.num_computed_tokens} computed + {state.num_scheduled_tokens} "
            f"scheduled ({drafts} of them drafted) of {len(state.token_ids)} tokens",
        )
    table = snapshot.allocator.block_tables.get(state.request_id, ())
    needed = -(-covered // block_size)
    if len(table) != needed:
        _fail(
            BLOCK_TABLE_COVERS_TOKENS,
            f"request {state.request_id!r} holds {len(table)} blocks for {covered} computed+scheduled tokens "
            f"(needs exactly {needed} of size {block_size})",
        )
    cached = state.cached_tokens_at_admission
    if cached % block_size or cached >= state.tokens_at_admission:
        _fail(
            PREFIX_HIT_WHOLE_BLOCKS,
            f"request {state.request_id!r} was admitted with {cached} cached tokens of {state.tokens_at_admission} "
            f"(must be whole blocks of {block_size} and leave a token to compute)",
        )
    expected_hashes = hash_full_blocks(
        state.token_ids, block_size, state.num_computed_tokens // block_size, snapshot.allocator.hash_function
    )
    for index, expected in enumerate(expected_hashes):
        block = snapshot.allocator.blocks[table[index]]
        if block.block_hash is not None and block.block_hash != expected:
            _fail(
                TABLE_CONTENT_MATCHES_REQUEST,
                f"request {state.request_id!r} block {index} (id {block.block_id}) "
                "is cached under a hash of other tokens",
            )


@dataclass
class InvariantMonitor:
    """Invariants that need history: call `observe` after every step, `finished` for each output."""

    _hashed_content: dict[int, tuple[int, tuple[int, ...] | None]] = field(default_factory=dict)
    _admitted: set[str] = field(default_factory=set)
    _finished: set[str] = field(default_factory=set)

    def observe(self, snapshot: SchedulerSnapshot) -> None:
        check_scheduler(snapshot)  # the allocator's invariants included: they are not checked twice
        self._observe_hashed_content(snapshot.allocator)
        self._admitted.update(snapshot.running)

    def observe_allocator(self, snapshot: AllocatorSnapshot) -> None:
        check_allocator(snapshot)
        self._observe_hashed_content(snapshot)

    def _observe_hashed_content(self, snapshot: AllocatorSnapshot) -> None:
        """hashed-block-immutable against the previous snapshot; the current one is kept for the next."""
        current: dict[int, tuple[int, tuple[int, ...] | None]] = {}
        for block in snapshot.blocks:
            if block.block_hash is None:
                continue
            content = (block.block_hash, block.token_ids)
            previous = self._hashed_content.get(block.block_id)
            if previous is not None and previous[0] == block.block_hash and previous[1] != block.token_ids:
                _fail(HASHED_BLOCK_IMMUTABLE, f"hashed block {block.block_id} changed content while keeping its hash")
            current[block.block_id] = content
        self._hashed_content = current

    def finished(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            if request_id in self._finished:
                _fail(FINISHES_EXACTLY_ONCE, f"request {request_id!r} finished twice")
            self._finished.add(request_id)

    def check_all_finished(self) -> None:
        """Call when the engine is idle: every admitted request has finished (once)."""
        missing = sorted(self._admitted - self._finished)
        if missing:
            _fail(FINISHES_EXACTLY_ONCE, f"admitted requests never finished: {missing}")
