"""The engine's speed on the CPU: offline throughput, online serving, one MoE layer, the
forward pass, expert parallelism, threads, the GIL and the session recorder."""
