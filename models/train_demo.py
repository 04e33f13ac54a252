"""Train the demo MoE: a small Mixtral on the Python standard library's own source.

No model hub is reachable where moescope is built, so the demo model is made here, from text
every Python installation has. Run `python -m models.train_demo` (4 to 8 minutes on two
CPU cores); `--quick` trains a few steps on a tiny slice, for tests. The same seed, steps
and Python version give the same checkpoint.
"""

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import MixtralConfig, MixtralForCausalLM

from models.corpus import DEMO_DIR, file_list_hash, is_held_out, library_files, read_texts

OUT = DEMO_DIR
VOCAB_SIZE = 4096
BOS, EOS = "<s>", "</s>"
SEQ_LEN = 256


@dataclass(frozen=True)
class Plan:
    """What one run trains: its steps, batch and model size."""

    steps: int
    batch: int
    lr: float
    warmup: int
    max_files: int | None  # None: the whole library
    hidden: int = 192
    intermediate: int = 320
    layers: int = 4
    heads: int = 6
    kv_heads: int = 2
    experts: int = 8
    top_k: int = 2
    aux_loss_coef: float = 0.01
    eval_windows: int = 64


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE; encoding adds BOS in front (as moescope's prompts expect)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = special_id(tok, BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    return tok


def special_id(tok: Tokenizer, token: str) -> int:
    """The id of one of the tokenizer's special tokens."""
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer has no {token!r}")
    return token_id


def token_stream(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one stream of ids, each file as BOS text EOS."""
    eos = special_id(tok, EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def model_config(plan: Plan, tok: Tokenizer) -> MixtralConfig:
    """A Mixtral that moescope's loader accepts: no sliding window, default rope, tied
    embeddings (they halve the checkpoint's largest tensor)."""
    return MixtralConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=plan.hidden,
        intermediate_size=plan.intermediate,
        num_hidden_layers=plan.layers,
        num_attention_heads=plan.heads,
        num_key_value_heads=plan.kv_heads,
        head_dim=plan.hidden // plan.heads,
        num_local_experts=plan.experts,
        num_experts_per_tok=plan.top_k,
        max_position_embeddings=2048,
        sliding_window=None,
        tie_word_embeddings=True,
        router_aux_loss_coef=plan.aux_loss_coef,
        bos_token_id=special_id(tok, BOS),
        eos_token_id=special_id(tok, EOS),
    )


def batches(stream: torch.Tensor, batch: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless [batch, SEQ_LEN] windows at random offsets of the stream."""
    while True:
        starts = torch.randint(0, len(stream) - SEQ_LEN, (batch,), generator=gen)
        yield torch.stack([stream[s : s + SEQ_LEN] for s in starts.tolist()])


def learning_rate(step: int, plan: Plan) -> float:
    """Linear warmup, then cosine down to a tenth of the peak."""
    if step < plan.warmup:
        return plan.lr * (step + 1) / plan.warmup
    done = (step - plan.warmup) / max(1, plan.steps - plan.warmup)
    return plan.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))


def eval_windows(stream: torch.Tensor, count: int) -> torch.Tensor:
    """`count` evenly spaced, non-overlapping windows (fewer if the stream is short)."""
    n = min(count, len(stream) // SEQ_LEN)
    step = len(stream) // n
    return torch.stack([stream[i * step : i * step + SEQ_LEN] for i in range(n)])


@torch.no_grad()
def evaluate(model: MixtralForCausalLM, windows: torch.Tensor) -> tuple[float, list[float]]:
    """Mean next-token loss over `windows`, and per layer the max/mean expert load (how
    unevenly the router spreads these tokens: 1.0 is perfectly even)."""
    model.eval()
    losses, counts = [], torch.zeros(model.config.num_hidden_layers, model.config.num_local_experts)
    for chunk in windows.split(8):
        out = model(chunk, output_router_logits=True)
        # the language-model loss alone (the model's own loss adds the router's aux loss)
        losses.append(
            F.cross_entropy(out.logits[:, :-1].flatten(0, 1), chunk[:, 1:].flatten()).item()
        )
        for layer, logits in enumerate(out.router_logits):
            top = logits.topk(model.config.num_experts_per_tok, dim=-1).indices
            counts[layer] += torch.bincount(top.flatten(), minlength=counts.shape[1])
    model.train()
    skew = (counts.max(dim=1).values / counts.mean(dim=1)).tolist()
    return sum(losses) / len(losses), [round(s, 3) for s in skew]


def train(plan: Plan, seed: int, out: Path, max_seconds: float | None = None) -> dict[str, Any]:
    """Build the tokenizer and model, train, write the checkpoint; returns training.json."""
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    root, files = library_files()
    texts = read_texts(root, files[: plan.max_files] if plan.max_files else files)
    names = sorted(texts)
    train_names = [n for n in names if not is_held_out(n)]
    held_names = [n for n in names if is_held_out(n)] or names[-1:]  # a tiny slice may miss
    tok = train_tokenizer([texts[n] for n in train_names], VOCAB_SIZE)
    train_ids = token_stream(tok, [texts[n] for n in train_names])
    held_ids = token_stream(tok, [texts[n] for n in held_names])
    config = model_config(plan, tok)
    # on a CPU the plain per-expert loop trains fastest (grouped_mm is made for GPUs)
    config._experts_implementation = "eager"
    model = MixtralForCausalLM(config)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=plan.lr, betas=(0.9, 0.95), weight_decay=0.1)
    data = batches(train_ids, plan.batch, torch.Generator().manual_seed(seed))
    tokens, steps, t0, loss = 0, 0, time.perf_counter(), float("nan")
    bar = tqdm(range(plan.steps), desc="training", mininterval=2.0)
    for step in bar:
        if max_seconds and time.perf_counter() - t0 > max_seconds:
            break  # a time budget: training.json records the steps actually taken
        for group in optim.param_groups:
            group["lr"] = learning_rate(step, plan)
        window = next(data)
        # labels are shifted inside the model, so the inputs are passed as their own labels
        result = model(window, labels=window, output_router_logits=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        tokens += window.numel()
        steps += 1
        loss = result.loss.item()
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    seconds = time.perf_counter() - t0
    held_loss, skew = evaluate(model, eval_windows(held_ids, plan.eval_windows))
    train_loss, _ = evaluate(model, eval_windows(train_ids, plan.eval_windows))
    save(model, tok, out)
    record = {
        "python": platform.python_version(),
        "stdlib_files": len(names),
        "file_list_sha256": file_list_hash(names),
        "held_out_files": len(held_names),
        "train_tokens_in_corpus": len(train_ids),
        "held_out_tokens_in_corpus": len(held_ids),
        "seed": seed,
        "steps": steps,
        "planned_steps": plan.steps,
        "batch": plan.batch,
        "seq_len": SEQ_LEN,
        "peak_lr": plan.lr,
        "tokens_seen": tokens,
        "last_step_loss": round(loss, 4),
        "train_loss": round(train_loss, 4),
        "held_out_loss": round(held_loss, 4),
        "held_out_expert_load_max_over_mean": skew,
        "tokens_per_s": round(tokens / seconds, 1),
        "train_seconds": round(seconds, 1),
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def save(model: MixtralForCausalLM, tok: Tokenizer, out: Path) -> None:
    """bf16 safetensors (the checkpoint ships in the repository, so it is kept small)."""
    out.mkdir(parents=True, exist_ok=True)
    model.config.output_router_logits = False
    model.bfloat16().save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m models.train_demo", description=__doc__)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--max-minutes", type=float, default=None, help="stop early after this long")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--quick", action="store_true", help="a few steps on a tiny slice (tests)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.quick:
        plan = Plan(steps=3, batch=2, lr=args.lr, warmup=1, max_files=12, eval_windows=2)
    else:
        plan = Plan(
            steps=args.steps,
            batch=args.batch,
            lr=args.lr,
            warmup=max(1, min(30, args.steps // 10)),
            max_files=None,
        )
    max_seconds = args.max_minutes * 60 if args.max_minutes else None
    record = train(plan, args.seed, args.out, max_seconds)
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
