"""Incremental detokenization gives, after every token, exactly the full decode."""

import random

import pytest
from hf_checkpoints import build_tokenizer

from engine.detokenizer import IncrementalText
from engine.model.tokenizer import ByteTokenizer, FileTokenizer, Tokenizer


def _check(tokenizer: Tokenizer, ids: list[int]) -> None:
    text = IncrementalText()
    for n in range(1, len(ids) + 1):
        assert text.update(tokenizer, ids[:n]) == tokenizer.decode(ids[:n]), ids[:n]


@pytest.mark.parametrize("seed", range(20))
def test_bytes_with_split_and_invalid_utf8(seed: int) -> None:
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < 60:
        kind = rng.random()
        if kind < 0.4:
            ids += list(rng.choice(["é", "ü", "€", "漢字", "🙂", "a b"]).encode())
        elif kind < 0.8:
            ids.append(rng.randrange(32, 127))
        else:
            ids.append(rng.randrange(0, 320))  # stray continuation bytes, BOS/EOS, extras
    _check(ByteTokenizer(), ids)


@pytest.mark.parametrize("seed", range(5))
def test_tokenizer_json_with_special_tokens(tmp_path, seed: int) -> None:
    path = tmp_path / "tokenizer.json"
    build_tokenizer().save(str(path))
    tokenizer = FileTokenizer(path)
    rng = random.Random(seed)
    _check(tokenizer, [rng.randrange(0, 40) for _ in range(50)])


class CountingTokenizer(ByteTokenizer):
    """Records how many tokens each decode call was given."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def decode(self, token_ids: list[int]) -> str:
        self.lengths.append(len(token_ids))
        return super().decode(token_ids)


def test_each_update_decodes_only_a_short_tail() -> None:
    ids = list(("naïve café → 漢字 🙂 " * 20).encode())
    tokenizer = CountingTokenizer()
    text = IncrementalText()
    for n in range(1, len(ids) + 1):
        out = text.update(tokenizer, ids[:n])
    assert out == ByteTokenizer().decode(ids)
    assert len(tokenizer.lengths) == 2 * len(ids)  # two short decodes per token, no fallback
    assert max(tokenizer.lengths) <= 8
