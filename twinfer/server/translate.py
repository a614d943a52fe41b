"""API request bodies to what the engine takes: token-id prompts, `SamplingParams`, choice specs.

Every refusal is an `ApiError` naming the request field at fault. Value ranges are checked by
`SamplingParams` itself (one definition), and its messages, which start with the parameter's
name, are mapped back to the API's field names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from spec.engine_config import EngineConfig
from spec.errors import SamplingParamsError
from spec.sampling_params import SamplingParams
from twinfer.server.detokenize import TextCodec
from twinfer.server.errors import ApiError
from twinfer.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields

# SamplingParams' parameter names -> the API field that sets them.
_COMPLETION_FIELDS = {"stop_token_ids entry": "stop_token_ids", "prompt_logprobs": "logprobs"}
_CHAT_FIELDS = {**_COMPLETION_FIELDS, "logprobs": "top_logprobs"}


@dataclass(frozen=True)
class Prompt:
    token_ids: tuple[int, ...]
    text: str | None  # what echo shows


@dataclass(frozen=True)
class StopConditions:
    strings: tuple[str, ...]
    token_ids: tuple[int, ...]


def check_common(body: _SamplingFields, served_model: str) -> None:
    if body.model is not None and body.model != served_model:
        raise ApiError(
            f"model {body.model!r} is not served here; this server serves {served_model!r}",
            param="model",
            status=404,
            code="model_not_found",
        )
    unsupported = body.unsupported_field()
    if unsupported is not None:
        field, message = unsupported
        raise ApiError(message, param=field)


def stop_conditions(body: _SamplingFields) -> StopConditions:
    """`stop` holds strings (and, as an extension, token ids); `stop_token_ids` holds token ids."""
    entries: list[str | int] = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    strings = tuple(entry for entry in entries if isinstance(entry, str))
    if any(not text for text in strings):
        raise ApiError("stop strings must not be empty", param="stop")
    ids = [entry for entry in entries if isinstance(entry, int)] + list(body.stop_token_ids or [])
    return StopConditions(strings, tuple(ids))


def completion_prompts(body: CompletionRequest, codec: TextCodec) -> list[Prompt]:
    raw = body.prompt
    if isinstance(raw, str):
        items: list[str | list[int]] = [raw]
    elif raw and isinstance(raw[0], (str, list)):
        items = list(raw)  # type: ignore[arg-type]
    else:
        items = [list(raw)]  # type: ignore[arg-type]
    if not items:
        raise ApiError("prompt must not be an empty list", param="prompt")
    return [_prompt(item, codec) for item in items]


def _prompt(item: str | Sequence[int], codec: TextCodec) -> Prompt:
    if isinstance(item, str):
        if not codec.has_text:
            raise ApiError("this model has no tokenizer: send the prompt as token ids", param="prompt")
        return Prompt(tuple(codec.encode(item)), item)
    return Prompt(tuple(item), codec.decode(item) if codec.has_text else "")


def chat_prompt(body: ChatCompletionRequest, tokenizer) -> Prompt:  # tokenizer: transformers tokenizer or None
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ApiError(
            "this model's tokenizer has no chat template, so /v1/chat/completions cannot build a prompt; "
            "use /v1/completions",
            param="messages",
        )
    messages = [_message_dict(message) for message in body.messages]
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=body.add_generation_prompt,
            **(body.chat_template_kwargs or {}),
        )
    except Exception as error:  # jinja2 errors, or a template raising on bad roles: the client's messages
        raise ApiError(f"the chat template could not render these messages: {error}", param="messages") from error
    return Prompt(tuple(tokenizer.encode(text, add_special_tokens=False)), text)


def _message_dict(message) -> dict[str, object]:
    record = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        record["content"] = "".join(part.text for part in message.content)
    return record


def completion_params(body: CompletionRequest, stops: StopConditions) -> SamplingParams:
    prompt_logprobs = body.logprobs if body.echo and body.logprobs is not None else None
    max_tokens = 16 if body.max_tokens is None else body.max_tokens
    return _sampling_params(
        body, stops, max_tokens, _engine_logprobs(body.logprobs), prompt_logprobs, _COMPLETION_FIELDS
    )


def chat_params(
    body: ChatCompletionRequest, stops: StopConditions, prompt_len: int, config: EngineConfig
) -> SamplingParams:
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError("top_logprobs needs logprobs set to true", param="top_logprobs")
    logprobs = _engine_logprobs(body.top_logprobs or 0) if body.logprobs else 0
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if max_tokens is None:
        max_tokens = default_chat_max_tokens(prompt_len, config)
    return _sampling_params(body, stops, max_tokens, logprobs, None, _CHAT_FIELDS)


def _engine_logprobs(requested: int | None) -> int:
    """The API's logprobs=0 means "the chosen token's logprob only"; the engine returns logprobs only
    for logprobs >= 1 (the chosen token's and that many alternatives), so ask for one and drop it.
    Negative values go through for SamplingParams to refuse."""
    if requested is None:
        return 0
    return 1 if requested == 0 else requested


def default_chat_max_tokens(prompt_len: int, config: EngineConfig) -> int:
    """As many tokens as fit: up to max_model_len, and no more than the whole KV pool can hold."""
    pool_tokens = config.num_blocks * config.block_size
    return max(1, min(config.model_len - prompt_len, pool_tokens + 1 - prompt_len))


def _sampling_params(
    body: _SamplingFields,
    stops: StopConditions,
    max_tokens: int,
    logprobs: int,
    prompt_logprobs: int | None,
    field_names: dict[str, str],
) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=body.temperature,
            top_k=body.top_k,
            top_p=body.top_p,
            min_p=body.min_p,
            max_tokens=max_tokens,
            ignore_eos=body.ignore_eos,
            stop_token_ids=stops.token_ids,
            seed=body.seed,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
    except SamplingParamsError as error:
        raise ApiError(str(error), param=_field_of(str(error), field_names)) from error


def _field_of(message: str, field_names: dict[str, str]) -> str | None:
    for internal, api in field_names.items():
        if message.startswith(internal + " "):
            return api
    match = re.match(r"[a-z_]+", message)
    return match.group(0) if match else None
