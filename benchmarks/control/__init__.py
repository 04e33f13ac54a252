"""The control plane measured: the what-if twin's accuracy (`twin`, `live_twin`), the SLO
autopilot (`autopilot`) and what latency attribution costs (`attribution_cost`)."""
