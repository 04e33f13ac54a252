"""The demo model's corpus: the standard library's own source, split by file into a training
part and a held-out part, and seeded snippets of the held-out part for real prompts.

Standard library and `tokenizers` only: the load generator imports it, and must start fast.
"""

import hashlib
import random
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer

DEMO_DIR = Path(__file__).parent / "demo"
# Folders of the standard library that are not the library itself: test suites and
# installed third-party packages.
SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
HELD_OUT_PER_MILLE = 50  # files whose path hashes below this are held out (5%)
# a window of the file wide enough for any snippet: the demo tokenizer averages about 3.5
# characters a token on this code, rarely more than 8 over a stretch of lines
CHARS_PER_TOKEN_BOUND = 8
TRIES = 8  # places tried for a snippet before the longest one found is taken


def library_files() -> tuple[Path, list[Path]]:
    """The standard library's directory and its *.py files (sorted by relative path)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not SKIP_PARTS & set(p.relative_to(root).parts)]
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_held_out(relative: str) -> bool:
    """A stable split by file: the same path falls on the same side in every run."""
    digest = hashlib.sha256(relative.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < HELD_OUT_PER_MILLE


def read_texts(root: Path, files: list[Path]) -> dict[str, str]:
    """Relative path -> source text; undecodable files are skipped (a few are Latin-1)."""
    texts = {}
    for path in files:
        try:
            texts[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def file_list_hash(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def held_out_texts() -> dict[str, str]:
    """Relative path -> text of the held-out files: text the demo model never trained on."""
    root, files = library_files()
    return read_texts(root, [p for p in files if is_held_out(p.relative_to(root).as_posix())])


class HeldOutSnippets:
    """Snippets of the held-out files, each a run of whole lines from a line's start, cut to
    a length in the demo tokenizer's tokens (exact for the demo model, whose server adds BOS
    as the first token; a guide for other tokenizers)."""

    def __init__(self, tokenizer: Path = DEMO_DIR / "tokenizer.json") -> None:
        texts = held_out_texts()
        if not texts:
            raise ValueError("no held-out standard library files on this Python")
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.texts = [texts[name] for name in sorted(texts)]
        # per file, where its non-blank lines start
        self.starts = [_line_starts(text) for text in self.texts]

    def snippet(self, num_tokens: int, rng: random.Random) -> str:
        """`num_tokens` tokens (BOS included) of held-out source, chosen by `rng`; fewer only
        where no place tried has that much left before its file ends."""
        want, best = max(1, num_tokens - 1), ""
        for _ in range(TRIES):
            i = rng.randrange(len(self.texts))
            text, starts = self.texts[i], self.starts[i]
            start = starts[rng.randrange(len(starts))]
            window = text[start : start + want * CHARS_PER_TOKEN_BOUND]
            offsets = self.tokenizer.encode(window, add_special_tokens=False).offsets
            cut = window[: offsets[min(want, len(offsets)) - 1][1]] if offsets else window
            if len(offsets) >= want:
                return cut
            best = max(best, cut, key=len)
        return best


def _line_starts(text: str) -> list[int]:
    """Offsets of the non-blank lines' starts (0 for a text without any)."""
    starts, pos = [], 0
    for line in text.splitlines(keepends=True):
        if line.strip():
            starts.append(pos)
        pos += len(line)
    return starts or [0]
