"""The OpenAI HTTP API as pydantic models: request bodies (validated on arrival) and response shapes.

Request bodies are strict (no silent coercion of "0.5" to 0.5) and refuse unknown fields, so a
misspelt or unsupported parameter is an error that names it instead of a silently ignored one.
Value ranges (temperature >= 0, top_p in (0, 1], ...) are not repeated here: they are checked once,
by `spec.SamplingParams`, and its errors are mapped to HTTP 400 naming the field.

Extensions beyond OpenAI's API use vLLM's names, so a client written for one works with the other:
`top_k`, `min_p`, `ignore_eos`, `stop_token_ids`, `return_token_ids` (each choice
carries `prompt_token_ids` and `token_ids`) and `return_tokens_as_token_ids` (logprob tokens are
written "token_id:N", which no two tokens share). Prompt logprobs come the OpenAI way: `echo` with
`logprobs` on /v1/completions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TOKEN_ID_PREFIX = "token_id:"


def _extension(default=None):
    """A response field beyond OpenAI's: left out of the JSON unless set."""
    return Field(default=default, exclude_if=lambda value: value is None)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = True


class _SamplingFields(_Strict):
    """Fields both endpoints share."""

    model: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str | int] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False

    def unsupported_field(self) -> tuple[str, str] | None:
        """(field, message) for a parameter twinfer accepts only at its neutral value, else None."""
        if self.n != 1:
            return "n", f"n must be 1 (twinfer returns one choice per prompt), got {self.n}"
        if self.presence_penalty != 0.0:
            return "presence_penalty", "presence_penalty is not supported; leave it at 0"
        if self.frequency_penalty != 0.0:
            return "frequency_penalty", "frequency_penalty is not supported; leave it at 0"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        return None

    @property
    def include_usage_in_stream(self) -> bool:
        return self.stream_options is None or self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. `prompt`: text, a list of texts, token ids, or a list of token-id lists."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported_field(self) -> tuple[str, str] | None:
        if self.best_of not in (None, 1):
            return "best_of", f"best_of must be 1, got {self.best_of}"
        if self.suffix:
            return "suffix", "suffix is not supported"
        return super().unsupported_field()


class TextContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Messages may carry fields templates use (name, tool_calls, ...): keep them, types unchecked.
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[TextContentPart] | None = None


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions; the prompt is the checkpoint's chat template applied to `messages`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, object] | None = None


# -- responses -------------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """The legacy completions logprobs shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = _extension()
    token_ids: list[int] | None = _extension()


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = _extension()


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] = Field(default_factory=list)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = _extension()
    token_ids: list[int] | None = _extension()


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = _extension()
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _extension()


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = _extension()


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "twinfer"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
