"""GPU measurements: the kernels against their roofline, the engine per backend, a step's host
time; `run_all.sh` runs them all and `report` writes their RESULTS.md section."""
