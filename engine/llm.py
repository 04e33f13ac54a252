"""The offline API: `LLM(model=...).generate(prompts, params)`."""

import time
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from engine.engine import LLMEngine
from engine.model.tokenizer import Tokenizer
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str = "synthetic:tiny", **engine_args: Any) -> None:
        self.engine = LLMEngine(model=model, **engine_args)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def close(self) -> None:
        """Stop the other expert-parallel ranks, if this LLM started any."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Sequence[str | list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order."""
        params = sampling_params or SamplingParams()
        if isinstance(params, list) and len(params) != len(prompts):
            raise ValueError(
                f"got {len(params)} SamplingParams for {len(prompts)} prompts; pass one or one each"
            )
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        for p in per_prompt:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
        now = time.time()
        reqs = [
            self.engine.make_request(p, sp, arrival=now)
            for p, sp in zip(prompts, per_prompt, strict=True)
        ]
        for req in reqs:
            self.engine.add(req)
        ids = [req.request_id for req in reqs]
        done: dict[str, RequestOutput] = {}
        generated = 0
        with tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                result = self.engine.step()
                generated += len(result.deltas)
                for out in result.outputs:
                    done[out.request_id] = out
                    bar.update(1)
                bar.set_postfix(tok_s=f"{generated / max(time.time() - now, 1e-9):.0f}")
        return [done[i] for i in ids]
