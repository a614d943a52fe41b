"""API request bodies to what the engine takes: token-id prompts, `SamplingParams`, choice specs.

Every refusal is an `ApiError` naming the request field at fault. Value ranges are checked by
`SamplingParams` itself (one definition), and its messages, which start with the parameter's
name, are mapped back to the API's field names.

`n` choices of a prompt are n engine requests; with a `seed`, choice j samples with seed + j (as vLLM
does), so the choices differ from each other and the whole response is reproducible.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from spec.engine_config import EngineConfig
from spec.errors import SamplingParamsError
from spec.sampling_params import MAX_SEED, SamplingParams
from twinfer.server.choice import ChoiceSpec
from twinfer.server.detokenize import TextCodec
from twinfer.server.errors import ApiError
from twinfer.server.protocol import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    _SamplingFields,
)

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
    refused = body.field_error()
    if refused is not None:
        field, message = refused
        raise ApiError(message, param=field)


def completion_specs(
    body: CompletionRequest, codec: TextCodec, response_id: str, config: EngineConfig, token_limit: int
) -> list[ChoiceSpec]:
    stops = stop_conditions(body)
    max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    params = completion_params(body, stops, max_tokens)
    prompts = completion_prompts(body, codec)
    given = "max_tokens" if body.max_tokens is not None else f"max_tokens (not given: {DEFAULT_COMPLETION_MAX_TOKENS})"
    check_output_budget(body.n, max_tokens, given, prompts, config.model_len, token_limit)
    return _choice_specs(response_id, prompts, body, params, stops, body.echo, body.logprobs)


def chat_specs(
    body: ChatCompletionRequest, tokenizer, response_id: str, config: EngineConfig, token_limit: int
) -> list[ChoiceSpec]:  # tokenizer: transformers tokenizer or None
    stops = stop_conditions(body)
    prompt = chat_prompt(body, tokenizer)
    asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    max_tokens = asked if asked is not None else default_chat_max_tokens(len(prompt.token_ids), config)
    params = chat_params(body, stops, max_tokens)
    given = "max_tokens" if asked is not None else "max_tokens (not given: the rest of the context)"
    check_output_budget(body.n, max_tokens, given, [prompt], config.model_len, token_limit)
    num_top_logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return _choice_specs(response_id, [prompt], body, params, stops, False, num_top_logprobs)


def _choice_specs(
    response_id: str,
    prompts: Sequence[Prompt],
    body: _SamplingFields,
    params: SamplingParams,
    stops: StopConditions,
    echo: bool,
    num_top_logprobs: int | None,
) -> list[ChoiceSpec]:
    """`body.n` choices per prompt, numbered prompt by prompt (prompt p's choice j is p * n + j), as OpenAI does."""
    n = body.n
    return [
        ChoiceSpec(
            index=position * n + sample,
            request_id=f"{response_id}-{position * n + sample}",
            prompt_token_ids=prompt.token_ids,
            params=sample_params(params, sample),
            stop_strings=stops.strings,
            echo_text=(prompt.text or "") if echo else None,
            num_top_logprobs=num_top_logprobs,
            token_strings_as_ids=body.return_tokens_as_token_ids,
            sample=sample,
        )
        for position, prompt in enumerate(prompts)
        for sample in range(n)
    ]


def check_output_budget(
    n: int, max_tokens: int, given: str, prompts: Sequence[Prompt], model_len: int, token_limit: int
) -> None:
    """Refuse a request whose choices of one prompt could together make more than `token_limit` tokens: n x
    max_tokens, where a choice makes no more than its context leaves (the engine stops it at max_model_len)."""
    room = max((min(max_tokens, model_len - len(prompt.token_ids)) for prompt in prompts), default=0)
    if n * room > token_limit:
        raise ApiError(
            f"n x max_tokens = {n} x {room} = {n * room} output tokens for one prompt, more than this server's "
            f"limit of {token_limit} (twinfer serve --max-request-tokens); lower n or {given}",
            param="n",
        )


def sample_params(params: SamplingParams, sample: int) -> SamplingParams:
    """The params of choice `sample` of a prompt: the request's, with seed + sample when seeded."""
    if params.seed is None or sample == 0:
        return params
    return dataclasses.replace(params, seed=(params.seed + sample) % (MAX_SEED + 1))


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


def completion_params(body: CompletionRequest, stops: StopConditions, max_tokens: int) -> SamplingParams:
    prompt_logprobs = body.logprobs if body.echo and body.logprobs is not None else None
    return _sampling_params(
        body, stops, max_tokens, _engine_logprobs(body.logprobs), prompt_logprobs, _COMPLETION_FIELDS
    )


def chat_params(body: ChatCompletionRequest, stops: StopConditions, max_tokens: int) -> SamplingParams:
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError("top_logprobs needs logprobs set to true", param="top_logprobs")
    logprobs = _engine_logprobs(body.top_logprobs or 0) if body.logprobs else 0
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
