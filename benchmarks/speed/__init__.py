"""The engine's speed on the CPU: offline throughput, online serving, one MoE layer, the
forward pass, expert parallelism, threads, the GIL, the session recorder and the step loop's
host work."""
