"""Incremental detokenization: the text of a growing token list without re-decoding it all.

Each call decodes only the tokens since the last settled point, twice (with and without the
newest tokens) from the same start, so tokenizers that clean up a leading space or merge
bytes see the same context both times; the difference is the new text. The settled point
only moves when the new text does not end in an incomplete character (U+FFFD).
"""

from dataclasses import dataclass, field

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


@dataclass
class OutputText:
    """The text a request delivers: cut before the first stop string, and held back while a
    later token could still change it (an incomplete UTF-8 sequence, a possible start of a
    stop string), so that delivered text only ever grows."""

    stop: tuple[str, ...] = ()
    decoded: IncrementalText = field(default_factory=IncrementalText)
    shown: str = ""
    stopped: bool = False

    def update(self, tokenizer: Tokenizer, token_ids: list[int], final: bool) -> None:
        """Take the output tokens so far; `final` when no token will follow. Sets `stopped`
        when a stop string matched (the request must end)."""
        text = self.decoded.update(tokenizer, token_ids)
        longest = max(map(len, self.stop), default=0)
        start = max(0, len(self.shown) - longest)
        hits = [i for s in self.stop if (i := text.find(s, start)) >= 0]
        if hits:
            self.shown, self.stopped = text[: min(hits)], True
        elif final:
            self.shown = text
        else:
            end = min(len(text.rstrip("\ufffd")), len(text) - max(0, longest - 1))
            self.shown = text[: max(len(self.shown), end)]
