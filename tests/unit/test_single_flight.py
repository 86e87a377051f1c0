"""features.sdk.fallback.SingleFlight: who shares a finished fetch and for how long it is kept."""

from __future__ import annotations

import time

from features.sdk.fallback import SingleFlight


def test_a_caller_whose_read_began_before_the_fetch_finished_shares_it_after_a_long_stall() -> None:
    """Hundreds of threads in one process can stall a caller about a second between its
    Redis read and its claim (the GIL's round robin); it must still share the fetch that
    finished after its read began, not query Postgres again."""
    flight = SingleFlight()
    since = time.monotonic()  # the stalled caller's Redis read began here
    mine, theirs = flight.claim(["k"], since)
    assert mine == ["k"] and not theirs
    flight.resolve({"k": "row"})
    flight._forget(time.monotonic() + 5.0)  # five seconds later: still remembered
    mine, theirs = flight.claim(["k"], since)
    assert not mine and theirs["k"].value == "row"


def test_a_caller_whose_read_began_after_the_fetch_finished_fetches_itself() -> None:
    flight = SingleFlight()
    flight.claim(["k"], time.monotonic())
    flight.resolve({"k": "row"})
    later = time.monotonic() + 0.001  # its Redis read could have seen the fill
    mine, theirs = flight.claim(["k"], later)
    assert mine == ["k"] and not theirs


def test_finished_entries_are_forgotten_after_the_linger() -> None:
    flight = SingleFlight(linger_s=10.0)
    since = time.monotonic()
    flight.claim(["a", "b"], since)
    flight.resolve({"a": 1, "b": 2})
    flight._forget(time.monotonic() + 10.5)
    assert not flight._entries and not flight._finished  # memory is bounded by the linger
    mine, _ = flight.claim(["a"], since)
    assert mine == ["a"]
