"""The services that run inside the server process (live window, analysis process, twins,
scorecard, autopilot runner, reruns, telemetry fan-out, metrics), held in one ServerState."""
