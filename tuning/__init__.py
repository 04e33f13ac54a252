"""The decision layer: the what-if twin (`twin`), latency attribution (`attribution`) and the
SLO autopilot (`autopilot`)."""
