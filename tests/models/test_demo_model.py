"""The demo model: `demo` names the shipped checkpoint, moescope runs it as transformers does,
and the training script makes a checkpoint moescope loads."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import MixtralForCausalLM

from engine import LLM, SamplingParams
from engine.model.loader import DEMO_MODEL, load_model, resolve_model_path

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def fibonacci(n):\n    "
NEW_TOKENS = 24


def test_demo_names_the_shipped_checkpoint() -> None:
    assert resolve_model_path("demo") == DEMO_MODEL == ROOT / "models" / "demo"
    assert resolve_model_path("some/dir") == Path("some/dir")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training.json"):
        assert (DEMO_MODEL / name).is_file(), name


def test_the_shipped_checkpoint_is_small_and_mixtral_shaped() -> None:
    config = json.loads((DEMO_MODEL / "config.json").read_text())
    assert config["model_type"] == "mixtral"
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (8, 2)
    assert (DEMO_MODEL / "model.safetensors").stat().st_size <= 16 * 2**20


def _transformers_greedy(prompt_ids: list[int], steps: int) -> list[int]:
    """Greedy tokens from transformers' own Mixtral, recomputed without a cache each step."""
    model = MixtralForCausalLM.from_pretrained(
        DEMO_MODEL, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt_ids) :]


def test_demo_greedy_output_matches_transformers() -> None:
    prompt_ids = Tokenizer.from_file(str(DEMO_MODEL / "tokenizer.json")).encode(PROMPT).ids
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    with LLM(model="demo", dtype="float32") as llm:
        assert llm.tokenizer.encode(PROMPT) == prompt_ids
        out = llm.generate([PROMPT], params, use_tqdm=False)[0]
    assert out.token_ids == _transformers_greedy(prompt_ids, NEW_TOKENS)


@pytest.mark.slow
def test_quick_training_writes_a_checkpoint_moescope_loads(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "models.train_demo", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "training.json").read_text())
    assert record["steps"] == 3 and record["tokens_seen"] > 0
    model, tokenizer = load_model(str(tmp_path), torch.float32, "cpu")
    assert model.cfg.num_experts == 8 and model.cfg.tie_embeddings
    ids = tokenizer.encode("import os\n")
    assert tokenizer.decode(ids) == "import os\n"
