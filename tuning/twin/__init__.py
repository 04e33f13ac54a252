"""The what-if twin: a step-cost model fitted from telemetry and a simulator that drives the
real Scheduler and BlockManager on a simulated clock."""
