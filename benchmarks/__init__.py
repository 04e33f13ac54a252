"""The benchmarks, each a module run from the repository root as `python -m benchmarks.ROOM.NAME`
(`--quick` for a smoke run); each writes its own section of benchmarks/RESULTS.md.

Rooms: `harness` (what every benchmark shares: the machine, RESULTS.md sections, targets,
server subprocesses), `speed` (the engine's speed: offline, serving, layers, threads),
`peer` (against llama.cpp), `control` (the twin, the autopilot, attribution), `dashboard`
(the dashboard in a browser) and `gpu` (the GPU kernels and engine, `gpu/run_all.sh`).
The project's packages never import them.
"""
