"""dslide.rng, SplitMix64's one home, against a pure-Python SplitMix64 and its published outputs;
the hash tables' and the synthetic data's streams draw exactly from it."""

import numpy as np
import pytest

from dslide import rng

MASK = (1 << 64) - 1


def _splitmix64(seed: int, n: int) -> list[int]:
    """Reference SplitMix64 (Steele, Lea, Flood 2014; Vigna's splitmix64.c), in Python integers."""
    out, s = [], seed
    for _ in range(n):
        s = (s + 0x9E3779B97F4A7C15) & MASK
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(z ^ (z >> 31))
    return out


def test_the_reference_gives_splitmix64s_published_outputs():
    assert _splitmix64(1234567, 5) == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                                       4593380528125082431, 16408922859458223821]
    assert _splitmix64(0, 1) == [0xE220A8397B1DCDAF]


@pytest.mark.parametrize("seed", [0, 1234567, MASK, 0x9E3779B97F4A7C15])
def test_splitmix_next_is_splitmix64_and_advances_its_slot_only(seed):
    state = np.array([7, seed, 11], dtype=np.uint64)
    got = [int(rng.splitmix_next(state, 1)) for _ in range(6)]
    assert got == _splitmix64(seed, 6)
    assert state[0] == 7 and state[2] == 11
    assert int(state[1]) == (seed + 6 * 0x9E3779B97F4A7C15) & MASK


def test_unit_keeps_the_top_53_bits():
    for z in (0, 1 << 11, MASK, 0x8000000000000000, 123456789123456789):
        assert rng.unit(np.uint64(z)) == (z >> 11) / 2.0**53
    assert rng.unit(np.uint64(MASK)) < 1.0


def test_counter_based_uniform_is_the_finaliser_of_key_and_counter():
    mix = lambda x: _splitmix64(x, 1)[0]  # noqa: E731  (mix64(x): the first output from state x)
    k = int(rng.stream_key(42, 3, 5))
    assert k == mix(mix(mix(mix(42) ^ 3)) ^ 5)
    for c in (0, 1, 1000, 2**40):
        assert rng.uniform(np.uint64(k), c) == (mix(k ^ mix(c)) >> 11) / 2.0**53


def test_the_hash_tables_reservoir_stream_draws_from_splitmix64():
    from dslide.lsh.tables import _rand_below

    state = np.array([5, 99], dtype=np.uint64)
    n = 1000
    got = [int(_rand_below(state, 1, n)) for _ in range(50)]
    assert got == [min(int((z >> 11) / 2.0**53 * n), n - 1) for z in _splitmix64(99, 50)]
    assert state[0] == 5


def test_the_synthetic_datas_stream_draws_from_splitmix64():
    from dslide.datasets.draws import _next, _uniform

    state = np.array([2024], dtype=np.uint64)
    ref = _splitmix64(2024, 4)
    assert int(_next(state)) == ref[0]
    assert _uniform(state) == (ref[1] >> 11) / 2.0**53
