"""A benchmark's goals: each script declares its TARGETS once, and checks and reports them."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A goal for one measure: at least `goal`, or at most it when lower is better."""

    text: str
    goal: float
    higher_is_better: bool = True

    def met(self, value: float) -> bool:
        """Whether `value` reaches the goal (NaN never does)."""
        return value >= self.goal if self.higher_is_better else value <= self.goal

    @property
    def bound(self) -> str:
        """`>= 1.8` or `<= 1.03`."""
        return f"{'>=' if self.higher_is_better else '<='} {self.goal:g}"

    def line(self, value: float, shown: str) -> str:
        """`- [met] text: shown (target >= goal)`, an entry of a report's list of targets."""
        mark = "met" if self.met(value) else "MISSED"
        return f"- [{mark}] {self.text}: {shown} (target {self.bound})"
