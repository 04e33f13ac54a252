"""What the demo model learned: its held-out loss and a completion, how unevenly it routes real
text per layer (beside `synthetic:small`, whose skew is a seeded setting), which token
classes each expert prefers, and what that does on `make demo`'s 4 modeled ranks: the rank
imbalance before and after `POST /api/experts/rebalance`, and the drop rate at capacity
factors 1.0 and 1.25.

Loss, skew of the training script's own evaluation and the token classes come from
transformers' Mixtral on the shipped weights (the model the tests pin moescope to), over
held-out windows; tokens are classed by Python's `tokenize` over the held-out source. The rest
runs `make demo`'s setup in this process: a server on the demo model with 4 modeled
expert-parallel ranks, and the demo's load (held-out snippets of 16 to 256 tokens, outputs
of 16 to 128, Poisson arrivals) sent over HTTP, a fresh seed per phase. Rank imbalance is
sum over layers of the busiest rank's load / sum of the mean rank's (`engine.ep.placement.
imbalance`), over the expert loads of a whole phase. Writes a section of benchmarks/RESULTS.md
and the picture docs/demo_skew.svg.
Run: `python -m benchmarks.control.demo_model` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import keyword
import sys
import time
import tokenize
from itertools import islice
from pathlib import Path
from typing import Any

import httpx
import torch
from tokenizers import Tokenizer
from transformers import MixtralForCausalLM

from api.app import create_app
from api.launch import ServerThread, build_loop
from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from cli.loadgen import held_out_prompts, parse_dist, poisson_arrivals, run_load
from engine.ep.rebalance import predicted_imbalance
from engine.loop import EngineLoop
from models.corpus import DEMO_DIR, held_out_texts
from models.train_demo import eval_windows, evaluate, token_stream
from server.settings import ServerSettings

SECTION = "demo_model"
EP_SIZE = 4  # `moescope demo`'s modeled ranks
RATE = 3.0  # `moescope demo`'s requests per second
PROMPT_LEN, OUTPUT_LEN = "uniform:16:256", "uniform:16:128"  # `moescope demo`'s load
CLASSES = ("indentation", "identifiers", "keywords", "string literals", "comments", "digits")
OTHER = "other"  # operators, brackets, newlines, spaces between tokens
ROOT = Path(__file__).resolve().parents[2]
SVG_PATH = ROOT / "docs" / "demo_skew.svg"
COMPLETION_PROMPT = "def fibonacci(n):\n    "


# token classes


def char_classes(text: str) -> list[str]:
    """Each character's class by Python's tokenizer: a line's leading whitespace is
    indentation; names are keywords (hard and soft) or identifiers; strings, comments and
    numbers are what they are; the rest is `other`."""
    out = [OTHER] * len(text)
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
        indent = len(line) - len(line.lstrip(" \t"))
        if line.strip():
            out[starts[-2] : starts[-2] + indent] = ["indentation"] * indent
    kinds = {
        tokenize.STRING: "string literals",
        tokenize.COMMENT: "comments",
        tokenize.NUMBER: "digits",
    }
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME:
            word = tok.string
            is_keyword = keyword.iskeyword(word) or keyword.issoftkeyword(word)
            kind = "keywords" if is_keyword else "identifiers"
        else:
            kind = kinds.get(tok.type, "")
        if not kind:
            continue
        a = starts[tok.start[0] - 1] + tok.start[1]
        b = starts[tok.end[0] - 1] + tok.end[1]
        out[a:b] = [kind] * (b - a)
    return out


def token_class(text: str, chars: list[str], start: int, end: int) -> str:
    """A BPE token's class: its first non-space character's; indentation if it is all
    whitespace that indents a line."""
    for i in range(start, end):
        if not text[i].isspace():
            return chars[i]
    return "indentation" if "indentation" in chars[start:end] else OTHER


def expert_classes(
    model: MixtralForCausalLM, tok: Tokenizer, texts: list[str], max_tokens: int
) -> tuple[torch.Tensor, int]:
    """Routed (token, expert) pairs by [layer, expert, class] (CLASSES, then OTHER) over up to
    `max_tokens` tokens of `texts`, in windows of 256 that start with BOS; and the tokens."""
    model.eval()
    cfg = model.config
    counts = torch.zeros(cfg.num_hidden_layers, cfg.num_local_experts, len(CLASSES) + 1)
    index = {c: i for i, c in enumerate((*CLASSES, OTHER))}
    bos, seen = tok.token_to_id("<s>"), 0
    for text in texts:
        try:
            chars = char_classes(text)
        except (tokenize.TokenError, SyntaxError):
            continue  # a file this Python's tokenizer refuses: left out
        enc = tok.encode(text, add_special_tokens=False)
        labels = torch.tensor([index[token_class(text, chars, a, b)] for a, b in enc.offsets])
        for i in range(0, len(enc.ids), 255):
            if seen >= max_tokens:
                return counts, seen
            ids = torch.tensor([[bos, *enc.ids[i : i + 255]]])
            with torch.no_grad():
                logits = model(ids, output_router_logits=True).router_logits
            cls = labels[i : i + 255]
            for layer, lg in enumerate(logits):
                top = lg[1:].topk(cfg.num_experts_per_tok, dim=-1).indices  # BOS left out
                for k in range(top.shape[1]):
                    counts[layer].index_put_((top[:, k], cls), torch.ones(len(cls)), True)
            seen += len(cls)
    return counts, seen


def preferences(counts: torch.Tensor) -> list[list[tuple[str, float, float]]]:
    """Per layer, per expert: the class (of CLASSES) it takes most above its share of all
    routed pairs, that lift, and the share of the expert's pairs in that class."""
    out = []
    for layer in counts:
        base = layer.sum(0) / layer.sum()
        rows = []
        for expert in layer:
            share = expert / expert.sum().clamp(min=1)
            lift = share[: len(CLASSES)] / base[: len(CLASSES)].clamp(min=1e-9)
            best = int(lift.argmax())
            rows.append((CLASSES[best], float(lift[best]), float(share[best])))
        out.append(rows)
    return out


# the served phases


class Phase:
    """One load on the server: its steps' expert counts summed, drops and per-step imbalance."""

    def __init__(self, steps: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        routed = [s for s in steps if s["experts"]["counts"]]
        self.loads = torch.tensor([s["experts"]["counts"] for s in routed]).sum(0)
        self.dropped = sum(sum(s["experts"]["dropped"]) for s in routed)
        self.pairs = int(self.loads.sum())
        busy = [s for s in routed if sum(map(sum, s["experts"]["counts"]))]
        self.step_imbalance = sum(s["a2a"]["imbalance"] for s in busy) / max(1, len(busy))
        self.steps = len(steps)
        self.summary = summary

    @property
    def skew(self) -> list[float]:
        """Per layer: the busiest expert's load over the mean expert's."""
        loads = self.loads.double()
        return [round(v, 3) for v in (loads.max(1).values / loads.mean(1)).tolist()]


def run_phase(url: str, loop: EngineLoop, args: argparse.Namespace, seed: int, model: str) -> Phase:
    """The demo's load (`args.requests` arrivals, seed `seed`) sent to `url`; every step it
    caused, taken from the loop's bus."""
    arrivals = list(
        islice(
            poisson_arrivals(RATE, 0.0, parse_dist(PROMPT_LEN), parse_dist(OUTPUT_LEN), seed),
            args.requests,
        )
    )
    sub = loop.bus.subscribe(1 << 20)
    try:
        summary = asyncio.run(run_load(url, arrivals, model=model, seed=seed, prompts=args.prompts))
        wait_idle(loop)
        steps, lost = sub.drain()
    finally:
        loop.bus.unsubscribe(sub)
    if lost or summary["errors"]:
        raise RuntimeError(f"lost {lost} steps, {summary['errors']} request errors: {summary}")
    print(f"{model}, seed {seed}: {len(steps)} steps", file=sys.stderr, flush=True)
    return Phase(steps, summary)


def wait_idle(loop: EngineLoop, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while loop.engine.has_unfinished() or loop.steps != loop.engine.scheduler.step_count:
        if time.monotonic() > deadline:
            raise RuntimeError("the engine did not go idle")
        time.sleep(0.05)


def serve_model(model: str) -> tuple[ServerThread, EngineLoop]:
    loop = build_loop(model, ep_size=EP_SIZE)
    return ServerThread(create_app(loop, ServerSettings(model_name=model))).start(), loop


def demo_runs(args: argparse.Namespace) -> dict[str, Any]:
    """Demo: before (seed 1), rebalance, after (seed 2), capacity 1.0 and 1.25 (seed 3 each,
    same load); synthetic:small: seed 1 (the same prompt text)."""
    out: dict[str, Any] = {}
    server, loop = serve_model("demo")
    try:
        before = run_phase(server.url, loop, args, 1, "demo")
        initial = loop.engine.placement
        window = min(4096, before.steps)
        resp = httpx.post(server.url + "/api/experts/rebalance", json={"window": window})
        resp.raise_for_status()
        after = run_phase(server.url, loop, args, 2, "demo")
        drops = {}
        for factor in (1.0, 1.25):
            knobs = {"expert_capacity_factor": factor}
            httpx.patch(server.url + "/api/knobs", json=knobs).raise_for_status()
            drops[factor] = run_phase(server.url, loop, args, 3, "demo")
        dropless = {"expert_capacity_factor": None}
        httpx.patch(server.url + "/api/knobs", json=dropless).raise_for_status()
        body = {"prompt": COMPLETION_PROMPT, "max_tokens": args.completion_tokens}
        body |= {"model": "demo", "temperature": 0.0}
        done = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        out["completion"] = done.json()["choices"][0]["text"]
        out["rebalance"] = resp.json()
        out["imbalance"] = {
            "before": predicted_imbalance(initial, before.loads),
            "after_old_placement": predicted_imbalance(initial, after.loads),
            "after": predicted_imbalance(loop.engine.placement, after.loads),
            "step_before": before.step_imbalance,
            "step_after": after.step_imbalance,
        }
        out["drop_rate"] = {f: p.dropped / p.pairs for f, p in drops.items()}
        out["demo"] = before
    finally:
        server.stop()
        loop.stop()
    server, loop = serve_model("synthetic:small")
    try:
        out["small"] = run_phase(server.url, loop, args, 1, "synthetic:small")
        out["small_imbalance"] = predicted_imbalance(loop.engine.placement, out["small"].loads)
    finally:
        server.stop()
        loop.stop()
    return out


# the report


def svg(demo: list[float], small: list[float]) -> str:
    """Grouped bars of skew per MoE layer: the demo model's and synthetic:small's."""
    width, height, left, bottom, top = 520, 260, 50, 40, 30
    top_value = max(2.0, max(demo + small) * 1.1)
    layers = max(len(demo), len(small))
    slot = (width - left - 20) / layers
    bar = slot / 3

    def y(v: float) -> float:
        return top + (height - top - bottom) * (1 - v / top_value)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">Routing skew per MoE layer (busiest expert / '
        "mean), demo load</text>",
    ]
    for tick in range(int(top_value) + 1):
        parts.append(
            f'<line x1="{left}" x2="{width - 20}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            'stroke="#ddd"/>'
            f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}</text>'
        )
    for series, color, offset in ((demo, "#1f77b4", 0.5), (small, "#bbbbbb", 1.5)):
        for i, v in enumerate(series):
            x = left + i * slot + offset * bar
            parts.append(
                f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bar:.1f}" '
                f'height="{y(0) - y(v):.1f}" fill="{color}"/>'
            )
    for i in range(layers):
        parts.append(
            f'<text x="{left + (i + 0.5) * slot:.1f}" y="{height - bottom + 16}" '
            f'text-anchor="middle">layer {i}</text>'
        )
    parts += [
        f'<rect x="{width - 250}" y="{height - 18}" width="10" height="10" fill="#1f77b4"/>',
        f'<text x="{width - 236}" y="{height - 9}">demo (trained)</text>',
        f'<rect x="{width - 140}" y="{height - 18}" width="10" height="10" fill="#bbbbbb"/>',
        f'<text x="{width - 126}" y="{height - 9}">synthetic:small</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def render(args: argparse.Namespace, argv: list[str], out: dict[str, Any], wall: float) -> str:
    demo, small, imb = out["demo"], out["small"], out["imbalance"]
    trained = out["training"]
    lines = [
        header(
            "What the demo model learned (`benchmarks/control/demo_model.py`)",
            ["python", "-m", "benchmarks.control.demo_model", *argv],
            wall,
            machine.measure(),
        ),
        f"- Engine code: {machine.engine_revision()}",
        f"- Model: `demo` (models/demo, {trained['steps']} steps, seed {trained['seed']}); "
        f"beside `synthetic:small` (random weights, router_skew 0.6)",
        f"- Load: `moescope demo`'s ({RATE:g} req/s Poisson, {PROMPT_LEN} prompt tokens of "
        f"held-out standard library snippets, {OUTPUT_LEN} output tokens), {args.requests} "
        "requests a phase, over HTTP to a server with 4 modeled expert-parallel ranks",
        "",
        f"Held-out loss (transformers, {args.eval_windows} windows of 256): "
        f"**{out['loss']:.4f}** (training.json: {trained['held_out_loss']}). "
        f"Greedy completion of `{COMPLETION_PROMPT!r}`:",
        "",
        "```python",
        COMPLETION_PROMPT + out["completion"],
        "```",
        "",
        "Routing skew, busiest expert's load / mean expert's, per MoE layer (1.0 = even):",
        "",
        "| model, load | " + " | ".join(f"layer {i}" for i in range(len(demo.skew))) + " |",
        "| --- |" + " --- |" * max(len(demo.skew), len(small.skew)),
        "| demo, served demo load | " + " | ".join(f"{v:.2f}" for v in demo.skew) + " |",
        "| demo, held-out windows (transformers) | "
        + " | ".join(f"{v:.2f}" for v in out["window_skew"])
        + " |",
        "| synthetic:small, same prompt text | "
        + " | ".join(f"{v:.2f}" for v in small.skew)
        + " |",
        "",
        f"The class each expert takes most above its share (lift x, and the share of the "
        f"expert's pairs in it), over {out['class_tokens']} held-out tokens classed by "
        "`tokenize`:",
        "",
        "| expert | " + " | ".join(f"layer {i}" for i in range(len(out["prefs"]))) + " |",
        "| --- |" + " --- |" * len(out["prefs"]),
    ]
    for e in range(len(out["prefs"][0])):
        cells = [
            f"{c} {lift:.1f}x ({share:.0%})" for c, lift, share in (p[e] for p in out["prefs"])
        ]
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    reb = out["rebalance"]
    lines += [
        "",
        "| 4 modeled ranks | rank imbalance |",
        "| --- | --- |",
        f"| before rebalance (seed 1 load, first placement) | {imb['before']:.3f} |",
        f"| rebalance's prediction on that load ({reb['window_steps']} steps) | "
        f"{reb['imbalance_before']:.3f} -> {reb['imbalance_after']:.3f} |",
        f"| after (seed 2 load, new placement) | {imb['after']:.3f} |",
        f"| control: the first placement on the seed 2 load | {imb['after_old_placement']:.3f} |",
        f"| per-step mean (`a2a.imbalance`), before / after | {imb['step_before']:.3f} / "
        f"{imb['step_after']:.3f} |",
        f"| synthetic:small, first placement | {out['small_imbalance']:.3f} |",
        "",
        "| capacity factor | drop rate (pairs dropped / routed, seed 3 load) |",
        "| --- | --- |",
    ]
    lines += [f"| {f:g} | {rate:.2%} |" for f, rate in out["drop_rate"].items()]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=48, help="arrivals in each served phase")
    p.add_argument("--eval-windows", type=int, default=64, help="held-out windows for the loss")
    p.add_argument("--class-tokens", type=int, default=40_000, help="tokens classed")
    p.add_argument("--completion-tokens", type=int, default=48)
    p.add_argument(
        "--picture",
        type=Path,
        default=None,
        help=f"where the skew SVG goes (default {SVG_PATH.relative_to(ROOT)}; none with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="a few requests and windows")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.eval_windows, args.class_tokens = 4, 2, 600
        args.completion_tokens = 8
    elif args.picture is None:
        args.picture = SVG_PATH
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.perf_counter()
    args.prompts = held_out_prompts()
    tok = Tokenizer.from_file(str(DEMO_DIR / "tokenizer.json"))
    texts = [text for _, text in sorted(held_out_texts().items())]
    model = MixtralForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32)
    loss, window_skew = evaluate(model, eval_windows(token_stream(tok, texts), args.eval_windows))
    print(f"held-out loss {loss:.4f}; classing tokens", file=sys.stderr, flush=True)
    counts, seen = expert_classes(model, tok, texts, args.class_tokens)
    del model
    out = demo_runs(args)
    out |= {
        "loss": loss,
        "window_skew": window_skew,
        "prefs": preferences(counts),
        "class_tokens": seen,
        "training": json.loads((DEMO_DIR / "training.json").read_text()),
    }
    if args.picture is not None:
        args.picture.write_text(svg(out["demo"].skew, out["small"].skew))
    publish(SECTION, render(args, argv, out, time.perf_counter() - started), results_path(args))
    return out


if __name__ == "__main__":
    main()
