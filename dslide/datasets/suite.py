"""The benchmark suite of synthetic data shapes: one registry of (generator family, preset).

Each family is a module with the same small interface: ``PRESETS`` (name ->
preset), ``get_preset(name)``, ``generate(preset, n_points, seed, split=...)``
and ``generate_split(preset, n_train, n_test, seed) -> (train, test)``, the
two splits drawn from one world (:mod:`dslide.datasets.synthetic`: a
prototype per label; :mod:`dslide.datasets.baskets`: topics and label
baskets; :mod:`dslide.datasets.amazon670k`: near-duplicates of products, the
label statistics of Amazon-670K).

A suite member is a name for (family, preset); its default size is
``SUITE_TRAIN`` training and ``SUITE_TEST`` test points whatever the preset's
own defaults, so every member of the suite has the same number of points.
"""

from __future__ import annotations

from collections import OrderedDict
from types import ModuleType

from dslide.datasets import amazon670k, baskets, synthetic
from dslide.datasets.stats import centroid_p_at_1
from dslide.io.data import XMCData

FAMILIES: tuple[ModuleType, ...] = (synthetic, baskets, amazon670k)

SUITE_TRAIN = 30_000
SUITE_TEST = 3_000

MEMBERS: "OrderedDict[str, tuple[ModuleType, str]]" = OrderedDict(
    [("amazon-like", (synthetic, "amazon-like")), ("amazon-tail", (synthetic, "amazon-tail"))]
    + [(name, (baskets, name)) for name in baskets.PRESETS]
    + [(name, (amazon670k, name)) for name in amazon670k.PRESETS]
)


def family_of(preset_name: str) -> ModuleType:
    """The generator module that defines the preset `preset_name` (a suite member or any preset)."""
    if preset_name in MEMBERS:
        return MEMBERS[preset_name][0]
    for family in FAMILIES:
        if preset_name in family.PRESETS:
            return family
    raise ValueError(f"unknown preset {preset_name!r}; valid presets: {', '.join(all_presets())}")


def all_presets() -> list[str]:
    """Every preset name of every family, suite members first."""
    names = list(MEMBERS)
    for family in FAMILIES:
        names += [n for n in family.PRESETS if n not in names]
    return names


def generate_member(name: str, n_train: int | None = None, n_test: int | None = None,
                    seed: int = 0) -> tuple[XMCData, XMCData]:
    """(train, test) of suite member `name`: SUITE_TRAIN / SUITE_TEST points unless given."""
    if name not in MEMBERS:
        raise ValueError(f"unknown suite member {name!r}; valid members: {', '.join(MEMBERS)}")
    family, preset = MEMBERS[name]
    n_train = SUITE_TRAIN if n_train is None else n_train
    n_test = SUITE_TEST if n_test is None else n_test
    return family.generate_split(preset, n_train, n_test, seed)


def generate_split(preset_name: str, n_train: int | None = None, n_test: int | None = None,
                   seed: int = 0) -> tuple[XMCData, XMCData]:
    """(train, test) of any family's preset at the preset's own default sizes unless given."""
    return family_of(preset_name).generate_split(preset_name, n_train, n_test, seed)


# --------------------------------------------------------------------------- statistics


def member_stats(train: XMCData, test: XMCData) -> dict:
    """The statistics docs/datasets.md tabulates for one member (plain Python numbers).

    points_per_label, labels_seen_1_5 and labels_seen_once are over the labels seen in
    train; top_label_share is the share of train points holding the most frequent label;
    centroid_p1 is dslide.datasets.stats.centroid_p_at_1 and top_label_p1 the P@1 of always
    predicting the most frequent train label.
    """
    import numpy as np

    freq = np.bincount(train.Y.indices, minlength=train.n_labels)
    seen = freq[freq > 0]
    top = int(np.argmax(freq))
    n = max(train.n_points, 1)
    return {
        "points": train.n_points,
        "features": train.n_features,
        "labels": train.n_labels,
        "labels_per_point": float(train.Y.nnz / n),
        "points_per_label": float(seen.mean()) if len(seen) else 0.0,
        "nnz_per_point": float(train.X.nnz / n),
        "top_label_share": float(freq[top] / n),
        "labels_seen": int(len(seen)),
        "labels_seen_once": float(np.mean(seen == 1)) if len(seen) else 0.0,
        "labels_seen_1_5": float(np.mean(seen <= 5)) if len(seen) else 0.0,
        "centroid_p1": centroid_p_at_1(train, test),
        "top_label_p1": float(np.mean(np.diff(test.Y[:, top].tocsr().indptr) > 0)) if test.n_points else 0.0,
    }


def main(argv=None) -> int:
    """python -m dslide.datasets.suite [--members a,b] [--points N] [--test-points N] [--seed S]:
    a markdown table of every member's statistics and generation time."""
    import argparse
    import time

    ap = argparse.ArgumentParser(prog="python -m dslide.datasets.suite", description=main.__doc__)
    ap.add_argument("--members", default=",".join(MEMBERS), help="comma-separated suite members")
    ap.add_argument("--points", type=int, default=SUITE_TRAIN)
    ap.add_argument("--test-points", type=int, default=SUITE_TEST)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    names = [m for m in args.members.split(",") if m]
    for m in names:
        if m not in MEMBERS:
            ap.error(f"unknown suite member {m!r}; valid members: {', '.join(MEMBERS)}")
    print("| member | points | features | labels | labels/point | points/label (seen) | nnz/point "
          "| top-label share | labels seen | seen once | seen 1-5 times | centroid P@1 | top-label P@1 "
          "| generation s |")
    print("|" + "---|" * 14)
    for m in names:
        family, preset = MEMBERS[m]
        family.generate(preset, 4, args.seed, split="warm-up")  # kernels loaded outside the timing
        family.build_world.cache_clear()
        t0 = time.perf_counter()
        train, test = generate_member(m, args.points, args.test_points, args.seed)
        dt = time.perf_counter() - t0
        s = member_stats(train, test)
        print(f"| {m} | {s['points']:,} | {s['features']:,} | {s['labels']:,} | {s['labels_per_point']:.2f} "
              f"| {s['points_per_label']:.2f} | {s['nnz_per_point']:.1f} | {100 * s['top_label_share']:.1f}% "
              f"| {s['labels_seen']:,} | {100 * s['labels_seen_once']:.0f}% | {100 * s['labels_seen_1_5']:.0f}% "
              f"| {s['centroid_p1']:.3f} | {s['top_label_p1']:.3f} | {dt:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
