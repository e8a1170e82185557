"""The checks of single settings: each raises a ValueError naming the setting, the value and what is valid."""

from __future__ import annotations

import difflib
import math
from typing import Any


def _choice(name: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"{name} = {value!r} is not valid; choose one of {', '.join(map(repr, valid))}")


def _int_range(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} = {value!r} must be an integer")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} = {value} must be {bound}")


def _float_range(name: str, value: Any, lo: float, hi: float, lo_open=False, hi_open=False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} = {value!r} must be a number")
    lb = "(" if lo_open else "["
    hb = ")" if hi_open else "]"
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:  # NaN passes every comparison below
        raise ValueError(f"{name} = {value} must be a finite number in {lb}{lo}, {hi}{hb}")
    bad = value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi)
    if bad:
        raise ValueError(f"{name} = {value} must be in {lb}{lo}, {hi}{hb}")


def _bool(name: str, value: Any) -> bool:
    """true/false (a bool, or text in any case) or 1/0 (a number or its text); nothing else:
    a bare string such as "False" or "yes" would otherwise count as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError(f"{name} = {value!r} must be true or false (or 1 / 0)")


def _sequence(name: str, value: Any, what: str) -> tuple:
    """A list or tuple setting as a tuple; anything else (a number, a string) is an error."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise ValueError(f"{name} = {value!r} must be a list of {what}")


def _shard_weights(value):
    """() (even shares), "auto", or a tuple of positive floats; "even" and [] mean ()."""
    if isinstance(value, str):
        if value in ("auto", "even", ""):
            return () if value != "auto" else "auto"
        raise ValueError(f"shard_weights = {value!r} is not valid; give 'auto', 'even' or one positive "
                         f"number per rank of a replica (e.g. 2,1,1)")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,)
    try:
        weights = tuple(value)
    except TypeError:
        raise ValueError(f"shard_weights = {value!r} is not valid; give 'auto', 'even' or one positive "
                         f"number per rank of a replica (e.g. 2,1,1)") from None
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w < float("inf")):
            raise ValueError(f"shard_weights[{i}] = {w!r} must be a number > 0 (shares are in proportion "
                             f"to the weights)")
    return tuple(float(w) for w in weights)


def _unknown(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown configuration key {key!r}{hint} (valid keys: {', '.join(sorted(known))})"


# -- a setting's valid values, as the field table states them -------------------------------
#
# Each is called as check(name, value) and returns the value in the configuration's type (a
# ValueError otherwise); `text` says what is valid, for `dslide config show` and the docs' table.


class Int:
    """An integer in [lo, hi] (hi None: >= lo); pow2: a power of two."""

    def __init__(self, lo: int, hi: int | None = None, pow2: bool = False):
        self.lo, self.hi, self.pow2 = lo, hi, pow2

    def __call__(self, name, value):
        _int_range(name, value, self.lo, self.hi)
        if self.pow2 and value & (value - 1):
            raise ValueError(f"{name} = {value} must be a power of two (it is packed into code bits)")
        return value

    @property
    def text(self) -> str:
        bound = f">= {self.lo}" if self.hi is None else f"in [{self.lo}, {self.hi}]"
        return ("a power of two " if self.pow2 else "an integer ") + bound


class Float:
    """A finite number in [lo, hi], either end open."""

    def __init__(self, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False):
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open

    def __call__(self, name, value):
        _float_range(name, value, self.lo, self.hi, self.lo_open, self.hi_open)
        return value

    @property
    def text(self) -> str:
        return f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}{')' if self.hi_open else ']'}"


class Choice:
    """One of a few names."""

    def __init__(self, values):
        self.values = tuple(values)

    def __call__(self, name, value):
        _choice(name, value, self.values)
        return value

    @property
    def text(self) -> str:
        return "one of " + ", ".join(map(repr, self.values))


class Bool:
    """true or false (or 1 / 0, or their text)."""

    text = "true or false"

    def __call__(self, name, value):
        return _bool(name, value)


class Rule:
    """A check that is a function (a tuple, a table), with the text of what it takes."""

    def __init__(self, fn, text: str):
        self.fn, self.text = fn, text

    def __call__(self, name, value):
        return self.fn(name, value)
