"""Traces from any engine behind the OpenAI HTTP API, for `twinfer diff` and the report.

An endpoint is named `openai:http://HOST:PORT/v1` among the engines of a diff. Each prompt goes to
`/v1/completions` as token ids, greedy (temperature 0), with `logprobs` = top_k and
`ignore_eos`; the trace (`spec.agreement.Trace`) is rebuilt from the response:

* token ids: from the choice's `token_ids` when the server returns them (`return_token_ids`,
  which twinfer's server and vLLM honour); otherwise from the logprob token strings.
* logprob token strings map back to ids: "token_id:N" when the server honours
  `return_tokens_as_token_ids` (twinfer, vLLM); otherwise through the checkpoint's tokenizer, by
  matching each string against every token decoded alone. A string that several tokens decode to
  (common for byte-level pieces of one character) cannot be mapped: such alternatives are left
  out of the trace and counted in `EndpointTraces.unmapped_alternatives`, and a chosen token that
  cannot be mapped is an error.
* a server that refuses those extension fields (HTTP 400 naming one) is asked again without them,
  once; `notes` says so.

Teacher-forced (`teacher_forced_check`): each prompt followed by the baseline's greedy tokens is
sent with `echo` and `logprobs` and `max_tokens` 1, and the server's prompt logprobs at the
baseline's positions give its top-k and argmax there, compared with the baseline under the same
agreement rule. This isolates numerical error from the compounding of an early divergence. Servers
that do not return prompt logprobs with `echo` (the hosted OpenAI API, for one) are reported as
such, with the reason, rather than failing the diff. The report scores whole sequences the same way
(`endpoint_teacher_forced`).

Errors: `EndpointUnreachable` when no answer came at all (the endpoint is not there to be checked),
`EndpointRefused` for an HTTP error status, `EchoUnsupported` when echo brings no prompt logprobs,
and plain `EndpointError` for an answer that cannot be used.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from spec.agreement import Comparison, Trace, compare_traces
from spec.errors import ConfigError, TwinferError

logger = logging.getLogger(__name__)

ENDPOINT_PREFIX = "openai:"
TOKEN_ID_PATTERN = re.compile(r"^token_id:(\d+)$")
EXTENSIONS = {"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_CONCURRENCY = 8

TraceRunner = Callable[[Sequence[Sequence[int]]], list[Trace]]


class EndpointError(TwinferError):
    """An endpoint could not be reached, refused a request, or answered something unusable."""


class EndpointUnreachable(EndpointError):
    """No answer at all: connection refused, a timeout, a broken connection."""


class EndpointRefused(EndpointError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class EchoUnsupported(EndpointError):
    """The server gives no prompt logprobs with `echo`, so nothing can be scored teacher-forced."""


def is_endpoint(engine: str) -> bool:
    return engine.startswith(ENDPOINT_PREFIX)


def endpoint_url(engine: str) -> str:
    """The base URL of an `openai:http://HOST:PORT/v1` engine name."""
    if not is_endpoint(engine):
        raise ConfigError(f"{engine!r} is not an endpoint; write openai:http://HOST:PORT/v1")
    url = engine.removeprefix(ENDPOINT_PREFIX).rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise ConfigError(f"endpoint {engine!r}: expected openai:http://HOST:PORT/v1 (an http or https URL)")
    return url


class TokenResolver:
    """Token strings from an OpenAI response back to token ids (see the module docstring)."""

    def __init__(self, load_tokenizer: Callable[[], object | None]) -> None:
        self._load_tokenizer = load_tokenizer  # called only if a string is not "token_id:N"
        self._by_string: dict[str, int] | None = None

    @classmethod
    def for_checkpoint(cls, model_checkpoint: str | Path | None) -> TokenResolver:
        return cls(lambda: _tokenizer(model_checkpoint))

    def resolve(self, token: str) -> int | None:
        match = TOKEN_ID_PATTERN.match(token)
        if match:
            return int(match.group(1))
        return self._table().get(token)

    def _table(self) -> dict[str, int]:
        if self._by_string is None:
            tokenizer = self._load_tokenizer()
            if tokenizer is None:
                raise EndpointError(
                    "the endpoint returned token strings, and the checkpoint has no tokenizer to map them"
                )
            seen: dict[str, list[int]] = {}
            for token_id in range(len(tokenizer)):
                seen.setdefault(tokenizer.decode([token_id]), []).append(token_id)
            self._by_string = {text: ids[0] for text, ids in seen.items() if len(ids) == 1}
            logger.info("token strings: %d of %d map to exactly one id", len(self._by_string), len(tokenizer))
        return self._by_string


@dataclass
class EndpointClient:
    """/v1/completions on one server, with the extension fallback described in the module docstring."""

    base_url: str
    model_name: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    use_extensions: bool = True
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._http = httpx.Client(base_url=self.base_url, timeout=self.timeout_s)
        if self.model_name is None:
            try:
                self.model_name = self._discover_model()
            except EndpointError:
                self.close()
                raise

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EndpointClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def complete(self, body: dict[str, object]) -> dict:
        request = {"model": self.model_name, **body, **(EXTENSIONS if self.use_extensions else {})}
        response = self._post(request)
        if response.status_code == 400 and self.use_extensions and _names_extension(response):
            self.use_extensions = False
            self.notes.append(
                f"the server refused the extension fields ({_error_message(response)}); asked without them"
            )
            request = {key: value for key, value in request.items() if key not in EXTENSIONS}
            response = self._post(request)
        if response.status_code != 200:
            raise EndpointRefused(
                f"{self.base_url}/completions answered HTTP {response.status_code}: {_error_message(response)}",
                response.status_code,
            )
        try:
            return response.json()
        except ValueError as error:
            raise EndpointError(f"{self.base_url}/completions answered something that is not JSON: {error}") from error

    def _post(self, request: dict[str, object]) -> httpx.Response:
        return self._send("POST", "/completions", json=request)

    def _send(self, method: str, path: str, **options: object) -> httpx.Response:
        try:
            return self._http.request(method, path, **options)
        except httpx.TransportError as error:
            raise EndpointUnreachable(f"cannot reach {self.base_url}{path}: {error}") from error
        except httpx.HTTPError as error:
            raise EndpointError(f"{self.base_url}{path}: {error}") from error

    def _discover_model(self) -> str:
        response = self._send("GET", "/models")
        try:
            models = response.json()["data"] if response.status_code == 200 else []
        except (ValueError, KeyError, TypeError) as error:
            raise EndpointError(f"cannot list the models of {self.base_url}: {error}") from error
        if not models:
            raise EndpointError(f"{self.base_url}/models lists no model (HTTP {response.status_code})")
        if len(models) > 1:
            self.notes.append(f"the endpoint serves {len(models)} models; compared the first, {models[0]['id']!r}")
        return str(models[0]["id"])


def _names_extension(response: httpx.Response) -> bool:
    message = _error_message(response)
    return any(name in message for name in EXTENSIONS)


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    except ValueError:
        return response.text[:500]


@dataclass
class EndpointTraces:
    """Free-running traces from an endpoint, and what had to be approximated to rebuild them."""

    traces: list[Trace]
    notes: list[str]
    unmapped_alternatives: int


def greedy_traces(
    client: EndpointClient,
    resolver: TokenResolver,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    top_k: int,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> EndpointTraces:
    body = {"max_tokens": max_new_tokens, "temperature": 0.0, "logprobs": top_k}
    responses = _complete_all(client, [{**body, "prompt": list(prompt)} for prompt in prompts], concurrency)
    traces, unmapped = [], 0
    for index, response in enumerate(responses):
        trace, missing = _greedy_trace(response, resolver, index)
        traces.append(trace)
        unmapped += missing
    return EndpointTraces(traces, list(client.notes), unmapped)


def _complete_all(client: EndpointClient, bodies: Sequence[dict[str, object]], concurrency: int) -> list[dict]:
    # The first request alone settles whether the extensions are accepted before the rest go out.
    responses = [client.complete(bodies[0])] if bodies else []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        responses += list(pool.map(client.complete, bodies[1:]))
    return responses


def _greedy_trace(response: dict, resolver: TokenResolver, index: int) -> tuple[Trace, int]:
    choice = _only_choice(response, index)
    logprobs = choice.get("logprobs") or {}
    tokens, chosen = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    if not tokens or len(chosen) != len(tokens) or len(tops) != len(tokens):
        raise EndpointError(f"prompt {index}: the response carries no per-token logprobs (was logprobs ignored?)")
    if choice.get("token_ids") is not None:
        token_ids = [int(t) for t in choice["token_ids"]]
    else:
        token_ids = [_chosen_id(resolver, token, index, position) for position, token in enumerate(tokens)]
    if len(token_ids) != len(tokens):
        raise EndpointError(f"prompt {index}: {len(token_ids)} token ids but {len(tokens)} logprob entries")
    entries, unmapped = [], 0
    for token_id, logprob, top in zip(token_ids, chosen, tops, strict=True):
        mapped, missing = _top_ids(resolver, top or {})
        entries.append(mapped | {token_id: float(logprob)})
        unmapped += missing
    return Trace(tuple(token_ids), tuple(entries)), unmapped


def _only_choice(response: dict, index: int) -> dict:
    choices = response.get("choices") or []
    if len(choices) != 1:
        raise EndpointError(f"prompt {index}: expected one choice, got {len(choices)}")
    return choices[0]


def _chosen_id(resolver: TokenResolver, token: str, index: int, position: int) -> int:
    token_id = resolver.resolve(token)
    if token_id is None:
        raise EndpointError(
            f"prompt {index}, token {position}: the endpoint returned the string {token!r}, which no single token id "
            "matches; a server that honours return_token_ids or return_tokens_as_token_ids avoids this"
        )
    return token_id


def _top_ids(resolver: TokenResolver, top: dict[str, float]) -> tuple[dict[int, float], int]:
    mapped: dict[int, float] = {}
    for token, logprob in top.items():
        token_id = resolver.resolve(token)
        if token_id is not None:
            mapped[token_id] = float(logprob)
    return mapped, len(top) - len(mapped)


def endpoint_runner(
    base_url: str,
    model_checkpoint: str | Path | None,
    max_new_tokens: int,
    top_k: int,
    model_name: str | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> TraceRunner:
    """A runner for `twinfer diff`: prompts (token ids) -> greedy traces from the endpoint at `base_url`.

    `model_checkpoint` supplies the tokenizer used only when the server returns neither token ids
    nor "token_id:N" strings; `model_name` defaults to the first model the server lists.
    """

    def run(prompts: Sequence[Sequence[int]]) -> list[Trace]:
        result = run_greedy(base_url, model_checkpoint, prompts, max_new_tokens, top_k, model_name, concurrency)
        for note in result.notes:
            logger.warning("%s: %s", base_url, note)
        return result.traces

    return run


def run_greedy(
    base_url: str,
    model_checkpoint: str | Path | None,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    top_k: int,
    model_name: str | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> EndpointTraces:
    """Like `endpoint_runner`, keeping the notes and the count of unmappable alternatives for the record."""
    with EndpointClient(base_url, model_name) as client:
        return greedy_traces(
            client, TokenResolver.for_checkpoint(model_checkpoint), prompts, max_new_tokens, top_k, concurrency
        )


# -- teacher-forced ---------------------------------------------------------------------------------


@dataclass
class TeacherForcedResult:
    """The endpoint scored along the baseline's tokens; `supported` False (with `note`) if it cannot be."""

    supported: bool
    note: str
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def all_agree(self) -> bool | None:
        return all(c.agree for c in self.comparisons) if self.supported else None

    def to_dict(self) -> dict[str, object]:
        return {
            "supported": self.supported,
            "note": self.note,
            "all_agree": self.all_agree,
            "prompts": [{"index": index, **c.to_dict()} for index, c in enumerate(self.comparisons)],
        }


def teacher_forced_check(
    base_url: str,
    model_checkpoint: str | Path | None,
    prompts: Sequence[Sequence[int]],
    baseline_traces: Sequence[Trace],
    top_k: int,
    logprob_tolerance: float,
    rule: str,
    model_name: str | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> TeacherForcedResult:
    """Score each prompt + baseline tokens on the endpoint (echo, prompt logprobs) and compare with the baseline."""
    if len(prompts) != len(baseline_traces):
        raise ValueError(f"{len(prompts)} prompts but {len(baseline_traces)} baseline traces")
    sequences = [[*prompt, *trace.token_ids] for prompt, trace in zip(prompts, baseline_traces, strict=True)]
    with EndpointClient(base_url, model_name) as client:
        try:
            echoed = echo_positions(
                client,
                TokenResolver.for_checkpoint(model_checkpoint),
                sequences,
                [len(prompt) for prompt in prompts],
                top_k,
                concurrency,
            )
        except (EchoUnsupported, EndpointRefused, EndpointUnreachable) as error:
            return TeacherForcedResult(False, f"not supported by this server: {error}")
    candidates = [_forced_trace(entries) for entries in echoed.positions]
    comparisons = [
        compare_traces(c, b, logprob_tolerance, rule) for c, b in zip(candidates, baseline_traces, strict=True)
    ]
    notes = "; ".join(echoed.notes)
    return TeacherForcedResult(
        True, "teacher-forced through echo with prompt logprobs" + (f" ({notes})" if notes else ""), comparisons
    )


def _forced_trace(entries: Sequence[dict[int, float]]) -> Trace:
    """The endpoint's argmax and top-k at each baseline position."""
    tokens = [min(entry, key=lambda t: (-entry[t], t)) for entry in entries]  # ties to the lowest id (spec.sampling)
    return Trace(tuple(tokens), tuple(entries))


@dataclass
class EchoedPositions:
    """Per sequence, per position p >= its start: the mapped top-k alternatives | {sequence[p]: its logprob}."""

    positions: list[list[dict[int, float]]]
    notes: list[str]
    unmapped_alternatives: int


def endpoint_teacher_forced(
    base_url: str,
    model_checkpoint: str | Path | None,
    sequences: Sequence[Sequence[int]],
    top_k: int,
    model_name: str | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> EchoedPositions:
    """Every position p >= 1 of each sequence scored by the endpoint given tokens [0, p), for the report's
    teacher-forced cells. Raises EchoUnsupported when the server gives no prompt logprobs with echo."""
    with EndpointClient(base_url, model_name) as client:
        return echo_positions(
            client,
            TokenResolver.for_checkpoint(model_checkpoint),
            sequences,
            [1] * len(sequences),
            top_k,
            concurrency,
        )


def echo_positions(
    client: EndpointClient,
    resolver: TokenResolver,
    sequences: Sequence[Sequence[int]],
    starts: Sequence[int],
    top_k: int,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> EchoedPositions:
    """Send each sequence with echo (max_tokens 1, greedy) and read its prompt logprobs from `starts[i]` on."""
    bodies = [
        {"prompt": list(sequence), "max_tokens": 1, "temperature": 0.0, "logprobs": top_k, "echo": True}
        for sequence in sequences
    ]
    try:
        responses = _complete_all(client, bodies, concurrency)
    except EndpointRefused as error:
        if error.status_code >= 500:
            raise  # the server broke, rather than declined: a failure, not a missing feature
        raise EchoUnsupported(f"echo with prompt logprobs was refused: {error}") from error
    positions, unmapped = [], 0
    for index, (sequence, start, response) in enumerate(zip(sequences, starts, responses, strict=True)):
        entries, missing = _echo_entries(response, resolver, sequence, start, index)
        positions.append(entries)
        unmapped += missing
    return EchoedPositions(positions, list(client.notes), unmapped)


def _echo_entries(
    response: dict, resolver: TokenResolver, sequence: Sequence[int], start: int, index: int
) -> tuple[list[dict[int, float]], int]:
    """One echo response's entries from `start` on, and how many alternatives could not be mapped."""
    choice = _only_choice(response, index)
    logprobs = choice.get("logprobs") or {}
    chosen, tops = logprobs.get("token_logprobs") or [], logprobs.get("top_logprobs") or []
    end = len(sequence)
    if len(chosen) < end or len(tops) < end or any(chosen[p] is None for p in range(start, end)):
        raise EchoUnsupported(f"no prompt logprobs came back with echo (prompt {index})")
    entries, unmapped = [], 0
    for position in range(start, end):
        mapped, missing = _top_ids(resolver, tops[position] or {})
        entries.append(mapped | {sequence[position]: float(chosen[position])})
        unmapped += missing
    return entries, unmapped


def _tokenizer(model_checkpoint: str | Path | None):
    if model_checkpoint is None:
        return None
    from spec.checkpoint import resolve_checkpoint
    from twinfer.llm import has_tokenizer, load_tokenizer

    checkpoint = resolve_checkpoint(model_checkpoint)
    return load_tokenizer(checkpoint) if has_tokenizer(checkpoint) else None
