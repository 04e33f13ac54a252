"""moescope against llama.cpp on the same weights and precision (`llamacpp`), and where the
peer workload's time goes (`decode_steps`, `serve_overhead`)."""
