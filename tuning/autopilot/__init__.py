"""The SLO autopilot's decisions: targets and bounds, the moves it weighs, when to apply."""
