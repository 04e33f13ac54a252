"""Expert-parallel ranks: rank 0 is the engine's process, ranks 1..N-1 follow its commands.

Either rank 0 spawns the others on this machine (and a watcher reports one that exits), or
`torchrun` started every rank (RANK / WORLD_SIZE / MASTER_ADDR in the environment, several
machines possible) and ranks other than 0 call `serve_rank`.
"""

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import threading
import time

import torch

from engine.config import EngineConfig
from engine.ep.group import EPGroup
from engine.ep.placement import Placement
from engine.model.loader import load_model
from engine.model.tokenizer import Tokenizer
from engine.runner import ModelRunner
from engine.window_pool import sized_cache


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_device(device: str, rank: int) -> str:
    """Each rank's device: its own GPU on CUDA, the CPU otherwise."""
    return f"cuda:{rank}" if device.startswith("cuda") else device


def model_runner(config: EngineConfig, group: EPGroup | None) -> tuple[ModelRunner, Tokenizer]:
    """Load the model on this rank, in a runner that holds this rank's experts."""
    device = group.device if group is not None else config.device
    torch.manual_seed(config.seed)
    model, tokenizer = load_model(
        config.model, config.dtype, device, config.seed, config.router_skew
    )
    cfg = model.cfg
    placement = Placement.contiguous(cfg.num_moe_layers, cfg.num_experts, config.parallel.ep_size)
    return ModelRunner(model, config.cache, device, placement, group), tokenizer


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started several, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
        return int(os.environ["RANK"])
    return None


def _join_torchrun(config: EngineConfig, rank: int) -> EPGroup:
    size = int(os.environ["WORLD_SIZE"])
    if size != config.parallel.ep_size:
        raise ValueError(
            f"torchrun started {size} processes but ep_size is "
            f"{config.parallel.ep_size}; pass --ep {size}"
        )
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = rank_device(config.device, local)
    return EPGroup(rank, size, "env://", config.parallel.timeout_s, device)


def serve_rank(config: EngineConfig) -> None:
    """A torchrun rank other than 0: load its experts and follow rank 0 until it stops."""
    rank = torchrun_rank()
    assert rank is not None and rank > 0
    config = sized_cache(config)  # the cache rank 0 sized: the same blocks in each pool
    _serve(config, _join_torchrun(config, rank))


def _serve(config: EngineConfig, group: EPGroup) -> None:
    try:
        model_runner(config, group)[0].serve()
    finally:
        group.close()


def _local_group(config: EngineConfig, rank: int, port: int) -> EPGroup:
    """Join the group of ranks on this machine, which rank 0 hosts on 127.0.0.1:port."""
    p = config.parallel
    return EPGroup(
        rank, p.ep_size, f"tcp://127.0.0.1:{port}", p.timeout_s, rank_device(config.device, rank)
    )


def rank_main(rank: int, config: EngineConfig, port: int, threads: int) -> None:
    """A spawned rank (see engine/ep/worker.py): join rank 0's group and follow it."""
    torch.set_num_threads(threads)
    _serve(config, _local_group(config, rank, port))


class Ranks:
    """Rank 0's view of the other ranks: its group membership and, if it started them, their
    processes (`python -m engine.ep.worker`, so they never re-run the caller's script; a rank
    started by torchrun shows its death as a failed collective)."""

    def __init__(self, config: EngineConfig) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.failure: str | None = None
        self._failed = threading.Event()
        self._closing = False
        if torchrun_rank() == 0:
            self.group = _join_torchrun(config, 0)
        else:
            self.group = self._spawn(config)
        self._watcher = threading.Thread(target=self._watch, name="moescope-ep-watch", daemon=True)
        self._watcher.start()

    def _spawn(self, config: EngineConfig) -> EPGroup:
        port = free_port()
        payload = pickle.dumps((config, port, torch.get_num_threads()))
        for rank in range(1, config.parallel.ep_size):
            proc = subprocess.Popen(
                [sys.executable, "-m", "engine.ep.worker", str(rank)], stdin=subprocess.PIPE
            )
            assert proc.stdin is not None
            proc.stdin.write(payload)
            proc.stdin.close()
            self.procs.append(proc)
        try:
            return self._join(config, port)
        except BaseException:
            self._stop_procs(0.0)
            raise

    def _join(self, config: EngineConfig, port: int) -> EPGroup:
        """Join the group, failing fast (not at the timeout) if a rank dies while starting."""
        box: list[EPGroup | BaseException] = []

        def join() -> None:
            try:
                box.append(_local_group(config, 0, port))
            except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
                box.append(exc)

        thread = threading.Thread(target=join, daemon=True)
        thread.start()
        while thread.is_alive():
            dead = self._dead()
            if dead:
                raise RuntimeError(f"{dead} while the expert-parallel group was starting")
            thread.join(0.05)
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _dead(self) -> str | None:
        """'expert-parallel rank K exited with code C' for the first rank that exited."""
        for rank, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                return f"expert-parallel rank {rank} exited with code {proc.returncode}"
        return None

    def _watch(self) -> None:
        while self.procs and not self._closing:
            dead = self._dead()
            if dead is not None:
                if not self._closing:
                    self.failure = dead
                    self._failed.set()
                return
            time.sleep(0.05)

    def wait_failure(self, timeout: float) -> str | None:
        """The failure, waiting up to `timeout` s for a rank's exit to be noticed."""
        if self.procs:
            self._failed.wait(timeout)
        return self.failure

    def _stop_procs(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self, timeout: float = 10.0) -> None:
        """Tell every rank to stop, wait for them, leave the group (once)."""
        if self._closing:
            return
        self._closing = True
        if self.failure is None:
            with contextlib.suppress(RuntimeError):  # a rank already gone
                self.group.send(None)
        self._stop_procs(timeout)
        self.group.close()
