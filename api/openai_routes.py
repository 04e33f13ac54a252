"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (plain and SSE), /v1/models."""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from api.errors import APIError, describe_errors, error_body
from api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    Utf8JSONRoute,
    render_chat,
)
from engine.errors import InvalidInput
from engine.loop import EngineDead, EngineLoop
from engine.outputs import RequestDelta, RequestOutput
from engine.sampling_params import SamplingParams
from server.settings import ServerSettings
from server.state import state_of

router = APIRouter(route_class=Utf8JSONRoute)

POLL_S = 1.0
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat runs to the context


class Job:
    """The engine requests behind one API call; their deltas arrive on an asyncio queue."""

    def __init__(self, engine_loop: EngineLoop, stream: bool) -> None:
        self.engine_loop = engine_loop
        self.stream = stream
        self.aloop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, RequestDelta]] = asyncio.Queue()
        self.ids: list[str] = []
        self.prompt_lens: list[int] = []
        self.outputs: dict[int, RequestOutput] = {}  # whole outputs of the finished requests
        self.done: set[int] = set()
        self.started = time.time()

    def callback(self, index: int) -> Any:
        def on_output(delta: RequestDelta) -> None:
            if not (self.stream or delta.finished or delta.error):
                return  # a whole reply needs only the last delta, which holds the whole output
            # a closed event loop raises RuntimeError: nobody is waiting any more
            with contextlib.suppress(RuntimeError):
                self.aloop.call_soon_threadsafe(self.queue.put_nowait, (index, delta))

        return on_output

    @property
    def pending(self) -> bool:
        return len(self.done) < len(self.ids)

    async def next(self) -> tuple[int, RequestDelta]:
        """The next delta; raises EngineDead if the loop dies."""
        while True:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    item = await asyncio.wait_for(self.queue.get(), POLL_S)
                except TimeoutError:
                    if not self.engine_loop.alive:
                        raise EngineDead(self.engine_loop.error or "engine loop stopped") from None
                    continue
            index, delta = item
            if delta.error:
                raise EngineDead(delta.error)
            if delta.output is not None:
                self.outputs[index] = delta.output
            if delta.finished:
                self.done.add(index)
            return index, delta

    def close(self) -> None:
        """Abort whatever has not finished (client gone or error)."""
        for index, request_id in enumerate(self.ids):
            if index not in self.done:
                self.engine_loop.abort(request_id)
                self.done.add(index)

    def usage(self) -> dict[str, int]:
        prompt = sum(self.prompt_lens)
        completion = sum(len(o.token_ids) for o in self.outputs.values())
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }


def _state(request: Request) -> tuple[EngineLoop, ServerSettings]:
    return state_of(request.app).engine_loop, state_of(request.app).settings


def _params(body: SamplingFields, max_tokens: int) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k or 0,
            seed=body.seed,
            stop=tuple(body.stop_strings),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
            priority=body.priority,
        )
    except ValidationError as exc:
        message, param = describe_errors(exc.errors())
        raise APIError(422, message, param) from None


async def _start(
    request: Request,
    body: SamplingFields,
    prompts: list[str | list[int]],
    max_tokens: int | None,
    field: str,
    tokens_field: str = "max_tokens",
) -> Job:
    """Check model, sizes and limits, then submit every prompt (all or none).

    `field` names the prompt in errors, `tokens_field` the field that gave `max_tokens`.
    """
    engine_loop, settings = _state(request)
    if body.model != settings.model_name:
        raise APIError(
            404,
            f"model {body.model!r} does not exist; this server serves {settings.model_name!r}",
            "model",
        )
    if not prompts:
        raise APIError(422, f"{field} is empty", field)
    if len(prompts) > settings.max_prompts:
        raise APIError(
            422,
            f"{len(prompts)} prompts in one request; the limit is {settings.max_prompts}",
            field,
        )
    engine = engine_loop.engine
    max_len = engine.model_config.max_model_len
    prompt_limit = min(settings.max_prompt_tokens or max_len - 1, max_len - 1)
    token_limit = settings.max_tokens_limit or max_len
    ids_list: list[list[int]] = []
    for prompt in prompts:
        try:
            ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        except ValueError as exc:
            raise APIError(422, str(exc), field) from None
        if len(ids) > prompt_limit:
            raise APIError(
                422, f"{field} has {len(ids)} tokens; the limit is {prompt_limit}", field
            )
        ids_list.append(ids)
    longest = max(len(ids) for ids in ids_list)
    if max_tokens is None:
        max_tokens = min(token_limit, max_len - longest)
    if max_tokens > token_limit:
        raise APIError(
            422, f"{tokens_field} ({max_tokens}) is over the limit of {token_limit}", tokens_field
        )
    if longest + max_tokens > max_len:
        raise APIError(
            422,
            f"{field} ({longest} tokens) + {tokens_field} ({max_tokens}) "
            f"exceeds the model's context length ({max_len})",
            tokens_field,
        )
    params = _params(body, max_tokens)
    job = Job(engine_loop, bool(body.stream))
    try:
        for index, ids in enumerate(ids_list):
            job.ids.append(
                engine_loop.submit(ids, params, job.callback(index), stream_text=job.stream)
            )
            job.prompt_lens.append(len(ids))
    except InvalidInput as exc:
        job.close()
        param = {"prompt": field, "max_tokens": tokens_field}.get(exc.param or "", exc.param)
        raise APIError(422, str(exc), param) from None
    except EngineDead as exc:
        job.close()
        raise APIError(503, str(exc)) from None
    return job


def _finish_reason(out: RequestDelta | RequestOutput) -> str | None:
    if not out.finished:
        return None
    return "length" if out.finish_reason == "length" else "stop"


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _drain(job: Job) -> None:
    while job.pending:
        await job.next()


async def _collect(job: Job, request: Request) -> None:
    """Wait for every output; a client that disconnects first aborts the job."""
    work = asyncio.create_task(_drain(job))
    gone = asyncio.create_task(_until_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            raise APIError(499, "client disconnected")
        work.result()
    except EngineDead as exc:
        raise APIError(503, str(exc)) from None
    finally:
        for task in (work, gone):
            task.cancel()
        await asyncio.gather(work, gone, return_exceptions=True)
        job.close()


async def _stream(
    job: Job, head: dict[str, Any], chat: bool, include_usage: bool
) -> AsyncIterator[str]:
    """One SSE chunk per generated token (text may be empty while it is held back)."""
    usage: dict[str, Any] = {"usage": None} if include_usage else {}
    try:
        if chat:
            role = {"role": "assistant", "content": ""}
            choice = {"index": 0, "delta": role, "logprobs": None, "finish_reason": None}
            yield _sse({**head, "choices": [choice], **usage})
        while job.pending:
            index, delta = await job.next()
            reason = _finish_reason(delta)
            if chat:
                choice = {
                    "index": index,
                    "delta": {"content": delta.text},
                    "logprobs": None,
                    "finish_reason": reason,
                }
            else:
                choice = {
                    "index": index,
                    "text": delta.text,
                    "logprobs": None,
                    "finish_reason": reason,
                }
            yield _sse({**head, "choices": [choice], **usage})
        if include_usage:
            yield _sse({**head, "choices": [], "usage": job.usage()})
    except EngineDead as exc:
        yield _sse(error_body(503, str(exc)))
    finally:
        job.close()
    yield _sse("[DONE]")


def _streaming_response(chunks: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        chunks,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Any:
    """OpenAI-compatible completion, whole or streamed (SSE)."""
    prompts = body.prompts()
    max_tokens = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    job = await _start(request, body, prompts, max_tokens, "prompt")
    head = {
        "id": job.ids[0],
        "object": "text_completion",
        "created": int(job.started),
        "model": body.model,
    }
    if body.stream:
        return _streaming_response(_stream(job, head, False, body.include_usage))
    await _collect(job, request)
    choices = [
        {"index": i, "text": out.text, "logprobs": None, "finish_reason": _finish_reason(out)}
        for i, out in sorted(job.outputs.items())
    ]
    return JSONResponse({**head, "choices": choices, "usage": job.usage()})


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    """OpenAI-compatible chat completion, whole or streamed (SSE)."""
    tokens_field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    max_tokens = getattr(body, tokens_field)
    job = await _start(
        request, body, [render_chat(body.messages)], max_tokens, "messages", tokens_field
    )
    head = {
        "id": "chat" + job.ids[0],
        "object": "chat.completion",
        "created": int(job.started),
        "model": body.model,
    }
    if body.stream:
        head["object"] = "chat.completion.chunk"
        return _streaming_response(_stream(job, head, True, body.include_usage))
    await _collect(job, request)
    out = job.outputs[0]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": out.text},
        "logprobs": None,
        "finish_reason": _finish_reason(out),
    }
    return JSONResponse({**head, "choices": [choice], "usage": job.usage()})


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """The served model."""
    engine_loop, settings = _state(request)
    return {
        "object": "list",
        "data": [
            {
                "id": settings.model_name,
                "object": "model",
                "created": int(engine_loop.started_t),
                "owned_by": "moescope",
                "max_model_len": engine_loop.engine.model_config.max_model_len,
            }
        ],
    }
