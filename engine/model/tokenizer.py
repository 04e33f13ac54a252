"""Tokenizers: a byte-level one for synthetic models and tokenizer.json through `tokenizers`."""

from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer as HFTokenizer


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are tokens 0-255; 256 is BOS and 257 is EOS."""

    bos_token_id = 256
    eos_token_id = 257
    vocab_size = 320

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *text.encode("utf-8")]

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


class FileTokenizer:
    """A Hugging Face tokenizer.json."""

    def __init__(self, path: Path) -> None:
        try:
            self.tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise ValueError(f"cannot read {path}: {e}") from e

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tok.decode(token_ids, skip_special_tokens=True)


class NoTokenizer:
    """Stands in for a checkpoint without tokenizer.json: token-id prompts only."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def encode(self, text: str) -> list[int]:
        raise ValueError(f"{self.path} has no tokenizer.json: pass prompts as token ids")

    def decode(self, token_ids: list[int]) -> str:
        return ""
