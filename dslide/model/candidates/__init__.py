"""Where an LSH layer's candidate neurons come from, and their upkeep.

A candidate source gives, for a training batch, the sorted union of the
neurons its tables retrieve for the batch's inputs (at most `per_sample` per
input); the layer scores that union for the whole batch as one shared block,
so candidates cost what random neurons cost (one BLAS product).

    anchor             AnchorCandidates (candidates/anchor.py; the default):
                       query-side k-means anchors over the layer's inputs, each
                       bucket the neurons scoring highest at its anchor
                       (lsh.anchors). The anchors learn online from every
                       training batch; the buckets are refilled from the current
                       weights on a schedule.
    dwta, srp, wta     HashCandidates (candidates/hashing.py): SLIDE's item
                       hashing, neurons hashed into tables whose buckets hold
                       exactly their neurons (lsh.CompactTables; lsh.capacity = 0,
                       the default) or fixed-capacity ones (lsh.HashTables),
                       re-hashed and rebuilt on a schedule.

Every source speaks the protocol of `CandidateSource` (candidates/base.py); the
layer calls nothing else. A new source is one module here, its entry in `SOURCES`
and its name in dslide.config.FAMILIES (docs/architecture.md).

Schedules: a period starts at `lsh.rehash_every` steps and grows by
`lsh.growth` after each use (weights settle as training goes on; SLIDE,
Chen et al. 2020). Item hashing also rebuilds every `lsh.rebuild_every` steps
(growing likewise).
"""

from __future__ import annotations

from dslide.config import FAMILIES, LSHConfig
from dslide.model.candidates.anchor import AnchorCandidates
from dslide.model.candidates.base import CandidateSource, Schedule
from dslide.model.candidates.hashing import HashCandidates

#: lsh.family -> its source: one for each name of dslide.config.FAMILIES, which validates lsh.family
SOURCES = {"anchor": AnchorCandidates, "dwta": HashCandidates, "srp": HashCandidates, "wta": HashCandidates}
if tuple(SOURCES) != FAMILIES:
    raise RuntimeError(f"dslide.model.candidates.SOURCES has {', '.join(SOURCES)} but dslide.config.FAMILIES (the "
                      f"names lsh.family takes) has {', '.join(FAMILIES)}: register a source for each name there")


def make_candidates(lc: LSHConfig, d_in: int, n_local: int, per_sample: int, seeds: tuple):
    """The candidate source of an LSH layer (`lc.family`)."""
    return SOURCES[lc.family](d_in, n_local, per_sample, lc, seeds)


__all__ = ["SOURCES", "AnchorCandidates", "CandidateSource", "HashCandidates", "Schedule", "make_candidates"]
