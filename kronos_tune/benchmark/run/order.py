"""Which side of a paired round runs first: seeded, random, and counterbalanced.

The block that runs second in a round follows the other worker's block and
runs slower (on this 2-core VM by ~1% each way: the rounds a trial led gave
ratios 1.5-3% lower than the rounds the baseline led, in every comparison of
a day's runs). A coin per round leads unevenly (25 of 39 rounds for one seed),
and that slowness is then charged to one side. So the coin is thrown once per
pair of rounds and the second round of the pair mirrors the first: each side
leads equally often, and the order still cannot line up with a periodic load.
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def trial_leads(seed: str) -> Iterator[bool]:
    """Round by round, whether the trial's block runs first (an endless, reproducible sequence for `seed`)."""
    rng = random.Random(seed)
    while True:
        lead = rng.random() < 0.5
        yield lead
        yield not lead
