"""Incremental detokenization: the text of a growing token list without re-decoding it all.

Each call decodes only the tokens since the last settled point, twice (with and without the
newest tokens) from the same start, so tokenizers that clean up a leading space or merge
bytes see the same context both times; the difference is the new text. The settled point
only moves when the new text does not end in an incomplete character (U+FFFD).
"""

from dataclasses import dataclass

from engine.model.tokenizer import Tokenizer


@dataclass
class IncrementalText:
    settled: str = ""
    prefix: int = 0  # first token of the tail decoded on each call
    read: int = 0  # tokens covered by `settled`

    def update(self, tokenizer: Tokenizer, token_ids: list[int]) -> str:
        """The text of `token_ids`, which must extend the list of the previous call."""
        before = tokenizer.decode(token_ids[self.prefix : self.read])
        after = tokenizer.decode(token_ids[self.prefix :])
        if not after.startswith(before):  # not prefix-stable here: decode it all
            return tokenizer.decode(token_ids)
        new = after[len(before) :]
        if new and not new.endswith("\ufffd"):
            self.settled += new
            self.prefix, self.read = self.read, len(token_ids)
            return self.settled
        return self.settled + new
