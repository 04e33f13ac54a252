"""An engine, once built, takes the process's long-lived objects out of the collector's way."""

import subprocess
import sys

BUILD = """
import gc
from engine import LLMEngine
before = gc.get_freeze_count()
LLMEngine(model="synthetic:tiny")
print(before, gc.get_freeze_count())
"""


def test_building_an_engine_freezes_the_heap_it_made() -> None:
    out = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.split())
    assert before == 0 and after > 10_000  # torch's, the model's and the engine's objects
