#!/usr/bin/env bash
# GPU measurements in one call (333 s on an H200, 2026-12-04), from the repository root:
#
#   bash benchmarks/gpu/run_all.sh             # on a CUDA machine; results go to $OUT
#   DRY_RUN=1 bash benchmarks/gpu/run_all.sh   # anywhere: tiny shapes on the CPU
#
# Steps: the kernel tests on the GPU; a quick autotune of the benchmark shapes into
# kernels/configs/grouped_gemm.json; copy bandwidth and bf16 matmul rate; our grouped GEMM
# against torch grouped_mm and a per-expert loop; MLA decode attention (ours against the torch
# absorbed and expanded paths, in bench.log only); the offline engine on a larger synthetic
# model per backend, and on triton again with the engine's overlap on (the dry run: torch),
# each against issue 47's targets (forward time >= 80% of the wall time, 3x the tok/s of
# 2026-12-04); the engine on synthetic:dsv2-lite (MLA) with and without decode graphs, overlap
# off (engine_mla.json, outside the table; the dry run tries the torch backend only); where a
# decode step's host time goes (cProfile, in bench.log); then one table (printed, and written
# to $OUT/gpu_results.md). Each step has a time limit, so that one that hangs leaves the others
# their time (about 9.5 minutes in all); the benchmarks write their JSON after each row, so a
# step cut short keeps its rows. Issue 47's CPU benchmark, benchmarks.speed.step_loop, runs
# synthetic:tiny on the CPU only (the engine's default device): it has no step here.
#
# The engine needs pydantic, which the GPU image lacks: put its wheels in .whl/ (ignored by
# git) and carry .whl; they are installed into /tmp/site here. To fetch them (Python 3.12):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 -d .whl pydantic==2.14.4 \
#     pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${DRY_RUN:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
DRY=()
if [ -n "${DRY_RUN:-}" ]; then DRY=(--dry-run); fi
status=0
step() {  # step LOG SECONDS CMD...: run CMD for at most SECONDS, log to $OUT/LOG, note a failure
    local log=$1 limit=$2
    shift 2
    echo "== $*" | tee -a "$OUT/$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" = 124 ]; then rc="124, over $limit s"; fi
    if [ "$rc" != 0 ]; then echo "!! failed ($rc): $*"; status=1; fi
}

echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) out=$OUT"
$PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__,
        "cuda", torch.cuda.is_available() and torch.cuda.get_device_name())'
if [ -z "${DRY_RUN:-}" ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    step tests.log 110 $PY -m pytest -q -ra -p no:cacheprovider tests/kernels
    for shape in "8 4096 14336 2" "128 2048 768 8"; do
        read -r e h i k <<<"$shape"
        step autotune.log 80 $PY -m kernels.autotune --experts "$e" --hidden "$h" --inter "$i" \
            --top-k "$k" --tokens 16 4096 --quick
    done
    cp kernels/configs/grouped_gemm.json "$OUT/"
fi
step bench.log 30 $PY -m benchmarks.gpu.roofline "${DRY[@]}" --json "$OUT/roofline.json"
step bench.log 110 $PY -m benchmarks.gpu.moe_kernels "${DRY[@]}" --roofline "$OUT/roofline.json" \
    --json "$OUT/moe.json"
step bench.log 60 $PY -m benchmarks.gpu.mla_decode "${DRY[@]}"
# 170 s: the overlap arm added a warm-up and a run of about 5 s each to the 140 s allowed before
step bench.log 170 $PY -m benchmarks.gpu.engine_throughput "${DRY[@]}" --json "$OUT/engine.json"
# Triton's interpreter takes minutes over dsv2-lite's 64 experts, so the dry run checks the
# option with the torch backend
MLA=(--backends triton triton-eager --requests 128 --json "$OUT/engine_mla.json")
if [ -n "${DRY_RUN:-}" ]; then MLA=(--backends torch); fi
MLA+=(--overlap)  # none: the step's 120 s hold no third engine
step bench.log 120 $PY -m benchmarks.gpu.engine_throughput "${DRY[@]}" --model synthetic:dsv2-lite \
    "${MLA[@]}"
step bench.log 60 $PY -m benchmarks.gpu.step_profile "${DRY[@]}"
step bench.log 20 $PY -m benchmarks.gpu.report --roofline "$OUT/roofline.json" \
    --moe "$OUT/moe.json" --engine "$OUT/engine.json" --out "$OUT/gpu_results.md"
exit $status
