"""A shift in the load, told from the arrivals: phases like the autopilot benchmark's, Poisson
arrivals seeded, looked at every 2 s as the autopilot ticks."""

from cli.loadgen import parse_dist, poisson_arrivals
from tuning.twin.load_shift import (
    LONGER_PROMPTS,
    MORE_ARRIVALS,
    SHIFT_S,
    Arrival,
    Shift,
    longer_since,
    shift,
)


def poisson(rate: float, start: float, end: float, prompt: str, seed: int) -> list[Arrival]:
    """The load generator's seeded arrivals in [start, end), as (time, prompt length)."""
    out = poisson_arrivals(rate, end - start, parse_dist(prompt), parse_dist("fixed:16"), seed)
    return [(start + a.t, a.prompt_len) for a in out]


def detections(arrivals: list[Arrival], end: float) -> list[tuple[float, Shift]]:
    """(tick, shift) of each shift seen, ticking every 2 s and comparing with the arrivals since
    the last shift (at most 20 s before the latest), as the autopilot does."""
    since, out = 0.0, []
    for tick in range(2, int(end) + 1, 2):
        t = float(tick)
        seen = shift([a for a in arrivals if a[0] <= t], t, max(since, t - SHIFT_S - 20.0))
        if seen is not None:
            since = t
            out.append((t, seen))
    return out


def change(text: str, what: str) -> float:
    """How many times higher `what` ("arrivals", "mean prompt") is in `text`; 1 if absent."""
    if what not in text:
        return 1.0
    a, b = text.split(what)[1].split(",")[0].split()[0:3:2]
    return float(b) / float(a)


def test_steady_load_shows_no_shift() -> None:
    for seed in range(5):
        assert detections(poisson(2.5, 0, 300, "uniform:16:256", seed), 300) == []


def test_each_phase_change_is_seen_within_seconds_and_once() -> None:
    short, long = "uniform:16:256", "uniform:1024:1800"
    phases = [(2.5, short), (7.5, short), (1.2, long), (2.5, short)]
    arrivals = [
        a
        for i, (rate, prompt) in enumerate(phases)
        for a in poisson(rate, 75 * i, 75 * (i + 1), prompt, i)
    ]
    seen = detections(arrivals, 300)
    assert [int(t // 75) for t, _ in seen] == [1, 2, 3]
    assert [t % 75 for t, _ in seen] <= [SHIFT_S + 2] * 3, seen
    burst, longer, low = (s for _, s in seen)
    assert change(burst.text, "arrivals") >= 2 and change(burst.text, "mean prompt") == 1
    assert change(longer.text, "arrivals") <= 0.5 and change(longer.text, "mean prompt") >= 2
    assert change(low.text, "mean prompt") <= 0.5
    # what each brings: a queue for the burst, long chunks in decode steps for the long
    # prompts (fewer arrivals bring nothing), nothing new when the load lightens
    assert (burst.causes, longer.causes, low.causes) == (MORE_ARRIVALS, LONGER_PROMPTS, ())


def test_too_short_a_past_to_compare_with_shows_no_shift() -> None:
    busy = [(t / 10, 100) for t in range(100)]  # 10 req/s from 0 to 10 s
    assert shift(busy, 9.0, 0.0) is None  # 4 s before the latest 5: too short
    assert shift([(0.5, 100)] + busy[50:], 10.0, 0.0) == Shift(
        "arrivals 0.2 → 10.0 req/s", MORE_ARRIVALS
    )


def test_a_change_of_prompt_lengths_within_their_spread_is_no_shift() -> None:
    before = [(i * 0.5, 10 if i % 2 else 390) for i in range(18)]  # mean 200, spread wide
    assert shift(before + [(11.0, 400), (12.0, 420), (13.0, 410)], 14.0, 0.0) is None
    steady = [(i * 0.5, 200) for i in range(18)]  # no spread: any doubling is a shift
    got = shift(steady + [(11.0, 400), (12.0, 400), (13.0, 400)], 14.0, 0.0)
    assert got is not None and got.text.endswith("mean prompt 200 → 400 tokens")


def test_prompts_too_few_to_show_a_shift_still_say_what_a_shift_in_the_rate_brings() -> None:
    """Two long prompts in the latest 5 s are too few to call a shift alone (a prompt every
    2 s before, as now); after eight short prompts a second, the rate fell too, and they name
    what that shift brings."""
    slow = [(2.0 * i, 100 + i) for i in range(10)]  # one every 2 s, 0 to 18 s
    assert shift(slow + [(20.0, 1500), (22.0, 1400)], 23.9, 0.0) is None
    busy = [(t / 8, 100 + t % 50) for t in range(80)]  # 8 a second, 0 to 10 s
    fell = shift(busy + [(12.0, 1500), (14.0, 1400)], 15.0, 0.0)
    assert fell is not None and fell.text.startswith("arrivals 8.0 → 0.4 req/s, mean prompt ")
    assert fell.causes == LONGER_PROMPTS


def test_longer_prompts_after_a_shift_seen_on_the_rate_are_named_as_they_come() -> None:
    """Eight short prompts a second until 10 s, then a pause: at 14 s the rate has fallen
    and the latest 5 s hold only short prompts. The long prompts that come after it are
    what that shift brings, named from the first; those that were already named, or that
    are not longer, are not news."""
    busy = [(t / 8, 100 + t % 50) for t in range(80)]
    seen = shift(busy, 14.0, 0.0)
    assert seen == Shift("arrivals 8.0 → 1.6 req/s", ())
    assert longer_since(busy, 15.0, seen, 14.0, 0.0) is None  # nothing since
    named = longer_since(busy + [(14.5, 1400)], 15.0, seen, 14.0, 0.0)
    assert named is not None and named.causes == LONGER_PROMPTS
    assert named.text.startswith("arrivals 8.0 → 1.6 req/s, then mean prompt ")
    assert longer_since(busy + [(14.5, 1400)], 15.0, named, 14.0, 0.0) is None
    assert longer_since(busy + [(14.5, 10)], 15.0, seen, 14.0, 0.0) is None  # shorter
