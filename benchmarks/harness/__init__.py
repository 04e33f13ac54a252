"""What every benchmark shares: the machine it ran on, its RESULTS.md section, its targets and
the server subprocesses it starts."""
