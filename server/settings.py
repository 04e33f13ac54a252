"""Server settings: what the app needs besides the engine loop."""

import os
from dataclasses import dataclass, field

from tuning.autopilot.settings import AutopilotSettings


@dataclass
class ServerSettings:
    """Limits, keys and telemetry options of one server.

    `max_prompt_tokens` / `max_tokens_limit` default to the model's context (`None`).
    `admin_key`, when set, is required for PATCH /api/knobs (and accepted everywhere).
    `db_url` is the session database (None: no session routes); `record` turns the recorder
    on, buffering up to `record_buffer` steps while the database is slow or gone.
    `whatif_horizon_s` is how long after an applied knob change the scorecard observes it.
    `autopilot` is the SLO autopilot's settings at start (off unless enabled).
    `fit_from` is a recorded session of this engine whose steps seed the live twin's cost model.
    """

    model_name: str = "synthetic:tiny"
    api_key: str | None = None
    admin_key: str | None = None
    max_prompt_tokens: int | None = None
    max_tokens_limit: int | None = None
    max_prompts: int = 16
    max_body_bytes: int = 1 << 20
    ws_buffer: int = 256
    metrics: bool = True
    metrics_interval_s: float = 0.5
    db_url: str | None = None
    record: bool = True
    record_buffer: int = 2048
    db_timeout_s: float = 5.0
    whatif_horizon_s: float = 60.0
    autopilot: AutopilotSettings = field(default_factory=AutopilotSettings)
    fit_from: str | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> "ServerSettings":
        """Keys from MOESCOPE_API_KEY / MOESCOPE_ADMIN_KEY unless given explicitly."""
        settings = cls(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
        settings.api_key = settings.api_key or os.environ.get("MOESCOPE_API_KEY") or None
        settings.admin_key = settings.admin_key or os.environ.get("MOESCOPE_ADMIN_KEY") or None
        return settings
