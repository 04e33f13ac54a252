"""The machine a benchmark runs on, measured as it runs (each report's `Machine:` line), and
the engine code that ran on it."""

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo; the platform's machine type without one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.machine() or "unknown CPU"


def measure() -> dict[str, Any]:
    """When, the CPU model, the cores this process may run on (and the machine's), torch's
    intra-op threads, the load average over 1, 5 and 15 minutes, the GPU and the versions."""
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def describe(m: dict[str, Any]) -> str:
    """`measure`'s record as one line of a report."""
    gpu = f"; GPU {m['gpu']}" if m["gpu"] else "; no GPU"
    load = " / ".join(f"{x:.2f}" for x in m["load_avg"])
    return (
        f"{m['cpu']}, {m['cores']} cores usable (of {m['cpu_count']}){gpu}; load average "
        f"{load} over 1, 5, 15 min when measured; torch {m['torch']} with "
        f"{m['torch_threads']} intra-op thread(s), Python {m['python']}"
    )


def engine_revision() -> str:
    """The engine code that ran: git commit of the imported `engine` package, dirty or not."""
    import engine

    root = Path(engine.__file__).resolve().parents[1]
    try:
        rev = _git(root, "rev-parse", "--short", "HEAD").strip()
        dirty = _git(root, "status", "--porcelain", "--", "engine", "kernels")
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"commit {rev}" + (" with uncommitted changes in engine/ or kernels/" if dirty else "")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout
