"""One choice of a response: the engine request behind it, turned into text, logprobs and a finish reason.

A `ChoiceState` takes each step's new tokens (`TokenDelta`) one at a time through the detokenizer
and the stop-string matcher, so a stop string ends the choice at the
exact token that completed it (later tokens the engine made in the same step are dropped, and the
server aborts the engine request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spec.request import FinishReason, TokenLogprobs
from spec.sampling_params import SamplingParams
from twinfer.server.detokenize import IncrementalDetokenizer, StopStringMatcher, TextCodec
from twinfer.server.engine_loop import TokenDelta
from twinfer.server.protocol import TOKEN_ID_PREFIX

# JSON has no -inf; like vLLM, report impossible tokens with a very negative finite logprob.
MIN_LOGPROB = -9999.0


@dataclass(frozen=True)
class LogprobEntry:
    """One token's logprob and its top alternatives, with the token strings the API shows."""

    token_id: int
    token: str
    logprob: float | None  # None for the first prompt token (nothing predicts it)
    top: tuple[tuple[int, str, float], ...]  # (token id, token string, logprob), most likely first
    text_offset: int  # where the token's string starts: the sum of the earlier token strings' lengths


@dataclass
class ChoiceDelta:
    """What one update added to a choice."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[LogprobEntry] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(frozen=True)
class ChoiceSpec:
    """What the HTTP request asked of one choice."""

    index: int
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    stop_strings: tuple[str, ...]
    echo_text: str | None  # the prompt text to prepend (completions with echo), else None
    num_top_logprobs: int | None  # alternatives per token to report; None: no logprobs at all
    token_strings_as_ids: bool
    sample: int = 0  # which of the n choices of its prompt (usage counts a prompt once, at sample 0)


class ChoiceState:
    def __init__(self, spec: ChoiceSpec, codec: TextCodec) -> None:
        self.spec = spec
        self.codec = codec
        self.detokenizer = IncrementalDetokenizer(codec)
        self.matcher = StopStringMatcher(spec.stop_strings)
        self.token_ids: list[int] = []
        self.logprobs: list[LogprobEntry] = []
        self.text = ""
        self.prompt_len = len(spec.prompt_token_ids)
        self.finish_reason: str | None = None
        self.error: str | None = None  # why the engine ended the choice with FinishReason.ERROR
        self.needs_abort = False  # a stop string ended the choice while the engine request runs on
        self._text_offset = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def advance(self, update: TokenDelta) -> ChoiceDelta:
        """Take the tokens one engine step (or several, grouped) added."""
        delta = ChoiceDelta()
        if self.finished:
            return delta
        if update.is_first:
            self._start(update, delta)
        wants_logprobs = self.spec.num_top_logprobs is not None
        for position, token_id in enumerate(update.token_ids):
            self.token_ids.append(token_id)
            delta.token_ids.append(token_id)
            if wants_logprobs and position < len(update.logprobs):
                delta.logprobs.append(self._entry(update.logprobs[position]))
            released, stopped = self.matcher.feed(self.detokenizer.add(token_id))
            delta.text += released
            if stopped:
                self._finish("stop", delta)
                self.needs_abort = update.finish_reason is None
                break
        if not self.finished and update.finish_reason is FinishReason.ERROR:
            self.error = update.error or "the engine could not sample the next token"
        if not self.finished and update.finish_reason is not None:
            released, stopped = self.matcher.feed(self.detokenizer.flush())
            delta.text += released if stopped else released + self.matcher.flush()
            self._finish("stop" if stopped else _api_finish_reason(update.finish_reason), delta)
        self.text += delta.text
        self.logprobs += delta.logprobs
        return delta

    def _start(self, update: TokenDelta, delta: ChoiceDelta) -> None:
        if self.spec.echo_text is None:
            return
        delta.text += self.spec.echo_text
        if self.spec.num_top_logprobs is not None and update.prompt_logprobs is not None:
            for position, token_id in enumerate(self.spec.prompt_token_ids):
                entry = update.prompt_logprobs[position] if position < len(update.prompt_logprobs) else None
                delta.logprobs.append(self._prompt_entry(token_id, entry))

    def _finish(self, reason: str, delta: ChoiceDelta) -> None:
        self.finish_reason = reason
        delta.finish_reason = reason

    def token_string(self, token_id: int) -> str:
        if self.spec.token_strings_as_ids:
            return f"{TOKEN_ID_PREFIX}{token_id}"
        return self.codec.token_string(token_id)

    def _entry(self, logprobs: TokenLogprobs) -> LogprobEntry:
        count = self.spec.num_top_logprobs or 0
        top = tuple((t, self.token_string(t), _finite(value)) for t, value in logprobs.top[:count])
        return self._located(logprobs.token_id, _finite(logprobs.logprob), top)

    def _prompt_entry(self, token_id: int, logprobs: TokenLogprobs | None) -> LogprobEntry:
        if logprobs is None:
            return self._located(token_id, None, ())
        return self._entry(logprobs)

    def _located(self, token_id: int, logprob: float | None, top: tuple[tuple[int, str, float], ...]) -> LogprobEntry:
        token = self.token_string(token_id)
        entry = LogprobEntry(token_id, token, logprob, top, self._text_offset)
        self._text_offset += len(token)
        return entry


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def _api_finish_reason(reason: FinishReason) -> str:
    # An engine abort only happens when the client has gone, so nobody reads it; "abort" is honest.
    # ERROR: the server answers with an OpenAI error instead (Generation.updates); "error" is its metrics label.
    return {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ERROR: "error"}.get(reason, "abort")
