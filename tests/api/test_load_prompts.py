"""Real prompts in the load: `moescope load --prompts FILE|heldout`, and `moescope demo`'s
load, which sends held-out standard library snippets to the demo model."""

import asyncio
import json
import platform
import random
import subprocess
from pathlib import Path

import pytest
from api_servers import TIMEOUT, Served, wait_for, wait_idle
from tokenizers import Tokenizer

from api.app import create_app
from api.launch import ServerThread, build_loop
from cli.demo import load_command, server_command
from cli.loadgen import (
    Arrival,
    file_prompts,
    held_out_prompts,
    load_prompts,
    parse_dist,
    poisson_arrivals,
    run_load,
)
from cli.main import main
from models.corpus import DEMO_DIR, file_list_hash, held_out_texts, library_files, read_texts
from server.settings import ServerSettings
from server.state import state_of
from storage import Recorder, Store
from storage import queries as q

ROOT = Path(__file__).resolve().parents[2]


def test_a_prompt_file_is_jsonl_or_text_one_prompt_a_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "def f(x):", "id": 1}\n\n{"prompt": "import os\\n"}\n')
    assert load_prompts(path) == ["def f(x):", "import os\n"]
    path = tmp_path / "p.txt"
    path.write_text("first prompt\n\n  second, indented\n")
    assert load_prompts(path) == ["first prompt", "  second, indented"]
    source = file_prompts(load_prompts(path))
    rng, arrival = random.Random(0), Arrival(0.0, 5, 5)
    assert [source(arrival, rng) for _ in range(3)] == [
        "first prompt",
        "  second, indented",
        "first prompt",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"prompt": "a"}\n{"prompt": "b"\n', "bad.txt:2: not a JSON object"),
        (b'{"prompt": "a"}\n\n{"text": "b"}\n', 'bad.txt:3: no "prompt" string'),
        (b'{"prompt": "a"}\n[1, 2]\n', 'bad.txt:2: no "prompt" string'),
        (b'{"prompt": ""}\n', 'bad.txt:1: no "prompt" string'),
        (b"fine\nnot \xff utf-8\n", "bad.txt:2: not UTF-8 text"),
        (b"\n  \n", "bad.txt: no prompts"),
    ],
)
def test_a_bad_prompt_file_names_the_file_and_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        load_prompts(path)
    with pytest.raises(SystemExit) as done:
        main(["load", "--prompts", str(path), "--url", "http://127.0.0.1:9", "--no-progress"])
    assert str(done.value).startswith(f"moescope load: --prompts: {path}{message[7:]}")


def test_a_missing_prompt_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as done:
        main(["load", "--prompts", str(tmp_path / "nope.txt"), "--no-progress"])
    assert str(done.value).startswith(f"moescope load: cannot read {tmp_path / 'nope.txt'}: ")


def test_the_held_out_files_are_the_split_the_demo_model_was_trained_with() -> None:
    record = json.loads((DEMO_DIR / "training.json").read_text())
    if record["python"] != platform.python_version():
        pytest.skip(f"the demo model was trained on Python {record['python']}'s library")
    root, files = library_files()
    names = sorted(read_texts(root, files))
    assert file_list_hash(names) == record["file_list_sha256"]
    assert len(held_out_texts()) == record["held_out_files"]


def test_held_out_snippets_are_held_out_text_of_the_wanted_length() -> None:
    held = list(held_out_texts().values())
    tokenizer = Tokenizer.from_file(str(DEMO_DIR / "tokenizer.json"))
    source, rng = held_out_prompts(), random.Random(3)
    for length in (8, 40, 200):
        prompt = source(Arrival(0.0, length, 4), rng)
        assert len(tokenizer.encode(prompt).ids) == length  # BOS included, as served
        assert any(prompt in text for text in held)
        assert prompt == prompt.lstrip("\n") and prompt.strip()  # from a line's start
    # seeded: the same generator state picks the same snippet
    again, arrival = held_out_prompts(), Arrival(0.0, 40, 4)
    assert source(arrival, random.Random(9)) == again(arrival, random.Random(9))


def test_a_run_sends_the_file_prompts(served: Served, tmp_path: Path) -> None:
    wait_idle(served.loop)
    texts = ["def add(a, b):", "for i in range(3):", "class Point:"]
    arrivals = list(poisson_arrivals(20.0, 1.0, parse_dist("fixed:99"), parse_dist("fixed:3"), 1))
    summary = asyncio.run(run_load(served.url, arrivals, prompts=file_prompts(texts)))
    assert summary["ok"] == len(arrivals) > 5
    # the byte tokenizer: a token a byte, plus BOS; prompts in order, round and round
    sent = [texts[i % len(texts)] for i in range(len(arrivals))]
    assert summary["prompt_tokens"] == sum(len(t) + 1 for t in sent)


@pytest.mark.slow
def test_the_demo_load_sends_held_out_snippets_to_the_demo_model(tmp_path: Path) -> None:
    """The demo's own server flags and load command, against a server on the demo model: the
    recorded prompts are held-out standard library source."""
    assert "--record-prompts" in server_command(8000, [])
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    loop = build_loop("demo", num_kv_blocks=512, record_prompts=True)
    server = ServerThread(create_app(loop, ServerSettings(model_name="demo", db_url=url)))
    try:
        server.start()
        command = load_command(server.url, 8.0, 1.0)
        command[command.index("--output-len") + 1] = "fixed:4"  # shorter, for the test
        done = subprocess.run(
            [*command, "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert " 0 errors" in done.stdout
        app = state_of(server.server.config.app)
        rec, store = app.recorder, app.store
        assert isinstance(rec, Recorder) and isinstance(store, Store)
        wait_for(lambda: not loop.engine.has_unfinished(), TIMEOUT, "the load to finish")
        wait_for(lambda: rec.flush() and rec.written_requests > 0, TIMEOUT, "the recording")
        records = q.requests(store, loop.engine.session, with_prompts=True)
        tokenizer = Tokenizer.from_file(str(DEMO_DIR / "tokenizer.json"))
        held = list(held_out_texts().values())
        assert len(records) >= 3
        for r in records:
            ids = r["prompt_token_ids"]
            assert ids[0] == tokenizer.token_to_id("<s>") and 16 <= len(ids) <= 256
            text = tokenizer.decode(ids[1:])
            assert any(text in source for source in held), text
    finally:
        server.stop()
        loop.stop()
