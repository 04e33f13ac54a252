"""OpenAI-compatible request bodies (strict: wrong types and unknown fields are a 422)."""

import json
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.sampling_params import SEED_MAX, SEED_MIN

StopList = Annotated[list[str], Field(max_length=8)]


class Utf8Request(Request):
    """A request whose JSON body must be UTF-8 (RFC 8259), never UTF-16/32 guessed from BOMs."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads((await self.body()).decode("utf-8"))
        return self._json


class Utf8JSONRoute(APIRoute):
    """A route that parses its body with `Utf8Request`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(Utf8Request(request.scope, request.receive))

        return route


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions.

    Accepted and ignored: `user`, `metadata`, `store`, `service_tier`. Penalties and
    `logit_bias` are accepted only at their neutral values. vLLM-style extensions:
    `top_k`, `ignore_eos`, `stop_token_ids`, `priority`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | StopList | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    top_k: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    priority: int = 0

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only n = 1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v == "" or (isinstance(v, list) and "" in v):
            raise ValueError("must be non-empty strings")
        return v

    @field_validator("seed")
    @classmethod
    def _seed_in_range(cls, v: int | None) -> int | None:
        if v is not None and not SEED_MIN <= v <= SEED_MAX:
            raise ValueError("must lie in [-2**63, 2**64 - 1] (the generator's seed range)")
        return v

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, v: float | None) -> float | None:
        if v not in (None, 0.0):
            raise ValueError("penalties are not supported (only 0)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    """POST /v1/completions; `prompt` is text, token ids, or a list of either (one choice each)."""

    prompt: str | TokenIds | list[str] | list[TokenIds]
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = None

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only best_of = 1 is supported")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: int | None) -> int | None:
        if v is not None:
            raise ValueError("logprobs are not supported by the server yet")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list (a single prompt becomes a list of one)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions (text only: no tools, no response formats, no logprobs)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("logprobs are not supported by the server yet")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None) -> int | None:
        if v:
            raise ValueError("logprobs are not supported by the server yet")
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if v:
            raise ValueError("tools are not supported")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if v not in (None, "none"):
            raise ValueError("tools are not supported (tool_choice must be 'none')")
        return v

    @field_validator("response_format")
    @classmethod
    def _format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v != {"type": "text"}:
            raise ValueError("only response_format {'type': 'text'} is supported")
        return v


def render_chat(messages: list[ChatMessage]) -> str:
    """The chat template used for every tokenizer.

    Each message becomes `<|role|>\\n{content}\\n` (`developer` counts as `system`) and the
    prompt ends with `<|assistant|>\\n`, so the model writes the assistant's turn.
    """
    parts = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        parts.append(f"<|{role}|>\n{m.text}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)
