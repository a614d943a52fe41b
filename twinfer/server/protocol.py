"""The OpenAI HTTP API as pydantic models: request bodies (validated on arrival) and response shapes.

Request bodies are strict (no silent coercion of "0.5" to 0.5) and refuse unknown fields, so a
misspelt or unsupported parameter is an error that names it instead of a silently ignored one. As in
OpenAI's API, null for an optional field means the field was not given. Value ranges of sampling
(temperature >= 0, top_p in (0, 1], ...) are not repeated here: they are checked once, by
`spec.SamplingParams`, and its errors are mapped to HTTP 400 naming the field. The API's own limits
(n, logprobs, top_logprobs) are declared on the fields.

Extensions beyond OpenAI's API use vLLM's names, so a client written for one works with the other:
`top_k`, `min_p`, `ignore_eos`, `stop_token_ids`, `return_token_ids` (each choice
carries `prompt_token_ids` and `token_ids`) and `return_tokens_as_token_ids` (logprob tokens are
written "token_id:N", which no two tokens share). Prompt logprobs come the OpenAI way: `echo` with
`logprobs` on /v1/completions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TOKEN_ID_PREFIX = "token_id:"
# OpenAI's limits: choices per prompt, top logprobs per token on /v1/completions and on chat.
MAX_N = 128
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _extension(default=None):
    """A response field beyond OpenAI's: left out of the JSON unless set."""
    return Field(default=default, exclude_if=lambda value: value is None)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_means_not_given(cls, data: object) -> object:
        # OpenAI takes null for any optional parameter (some clients send every parameter, null when unset).
        # Unknown fields keep their null, so a misspelt one is still refused.
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None or key not in cls.model_fields}
        return data


class StreamOptions(_Strict):
    """include_usage: end the stream with a chunk holding the whole request's usage (and no choices); every
    other chunk then carries "usage": null. include_obfuscation: accepted only as false (twinfer sends no
    obfuscation field)."""

    include_usage: bool = False
    include_obfuscation: bool = False


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
    n: int = Field(default=1, ge=1, le=MAX_N)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False

    def field_error(self) -> tuple[str, str] | None:
        """(field, message) for fields the API refuses together, or a parameter twinfer accepts only at its
        neutral value; else None."""
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        if self.stream_options is not None and self.stream_options.include_obfuscation:
            return "stream_options", "stream_options.include_obfuscation is not supported; leave it out or false"
        if self.presence_penalty != 0.0:
            return "presence_penalty", "presence_penalty is not supported; leave it at 0"
        if self.frequency_penalty != 0.0:
            return "frequency_penalty", "frequency_penalty is not supported; leave it at 0"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        return None

    @property
    def include_usage_in_stream(self) -> bool:
        """OpenAI sends the usage chunk only when asked for it."""
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. `prompt`: text, a list of texts, token ids, or a list of token-id lists."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = None  # None: DEFAULT_COMPLETION_MAX_TOKENS
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def field_error(self) -> tuple[str, str] | None:
        if self.best_of not in (None, 1):
            return "best_of", f"best_of is not supported beyond 1, got {self.best_of}"
        if self.best_of == 1 and self.n > 1:
            return "best_of", f"best_of ({self.best_of}) must be at least n ({self.n})"
        if self.suffix:
            return "suffix", "suffix is not supported"
        return super().field_error()


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
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
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


class CompletionChunkWithUsage(CompletionResponse):
    """A chunk of a stream that asked for usage (stream_options.include_usage): "usage" is on every chunk,
    null on all but the last."""

    usage: Usage | None = None


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


class ChatCompletionChunkWithUsage(ChatCompletionChunk):
    """A chat chunk of a stream that asked for usage: "usage" on every chunk, null on all but the last."""

    usage: Usage | None = None


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
