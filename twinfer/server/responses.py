"""Choice states and deltas in the API's response shapes (whole responses and stream chunks).

Stream chunks without logprobs (nearly every event of a busy server) are written straight to JSON
text by `CompletionChunkText` and `ChatChunkText`, byte for byte what the pydantic models give
(tests/server/test_server_throughput.py checks), at a fraction of the cost of building a model per event.
`with_usage`: the stream asked for usage (stream_options.include_usage), so each chunk carries
"usage": null, as OpenAI's do, until the last one, which holds the usage.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from twinfer.server.choice import ChoiceDelta, ChoiceState, LogprobEntry
from twinfer.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionChunkWithUsage,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    CompletionChoice,
    CompletionChunkWithUsage,
    CompletionLogprobs,
    CompletionResponse,
    TokenLogprob,
    TopLogprob,
    Usage,
)


def completion_logprobs(entries: Sequence[LogprobEntry]) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=[entry.token for entry in entries],
        token_logprobs=[entry.logprob for entry in entries],
        top_logprobs=[_top_dict(entry) for entry in entries],
        text_offset=[entry.text_offset for entry in entries],
    )


def _top_dict(entry: LogprobEntry) -> dict[str, float] | None:
    """The top alternatives and, as OpenAI's legacy shape always has it, the token itself (up to logprobs + 1)."""
    if entry.logprob is None:
        return None  # the first prompt token: nothing predicts it
    top = {token: logprob for _, token, logprob in entry.top}
    top.setdefault(entry.token, entry.logprob)
    return top


def chat_logprobs(entries: Sequence[LogprobEntry]) -> ChatLogprobs:
    return ChatLogprobs(
        content=[
            TokenLogprob(
                token=entry.token,
                logprob=entry.logprob if entry.logprob is not None else 0.0,
                bytes=list(entry.token.encode()),
                top_logprobs=[
                    TopLogprob(token=token, logprob=value, bytes=list(token.encode())) for _, token, value in entry.top
                ],
            )
            for entry in entries
        ]
    )


def _wants_logprobs(choice: ChoiceState) -> bool:
    return choice.spec.num_top_logprobs is not None


def completion_response(
    response_id: str, created: int, model: str, choices: Sequence[ChoiceState], usage: Usage, with_ids: bool
) -> CompletionResponse:
    return CompletionResponse(
        id=response_id,
        created=created,
        model=model,
        choices=[
            CompletionChoice(
                index=choice.spec.index,
                text=choice.text,
                logprobs=completion_logprobs(choice.logprobs) if _wants_logprobs(choice) else None,
                finish_reason=choice.finish_reason,
                prompt_token_ids=list(choice.spec.prompt_token_ids) if with_ids else None,
                token_ids=list(choice.token_ids) if with_ids else None,
            )
            for choice in choices
        ],
        usage=usage,
    )


def completion_chunk(
    response_id: str,
    created: int,
    model: str,
    advanced: Sequence[tuple[ChoiceState, ChoiceDelta]],
    with_ids: bool,
    with_usage: bool = False,
) -> CompletionResponse:
    return (CompletionChunkWithUsage if with_usage else CompletionResponse)(
        id=response_id,
        created=created,
        model=model,
        choices=[
            CompletionChoice(
                index=choice.spec.index,
                text=delta.text,
                logprobs=completion_logprobs(delta.logprobs) if _wants_logprobs(choice) else None,
                finish_reason=delta.finish_reason,
                prompt_token_ids=list(choice.spec.prompt_token_ids) if with_ids and _is_first(choice, delta) else None,
                token_ids=list(delta.token_ids) if with_ids else None,
            )
            for choice, delta in advanced
        ],
    )


def _is_first(choice: ChoiceState, delta: ChoiceDelta) -> bool:
    return len(choice.token_ids) == len(delta.token_ids)


def chat_response(
    response_id: str, created: int, model: str, choices: Sequence[ChoiceState], usage: Usage, with_ids: bool
) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        id=response_id,
        created=created,
        model=model,
        choices=[
            ChatChoice(
                index=choice.spec.index,
                message=AssistantMessage(content=choice.text),
                logprobs=chat_logprobs(choice.logprobs) if _wants_logprobs(choice) else None,
                finish_reason=choice.finish_reason,
                prompt_token_ids=list(choice.spec.prompt_token_ids) if with_ids else None,
                token_ids=list(choice.token_ids) if with_ids else None,
            )
            for choice in choices
        ],
        usage=usage,
    )


def chat_role_chunk(
    response_id: str, created: int, model: str, choices: Sequence[ChoiceState], with_usage: bool = False
) -> ChatCompletionChunk:
    """The first chunk of a chat stream: the assistant role, as OpenAI sends it."""
    return (ChatCompletionChunkWithUsage if with_usage else ChatCompletionChunk)(
        id=response_id,
        created=created,
        model=model,
        choices=[ChatChunkChoice(index=c.spec.index, delta=ChatDelta(role="assistant", content="")) for c in choices],
    )


def chat_chunk(
    response_id: str,
    created: int,
    model: str,
    advanced: Sequence[tuple[ChoiceState, ChoiceDelta]],
    with_ids: bool,
    with_usage: bool = False,
) -> ChatCompletionChunk:
    return (ChatCompletionChunkWithUsage if with_usage else ChatCompletionChunk)(
        id=response_id,
        created=created,
        model=model,
        choices=[
            ChatChunkChoice(
                index=choice.spec.index,
                delta=ChatDelta(content=delta.text),
                logprobs=chat_logprobs(delta.logprobs) if _wants_logprobs(choice) else None,
                finish_reason=delta.finish_reason,
                token_ids=list(delta.token_ids) if with_ids else None,
            )
            for choice, delta in advanced
        ],
    )


def usage_chunk(
    response_id: str, created: int, model: str, usage: Usage, chat: bool
) -> CompletionResponse | ChatCompletionChunk:
    """The last chunk of a stream: no choices, the usage of the whole request."""
    if chat:
        return ChatCompletionChunk(id=response_id, created=created, model=model, choices=[], usage=usage)
    return CompletionResponse(id=response_id, created=created, model=model, choices=[], usage=usage)


# -- stream chunks as text ----------------------------------------------------------------------------


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # built once: json.dumps builds one a call
_FINISH_REASONS = {None: "null", "stop": '"stop"', "length": '"length"', "abort": '"abort"'}


def _json(value: object) -> str:
    """JSON as pydantic writes it: compact, non-ASCII characters as they are."""
    return _ENCODER.encode(value)


def _finish_json(reason: str | None) -> str:
    text = _FINISH_REASONS.get(reason)
    return text if text is not None else _json(reason)


def _ids(token_ids: Sequence[int]) -> str:
    return "[" + ",".join(map(str, token_ids)) + "]"


class _ChunkText:
    """A streaming chunk's JSON text without pydantic (one per event at hundreds of streams): byte for
    byte what the chunk model's model_dump_json() gives; None for a chunk with logprobs (those go
    through the models). Subclasses write one choice's fields."""

    OBJECT = ""

    def __init__(self, response_id: str, created: int, model: str, with_ids: bool, with_usage: bool = False) -> None:
        self.head = (
            f'{{"id":{_json(response_id)},"object":"{self.OBJECT}","created":{int(created)},'
            f'"model":{_json(model)},"choices":['
        )
        self.tail = '],"usage":null}' if with_usage else "]}"
        self.with_ids = with_ids

    def __call__(self, advanced: Sequence[tuple[ChoiceState, ChoiceDelta]]) -> str | None:
        parts = []
        for choice, delta in advanced:
            if _wants_logprobs(choice):
                return None
            parts.append(self._choice(choice, delta) + "}")
        return self.head + ",".join(parts) + self.tail

    def _choice(self, choice: ChoiceState, delta: ChoiceDelta) -> str:
        raise NotImplementedError


class CompletionChunkText(_ChunkText):
    """`completion_chunk(...).model_dump_json()` for chunks without logprobs; None for one with them."""

    OBJECT = "text_completion"

    def _choice(self, choice: ChoiceState, delta: ChoiceDelta) -> str:
        part = (
            f'{{"index":{choice.spec.index},"text":{_json(delta.text)},"logprobs":null,'
            f'"finish_reason":{_finish_json(delta.finish_reason)}'
        )
        if self.with_ids:
            if _is_first(choice, delta):
                part += f',"prompt_token_ids":{_ids(choice.spec.prompt_token_ids)}'
            part += f',"token_ids":{_ids(delta.token_ids)}'
        return part


class ChatChunkText(_ChunkText):
    """`chat_chunk(...).model_dump_json()` for chunks without logprobs; None for one with them."""

    OBJECT = "chat.completion.chunk"

    def _choice(self, choice: ChoiceState, delta: ChoiceDelta) -> str:
        part = (
            f'{{"index":{choice.spec.index},"delta":{{"content":{_json(delta.text)}}},"logprobs":null,'
            f'"finish_reason":{_finish_json(delta.finish_reason)}'
        )
        if self.with_ids:
            part += f',"token_ids":{_ids(delta.token_ids)}'
        return part
