"""DecodeWindow: the window and cache bookkeeping of the decode loop, against a direct count of the cache."""

from __future__ import annotations

import itertools

import pytest

from kronos_core.predict.generation import DecodeWindow


@pytest.mark.parametrize("mode", ["recompute", "refill", "shift"])
def test_window_feeds_the_last_max_context_tokens_and_keeps_the_cache_within_capacity(mode: str) -> None:
    for history, pred_len, max_context in itertools.product((1, 3, 7, 12), (1, 4, 9, 15), (2, 5, 8, 13)):
        window = DecodeWindow(history, pred_len, max_context, mode)
        steps = [window.at(step) for step in range(pred_len)]
        held, capacity, positions = 0, 0, 0  # tokens in the cache, its size, positions given so far
        for index, at in enumerate(steps):
            end = history + index
            start = max(0, end - max_context)
            assert at.end == end and at.tokens.stop == end
            if at.refill:
                assert (at.tokens.start, at.drop_oldest) == (start, False)
                held, capacity, positions = end - start, at.capacity, end - start
                following = list(itertools.takewhile(lambda later: not later.refill, steps[index + 1:]))
                assert at.appends == len(following), (history, pred_len, max_context, index)
            else:
                assert mode != "recompute" and at.tokens.start == end - 1
                assert at.drop_oldest == (held == capacity)  # drop only a full cache, and always one
                held += 1 - at.drop_oldest
                positions += 1
            assert held <= capacity and held == end - start  # the cache holds as many tokens as the window
            if mode == "refill":  # exact: what the cache holds is the window, at positions from 0
                assert positions == end - start
        first_slide = max(1, max_context - history + 1)  # first step whose window starts later than the last
        assert sum(at.refill for at in steps) == {"recompute": pred_len, "shift": 1,
                                                  "refill": 1 + max(0, pred_len - first_slide)}[mode]
