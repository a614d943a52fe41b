"""Token ids to text, one token at a time, and stop strings found in that text.

Decoding each token alone is wrong for byte-level tokenizers (a character may span tokens) and
decoding the whole output after every token costs quadratic time. `IncrementalDetokenizer` decodes
a short sliding window instead: the text a new token adds is decode(window + token) minus
decode(window), held back while it ends in an incomplete UTF-8 character. Its output
concatenates to exactly `decode(all tokens)`, the text `LLM.generate` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

from twinfer.server.protocol import TOKEN_ID_PREFIX

_INCOMPLETE = "\ufffd"  # what a decoder writes for a byte sequence cut mid-character


class TextCodec(Protocol):
    """What the server needs from a tokenizer."""

    has_text: bool

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def token_string(self, token_id: int) -> str: ...


class TokenizerCodec:
    """A transformers tokenizer: no special tokens added to prompts (as `LLM` does), none in output text."""

    has_text = True

    def __init__(self, tokenizer) -> None:  # tokenizer: transformers.PreTrainedTokenizerBase
        self.tokenizer = tokenizer
        self.token_string = lru_cache(maxsize=None)(self._token_string)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def _token_string(self, token_id: int) -> str:
        # Special tokens are shown (a logprob entry for end-of-text must say so), unlike in text.
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


class IdOnlyCodec:
    """For checkpoints without a tokenizer: token-id prompts only; text is empty, tokens are 'token_id:N'."""

    has_text = False

    def encode(self, text: str) -> list[int]:
        raise ValueError("this model has no tokenizer: send the prompt as token ids")

    def decode(self, token_ids: Sequence[int]) -> str:
        return ""

    def token_string(self, token_id: int) -> str:
        return f"{TOKEN_ID_PREFIX}{token_id}"


class IncrementalDetokenizer:
    """Feed output tokens one by one; each call returns the text that token completes ('' if none yet)."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.token_ids: list[int] = []
        self._window_start = 0  # first token of the decoding window
        self._emitted_until = 0  # tokens before this index have had their text returned

    def add(self, token_id: int) -> str:
        self.token_ids.append(token_id)
        if not self.codec.has_text:
            return ""
        window = self.token_ids[self._window_start :]
        known = self.codec.decode(self.token_ids[self._window_start : self._emitted_until])
        full = self.codec.decode(window)
        if full.endswith(_INCOMPLETE) or len(full) <= len(known):
            return ""  # wait for the rest of the character (or a token with no text, e.g. special)
        self._window_start = self._emitted_until
        self._emitted_until = len(self.token_ids)
        return full[len(known) :]

    def flush(self) -> str:
        """Text still held back at the end (an incomplete character, decoded as the tokenizer does)."""
        if not self.codec.has_text or self._emitted_until == len(self.token_ids):
            return ""
        known = self.codec.decode(self.token_ids[self._window_start : self._emitted_until])
        full = self.codec.decode(self.token_ids[self._window_start :])
        self._emitted_until = len(self.token_ids)
        return full[len(known) :]


class StopStringMatcher:
    """Finds the first stop string in streamed text, holding back text that might begin one.

    An occurrence is always found in the held-back text plus the new text: everything released
    earlier ended at least (longest stop - 1) characters before the text seen so far.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self._hold = max((len(stop) for stop in self.stops), default=1) - 1
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to release, whether a stop string ended the output there)."""
        combined = self._pending + text
        hits = [index for index in (combined.find(stop) for stop in self.stops) if index >= 0]
        if hits:
            self._pending = ""
            return combined[: min(hits)], True
        if self._hold == 0:
            self._pending = ""
            return combined, False
        split = max(len(combined) - self._hold, 0)
        self._pending = combined[split:]
        return combined[:split], False

    def flush(self) -> str:
        """The held-back text, once the output has ended without a stop string."""
        text, self._pending = self._pending, ""
        return text
