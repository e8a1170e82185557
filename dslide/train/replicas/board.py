"""The words of the replicas' board: int64 words on world rank 0 (dslide.comm.Board), changed
by the replicas' leaders only, with one-sided atomics.

    STATE    FROZEN (a global point is under way) | STOP      (dslide.train.replicas.schedule)
    DONE     mask of the replicas that have no step left      (schedule)
    COUNTER  the last global step dealt (partial mode)        (schedule deals, partial reads)
    PUB+g    replica g's latest complete version and the counter then (partial: `pub_word`)
"""

from __future__ import annotations

STATE, DONE, COUNTER, PUB = 0, 1, 2, 3
FROZEN = 1 << 62
STOP = 1 << 61
STEP_BITS = 40  # PUB word: version << STEP_BITS | counter


def pub_word(version: int, counter: int) -> int:
    return (int(version) << STEP_BITS) | int(counter)
