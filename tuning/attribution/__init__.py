"""Per-request latency attribution: each request's TTFT and TPOT split by cause."""
