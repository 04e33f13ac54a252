"""Exporting a session: JSONL (everything, one typed object a line) and Parquet (one table)."""

import json
from collections.abc import Callable, Iterator
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.queries import get_session, knob_changes, requests
from storage.replay import StepCursor
from storage.store import Store

TABLES = ("steps", "requests", "knob_changes")


def iter_jsonl(store: Store, session_id: str, page: int = 512) -> Iterator[str]:
    """Lines: the session summary, then its steps, knob changes and requests, each typed."""
    yield _line({"type": "session", **get_session(store, session_id)})
    for record in StepCursor(store, session_id, page=page):
        yield _line({"type": "step", **record})
    for change in knob_changes(store, session_id):
        yield _line({"type": "knob_change", **change})
    for req in requests(store, session_id, with_prompts=True):
        yield _line({"type": "request", **req})


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def write_jsonl(store: Store, session_id: str, out: IO[str]) -> int:
    """Write the JSONL export to a text stream; returns the number of lines."""
    n = 0
    for line in iter_jsonl(store, session_id):
        out.write(line)
        n += 1
    return n


Getter = Callable[[dict[str, Any]], Any]


def _get(group: str, key: str) -> Getter:
    """Reads record[group][key] (None where an older record lacks the key)."""
    return lambda r: r[group].get(key)


def _step_columns() -> list[tuple[str, pa.DataType, Getter]]:
    i64, f64 = pa.int64(), pa.float64()
    cols: list[tuple[str, pa.DataType, Getter]] = [
        ("step", i64, lambda r: r["step"]),
        ("t", f64, lambda r: r["t"]),
        ("knobs_version", i64, lambda r: r["knobs_version"]),
    ]
    for part in ("schedule", "prepare", "forward", "moe", "sample", "total"):
        cols.append((f"dur_{part}_ms", f64, _get("dur_ms", part)))
    for key in ("max_slots", "token_budget", "num_prefill_tokens", "num_decode_tokens"):
        cols.append((key, i64, _get("batch", key)))
    cols.append(("num_slots", i64, lambda r: len(r["batch"]["slots"])))
    for key in ("waiting", "running", "swapped", "arrived", "finished", "preempted"):
        cols.append((f"queue_{key}", i64, _get("queue", key)))
    for key in (
        "block_size",
        "total",
        "usable",
        "used",
        "cached",
        "free",
        "tokens",
        "watermark_blocks",
        "host_total",
        "host_used",
    ):
        cols.append((f"kv_{key}", i64, _get("kv", key)))
    cols += [
        ("kv_prefix_hit_rate", f64, lambda r: r["kv"].get("prefix_hit_rate")),
        ("expert_counts", pa.list_(pa.list_(i64)), lambda r: r["experts"]["counts"]),
        ("expert_dropped", pa.list_(i64), lambda r: r["experts"]["dropped"]),
        ("expert_balance", pa.list_(f64), lambda r: r["experts"]["balance"]),
        ("a2a_mode", pa.string(), lambda r: r["a2a"]["mode"]),
        ("a2a_bytes", pa.list_(pa.list_(i64)), lambda r: r["a2a"]["bytes"]),
        ("a2a_gather_bytes", pa.list_(pa.list_(i64)), lambda r: r["a2a"].get("gather_bytes")),
        ("a2a_ep_size", i64, lambda r: r["a2a"]["ep_size"]),
        ("a2a_rank_tokens", pa.list_(i64), lambda r: r["a2a"].get("rank_tokens")),
        ("a2a_rank_moe_ms", pa.list_(f64), lambda r: r["a2a"].get("rank_moe_ms")),
        ("a2a_imbalance", f64, lambda r: r["a2a"].get("imbalance")),
        ("a2a_placement_version", i64, lambda r: r["a2a"].get("placement_version")),
        ("ttft_ms", pa.list_(f64), lambda r: r["latency"]["ttft_ms"]),
        ("tpot_ms", pa.list_(f64), lambda r: r["latency"]["tpot_ms"]),
        ("slots_json", pa.string(), lambda r: json.dumps(r["batch"]["slots"])),
        ("knob_changes_json", pa.string(), lambda r: json.dumps(r.get("knob_changes") or [])),
    ]
    return cols


def write_parquet(
    store: Store, session_id: str, dest: Any, table: str = "steps", page: int = 2048
) -> int:
    """Write one table of the session to a Parquet file or binary stream; returns its rows.

    `steps` flattens each StepTelemetry into scalar and list columns (slots and knob changes
    as JSON text); the session summary is in the file's metadata under `moescope.session`.
    """
    if table not in TABLES:
        raise ValueError(f"table: expected one of {', '.join(TABLES)}, got {table!r}")
    summary = get_session(store, session_id)
    meta = {"moescope.session": json.dumps(summary), "moescope.table": table}
    if table == "steps":
        cols = _step_columns()
        schema = pa.schema([(name, typ) for name, typ, _ in cols], metadata=meta)
        rows = 0
        with pq.ParquetWriter(dest, schema) as writer:
            batch: list[dict[str, Any]] = []
            for record in StepCursor(store, session_id, page=page):
                batch.append(record)
                if len(batch) == page:
                    writer.write_table(_steps_table(batch, cols, schema))
                    rows, batch = rows + len(batch), []
            if batch or not rows:
                writer.write_table(_steps_table(batch, cols, schema))
                rows += len(batch)
        return rows
    records = (
        requests(store, session_id)
        if table == "requests"
        else [{**c, "changes": json.dumps(c["changes"])} for c in knob_changes(store, session_id)]
    )
    arrow = pa.Table.from_pylist(records, schema=_flat_schema(table)).replace_schema_metadata(meta)
    pq.write_table(arrow, dest)
    return arrow.num_rows


def _steps_table(batch: list[dict[str, Any]], cols: list[Any], schema: pa.Schema) -> pa.Table:
    arrays = [pa.array([get(r) for r in batch], type=typ) for _, typ, get in cols]
    return pa.Table.from_arrays(arrays, schema=schema)


def _flat_schema(table: str) -> pa.Schema:
    i64, f64, s = pa.int64(), pa.float64(), pa.string()
    if table == "requests":
        return pa.schema(
            [
                ("req", s),
                ("arrival", f64),
                ("finished_t", f64),
                ("prompt_len", i64),
                ("output_len", i64),
                ("max_tokens", i64),
                ("ttft_ms", f64),
                ("e2e_ms", f64),
                ("finish_reason", s),
                ("preemptions", i64),
            ]
        )
    return pa.schema([("step", i64), ("version", i64), ("t", f64), ("origin", s), ("changes", s)])
