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

from dslide.data import XMCData
from dslide.datasets import amazon670k, baskets, synthetic

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
