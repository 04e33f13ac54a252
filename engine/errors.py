"""Typed errors for callers' input: each names the field it is about, so no one parses text."""


class InvalidInput(ValueError):
    """A request, knob change or action refused because of a field's value (a 422 over HTTP)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Refused(InvalidInput):
    """A well-formed action that the engine's current state refuses (a 409 over HTTP)."""
