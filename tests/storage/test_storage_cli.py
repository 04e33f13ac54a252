"""`moescope sessions ...` and `moescope replay` against a database, with no server."""

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from storage_helpers import bare_recorder, request_record, step_record

from cli.main import main
from storage import SessionNotFound, Store
from storage import queries as q


@pytest.fixture
def db(db_url: str) -> tuple[str, str]:
    """A database with one recorded session of 20 steps and 3 requests; (url, session id)."""
    store = Store(db_url)
    rec, steps, requests = bare_recorder(store)
    t = time.time()
    for i in range(20):
        steps.publish(step_record(i, t + i * 0.01))
    for i, (p, n) in enumerate([(4, 5), (9, 2), (12, 7)]):
        requests.publish(request_record(f"r{i}", t + i * 0.01, p, n))
    rec.close()
    store.close()
    return db_url, "main"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


def test_list_show_label_delete(db: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    url, sid = db
    listing = _run(capsys, "sessions", "list", "--db", url)
    assert sid in listing and "synthetic:test" in listing
    (entry,) = json.loads(_run(capsys, "sessions", "list", "--db", url, "--json"))
    assert entry["steps"] == 20 and entry["requests"] == 3
    shown = _run(capsys, "sessions", "show", sid, "--db", url)
    assert "20 (from 0 to 19)" in shown and "output tokens 14" in shown
    _run(capsys, "sessions", "label", sid, "baseline", "--db", url)
    assert (
        json.loads(_run(capsys, "sessions", "show", sid, "--db", url, "--json"))["label"]
        == "baseline"
    )
    _run(capsys, "sessions", "delete", sid, "--db", url)
    with pytest.raises(SystemExit) as info:
        main(["sessions", "show", sid, "--db", url])
    assert f"no session '{sid}'" in str(info.value)


def test_export_jsonl_and_parquet(
    db: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, sid = db
    out = tmp_path / "s.jsonl"
    _run(capsys, "sessions", "export", sid, "--db", url, "-o", str(out))
    kinds = [json.loads(line)["type"] for line in out.read_text().splitlines()]
    assert kinds.count("step") == 20 and kinds.count("request") == 3
    for table, rows in (("steps", 20), ("requests", 3), ("knob_changes", 0)):
        path = tmp_path / f"{table}.parquet"
        _run(
            capsys,
            "sessions",
            "export",
            sid,
            "--db",
            url,
            "--format",
            "parquet",
            "--table",
            table,
            "-o",
            str(path),
        )
        assert pq.read_table(path).num_rows == rows
    steps = pq.read_table(tmp_path / "steps.parquet")
    assert steps.column("step").to_pylist() == list(range(20))
    assert steps.column("expert_counts")[3].as_py() == step_record(3, 0)["experts"]["counts"]


def test_replay_prints_one_line_per_step(
    db: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, sid = db
    lines = _run(capsys, "replay", sid, "--db", url, "--speed", "0", "--from", "5").splitlines()
    assert len(lines) == 15 and lines[0].startswith("step      5")
    assert "run   2" in lines[0] and "kv 2/64" in lines[0]


@pytest.mark.parametrize(
    ("option", "value", "rule"),
    [
        ("--speed", "-1", "a finite number >= 0"),
        ("--speed", "nan", "a finite number >= 0"),
        ("--speed", "inf", "a finite number >= 0"),
        ("--from", "-5", "an integer >= 0"),
    ],
)
def test_replay_refuses_bad_speed_and_start(
    db: tuple[str, str], option: str, value: str, rule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, sid = db
    with pytest.raises(SystemExit) as info:
        main(["replay", sid, "--db", url, option, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must be {rule}, got '{value}'" in err
    assert url not in err


def test_delete_refuses_an_open_session_unless_forced(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(db_url)
    rec, steps, _ = bare_recorder(store)
    steps.publish(step_record(0, time.time()))
    assert rec.flush()
    with pytest.raises(SystemExit) as info:
        main(["sessions", "delete", "main", "--db", db_url])
    assert str(info.value) == (
        "moescope sessions delete: session 'main' is still open (no end "
        "time): a server may be recording it; --force deletes it anyway"
    )
    assert [s["step"] for s in q.steps(store, "main")] == [0]
    assert (
        _run(capsys, "sessions", "delete", "main", "--force", "--db", db_url)
        == "deleted session main\n"
    )
    steps.publish(step_record(1, time.time()))
    assert rec.flush()
    assert not rec.stats()["ok"] and rec.dropped_steps == 1
    rec.close()
    with pytest.raises(SessionNotFound):
        q.get_session(store, "main")
    store.close()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_export_to_an_unwritable_path_is_one_line(
    db: tuple[str, str], tmp_path: Path, fmt: str
) -> None:
    url, sid = db
    out = tmp_path / "missing" / f"x.{fmt}"
    with pytest.raises(SystemExit) as info:
        main(["sessions", "export", sid, "--db", url, "--format", fmt, "-o", str(out)])
    assert str(info.value) == (
        f"moescope sessions export: cannot write {out}: No such file or directory"
    )
    assert not out.parent.exists()
