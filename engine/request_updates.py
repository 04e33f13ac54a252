"""A step's sampled tokens taken into its requests: tokens appended, full blocks registered for
prefix caching, text detokenized, finish reasons decided; a `RequestDelta` per sampling
request and the whole `RequestOutput` of each that finished."""

import time
from collections.abc import Callable

from engine.config import ModelConfig
from engine.launched import Launched
from engine.model.tokenizer import Tokenizer
from engine.outputs import RequestDelta, RequestOutput
from engine.request import Request, Status
from engine.scheduler import Scheduler
from engine.step_records import Executed


def update_requests(
    launched: Launched,
    executed: Executed,
    scheduler: Scheduler,
    tokenizer: Tokenizer,
    model_config: ModelConfig,
    end: Callable[[Request, str], None],
) -> tuple[list[RequestDelta], list[Request]]:
    """Append each request's sampled token, register the blocks that are now full, and
    end the requests that finished (`end`). A request that ended (or was aborted) after the
    step was launched wasted its row: its token is dropped."""
    sampled = executed.sampled
    for chunk in launched.sched.chunks:
        if not chunk.sample:
            scheduler.register(chunk.req)
    now = time.time()
    deltas, finished = [], []
    for req, token, lp in zip(launched.sampling, sampled.token_ids, sampled.logprobs, strict=True):
        if req.status is Status.FINISHED:
            continue
        req.num_in_flight -= 1
        req.append_token(token, now)
        scheduler.register(req)
        if lp is not None:
            req.logprobs.append(lp)
        reason = finish_reason(req, token, model_config)
        text = new_text(req, tokenizer, final=reason is not None)
        if req.text.stopped:
            reason = "stop"
        delta = RequestDelta(
            req.request_id, [token], [now - req.arrival], text, reason is not None, reason
        )
        if lp is not None:
            delta.logprobs = [lp]
        if reason:
            end(req, reason)
            finished.append(req)
            delta.output = request_output(req)
        deltas.append(delta)
    return deltas, finished


def new_text(req: Request, tokenizer: Tokenizer, final: bool) -> str:
    """The text this step delivers: what settled since the last step when the request's
    text is decoded every step; otherwise all of it, decoded once, at the end."""
    if req.text_each_step:
        before = len(req.text.shown)
        req.text.update(tokenizer, req.output_token_ids, final)
        return req.text.shown[before:]
    if final:
        req.text.update(tokenizer, req.output_token_ids, final)
        return req.text.shown
    return ""


def finish_reason(req: Request, token: int, model_config: ModelConfig) -> str | None:
    p = req.params
    if token in p.stop_token_ids or (not p.ignore_eos and token in model_config.eos_token_ids):
        return "stop"
    if len(req.output_token_ids) >= p.max_tokens:
        return "length"
    if len(req.all_token_ids) >= model_config.max_model_len:
        return "length"
    return None


def request_output(req: Request) -> RequestOutput:
    return RequestOutput(
        request_id=req.request_id,
        prompt_token_ids=req.prompt_token_ids,
        token_ids=list(req.output_token_ids),
        text=req.text.shown,
        finished=req.status is Status.FINISHED,
        finish_reason=req.finish_reason,
        ttft_s=req.ttft_s,
        token_times_s=[t - req.arrival for t in req.token_times],
        logprobs=list(req.logprobs) if req.params.logprobs is not None else None,
        num_preemptions=req.num_preemptions,
    )
