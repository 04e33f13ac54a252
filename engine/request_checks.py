"""What a request must pass before it queues: a prompt of token ids inside the vocabulary that
leaves room to generate, and a length that fits the usable KV blocks. Each failure is an
InvalidInput naming the field."""

import numbers

from engine.config import ModelConfig
from engine.errors import InvalidInput
from engine.kv_cache import BlockManager
from engine.model.tokenizer import Tokenizer


def prompt_token_ids(prompt: str | list[int], tokenizer: Tokenizer, cfg: ModelConfig) -> list[int]:
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise InvalidInput("prompt is empty", "prompt")
    odd = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
    if odd:
        raise InvalidInput(f"prompt token id {odd[0]!r} is not an integer", "prompt")
    ids = [int(t) for t in ids]
    bad = [t for t in ids if not 0 <= t < cfg.vocab_size]
    if bad:
        raise InvalidInput(
            f"prompt token id {bad[0]} is outside the vocabulary (0..{cfg.vocab_size - 1})",
            "prompt",
        )
    if len(ids) >= cfg.max_model_len:
        raise InvalidInput(
            f"prompt has {len(ids)} tokens; the model's context (max_model_len) is "
            f"{cfg.max_model_len}, leaving no room to generate",
            "prompt",
        )
    return ids


def check_fits(
    blocks: BlockManager, usable: int, max_model_len: int, prompt_len: int, max_tokens: int
) -> None:
    """The request must fit the KV blocks usable once every accepted knob change applied."""
    need = blocks.blocks_for(min(prompt_len + max_tokens, max_model_len))
    if need > usable:
        raise InvalidInput(
            f"prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) needs {need} "
            f"KV blocks but the cache has {usable} usable blocks",
            "max_tokens",
        )
