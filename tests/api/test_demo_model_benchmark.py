"""benchmarks/control/demo_model.py: token classes by Python's tokenizer, the experts'
preferences, and a quick run end to end (served phases, rebalance, capacity factors)."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.control import demo_model as bench
from benchmarks.harness.results_md import markers

SOURCE = 'def f(x):\n    # add one\n    return x + 10  # "no"\ns = "text"\n'


def test_each_character_and_token_gets_its_python_class() -> None:
    chars = bench.char_classes(SOURCE)
    at = {word: chars[SOURCE.index(word)] for word in ("def", "f(", "# add", "return", "10")}
    assert at == {
        "def": "keywords",
        "f(": "identifiers",
        "# add": "comments",
        "return": "keywords",
        "10": "digits",
    }
    assert chars[SOURCE.index('"text"')] == "string literals"
    assert chars[SOURCE.index("    return")] == "indentation"
    assert chars[SOURCE.index("+")] == bench.OTHER
    start = SOURCE.index("\n    return")  # a token of the newline and the indentation after it
    assert bench.token_class(SOURCE, chars, start, start + 5) == "indentation"
    space = SOURCE.index(" return")  # the space before a name takes the name's class
    assert bench.token_class(SOURCE, chars, space + 4, space + 11) == "keywords"


def test_preferences_name_the_class_an_expert_takes_above_its_share() -> None:
    counts = torch.zeros(1, 2, len(bench.CLASSES) + 1)
    counts[0, 0, bench.CLASSES.index("comments")] = 30
    counts[0, 0, bench.CLASSES.index("identifiers")] = 10
    counts[0, 1, bench.CLASSES.index("identifiers")] = 40
    ((first, second),) = bench.preferences(counts)
    assert first[0] == "comments" and first[1] == pytest.approx(2.0) and first[2] == 0.75
    assert second[0] == "identifiers" and second[2] == 1.0


def test_the_picture_is_an_svg_with_a_bar_per_layer_and_model() -> None:
    picture = bench.svg([2.0, 3.5], [1.5, 1.2])
    assert picture.startswith("<svg") and picture.count('fill="#1f77b4"') == 3  # + legend
    assert "layer 1" in picture


@pytest.mark.slow
def test_a_quick_run_writes_its_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    picture = tmp_path / "skew.svg"
    out = bench.main(["--quick", "--results", str(results), "--picture", str(picture)])
    assert len(out["demo"].skew) == 4 and all(s >= 1.0 for s in out["demo"].skew)
    assert out["rebalance"]["imbalance_after"] <= out["rebalance"]["imbalance_before"]
    assert 0 < out["drop_rate"][1.25] <= out["drop_rate"][1.0] < 1
    assert out["completion"] and out["class_tokens"] >= 600
    begin, end = markers(bench.SECTION)
    text = results.read_text()
    assert begin in text and end in text and "rank imbalance" in text
    assert picture.read_text().startswith("<svg")
