"""Choice states and deltas in the API's response shapes (whole responses and stream chunks)."""

from __future__ import annotations

from collections.abc import Sequence

from twinfer.server.choice import ChoiceDelta, ChoiceState, LogprobEntry
from twinfer.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    CompletionChoice,
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
    if entry.logprob is None:
        return None  # the first prompt token: nothing predicts it
    return {token: logprob for _, token, logprob in entry.top}


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
    response_id: str, created: int, model: str, advanced: Sequence[tuple[ChoiceState, ChoiceDelta]], with_ids: bool
) -> CompletionResponse:
    return CompletionResponse(
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


def chat_role_chunk(response_id: str, created: int, model: str, choices: Sequence[ChoiceState]) -> ChatCompletionChunk:
    """The first chunk of a chat stream: the assistant role, as OpenAI sends it."""
    return ChatCompletionChunk(
        id=response_id,
        created=created,
        model=model,
        choices=[ChatChunkChoice(index=c.spec.index, delta=ChatDelta(role="assistant", content="")) for c in choices],
    )


def chat_chunk(
    response_id: str, created: int, model: str, advanced: Sequence[tuple[ChoiceState, ChoiceDelta]], with_ids: bool
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
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
