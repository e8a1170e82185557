"""XMC text I/O (dslide.io.data): every edge case of the format, the float parser
against Python's own, the writer's round trip, the binary cache, and the real
BibTeX / Amazon-670K files (skipped when ../shared/data is absent).

References are plain Python: str.split over the text, float(), fractions.
"""

import gzip
import hashlib
import os
import re
import shutil
import warnings
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.io import data as D
from dslide.io import xmc_cache as C
from dslide.io import xmc_parse as P
from dslide.io import xmc_write as W
from dslide.io.data import (XMCCacheWarning, XMCData, XMCFormatError, XMCFormatWarning, cache_path,
                         read_xmc, write_xmc)

FIXTURES = Path(__file__).resolve().parents[1] / "data"


def fixture(tmp_path, name, rename=None):
    """Copy tests/data/<name> into tmp_path (so caches never land in the repository)."""
    dst = tmp_path / (rename or name)
    shutil.copyfile(FIXTURES / name, dst)
    return dst


def reference_parse(text):
    """Plain-Python reading of XMC text: (header, [(labels set, {feature: float})])."""
    lines = text.replace("\r\n", "\n").split("\n")
    header = tuple(int(t) for t in lines[0].split())
    body = lines[1:]
    if body and body[-1] == "":
        body = body[:-1]  # the final newline ends the last line
    while body and not body[-1].strip() and len(body) > header[0]:
        body = body[:-1]
    points = []
    for line in body:
        toks = line.split(" ")
        labels = set()
        if toks and toks[0] and ":" not in toks[0]:
            labels = {int(t) for t in toks[0].split(",")}
            toks = toks[1:]
        feats = {}
        for t in toks:
            if t.strip():
                f, v = t.split(":")
                feats[int(f)] = float(v)
        points.append((labels, feats))
    return header, points


def assert_matches_reference(d: XMCData, text):
    header, points = reference_parse(text)
    assert d.X.shape == (len(points), header[1])
    assert d.Y.shape == (len(points), header[2])
    assert d.X.dtype == np.float32 and d.Y.dtype == np.float32
    for i, (labels, feats) in enumerate(points):
        row = slice(d.Y.indptr[i], d.Y.indptr[i + 1])
        assert list(d.Y.indices[row]) == sorted(labels)
        assert np.all(d.Y.data[row] == 1.0)
        row = slice(d.X.indptr[i], d.X.indptr[i + 1])
        assert list(d.X.indices[row]) == sorted(feats)
        assert list(d.X.data[row]) == [np.float32(feats[f]) for f in sorted(feats)]


def error_of(path, **kw):
    with pytest.raises(XMCFormatError) as e:
        read_xmc(path, **kw)
    return str(e.value)


# --------------------------------------------------------------------------- the format


def test_empty_label_field(tmp_path):
    # xmc_empty_labels.txt: a line starting with a blank, a line of only features,
    # a blank line in the middle (an empty point) and a line of only a label.
    p = fixture(tmp_path, "xmc_empty_labels.txt")
    d = read_xmc(p, cache=False)
    assert d.n_points == 5
    assert d.Y.toarray().tolist() == [[1, 0, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 1]]
    X = d.X.toarray()
    assert X.tolist() == [[0, 0.5, 0, 0, 2, 0], [1, 0, 0, 0, 0, 3], [0, 0, 0, 1.25, 0, 0],
                          [0] * 6, [0] * 6]
    assert_matches_reference(d, p.read_text())


def test_labels_after_a_leading_blank_are_not_labels(tmp_path):
    # The label field ends at the first blank: " 3,4 5:1" has no label field and a bad token.
    p = tmp_path / "lead.txt"
    p.write_text("1 10 5\n 3,4 5:1\n")
    assert error_of(p, cache=False) == f"{p}:2: expected 'feature:value', got '3,4'"


def test_header_count_disagrees_with_body(tmp_path):
    # xmc_header_mismatch.txt: the header says 5 points, the body has 3 lines.
    p = fixture(tmp_path, "xmc_header_mismatch.txt")
    msg = error_of(p, cache=False)
    assert msg.startswith(f"{p}:1: the header says 5 points but the file has 3 data lines")
    with pytest.warns(XMCFormatWarning, match="header says 5 points but the file has 3 data lines"):
        d = read_xmc(p, strict=False, cache=False)
    assert d.n_points == 3
    assert d.X.toarray().tolist() == [[0, 1, 0, 0], [0, 0, 2, 0], [0, 0, 0, 3]]


def test_more_lines_than_the_header_says(tmp_path):
    p = tmp_path / "more.txt"
    p.write_text("1 4 3\n0 1:1\n1 2:2\n")
    assert "the header says 1 points but the file has 2 data lines" in error_of(p, cache=False)
    with pytest.warns(XMCFormatWarning):
        assert read_xmc(p, strict=False, cache=False).n_points == 2


def test_real_amazon_sample_header_mismatch(shared_data):
    # The real file's header still says 153,025 points; it holds 512.
    p = shared_data("amazon670k_sample_512.txt")
    msg = error_of(p, cache=False)
    assert "153025" in msg and "512" in msg and msg.startswith(f"{p}:1:")
    with pytest.warns(XMCFormatWarning, match="153025.*512"):
        d = read_xmc(p, strict=False, cache=False)
    assert (d.n_points, d.n_features, d.n_labels) == (512, 135909, 670091)
    # Read off the first data line by hand: "382338,397323,586059 8059:2.000000 8577:21.961590 ..."
    assert list(d.Y[0].indices) == [382338, 397323, 586059]
    assert d.X[0, 8059] == np.float32(2.0) and d.X[0, 8577] == np.float32(21.961590)
    assert d.X[0, 8058] == 0
    # and the last one ends in "... 127578:2.584960 134183:70.494680\r\n"
    assert d.X[511, 134183] == np.float32(70.49468) and d.X[511, 127578] == np.float32(2.58496)
    text = p.read_text()
    assert d.X.nnz == sum(t.count(":") for t in text.splitlines()[1:])
    assert d.Y.nnz == sum(len(set(line.split(" ")[0].split(","))) for line in text.splitlines()[1:])


def test_feature_index_out_of_range(tmp_path):
    # xmc_feature_out_of_range.txt: feature 4 with n_features = 4, on line 3.
    p = fixture(tmp_path, "xmc_feature_out_of_range.txt")
    assert error_of(p) == f"{p}:3: feature index 4 out of range [0, 4) in '4:0.5'"
    assert not os.path.exists(cache_path(p))  # a failed read leaves no cache


def test_label_index_out_of_range(tmp_path):
    # xmc_label_out_of_range.txt: label 3 with n_labels = 3, on line 3.
    p = fixture(tmp_path, "xmc_label_out_of_range.txt")
    assert error_of(p) == f"{p}:3: label index 3 out of range [0, 3)"


def test_huge_index_does_not_overflow(tmp_path):
    p = tmp_path / "huge.txt"
    p.write_text("1 4 3\n0 99999999999999999999999:1\n")
    assert "feature index 99999999999999999999999 out of range [0, 4)" in error_of(p)
    p.write_text("1 4 3\n99999999999999999999999 1:1\n")
    assert "label index 99999999999999999999999 out of range [0, 3)" in error_of(p)


def test_malformed_token(tmp_path):
    # xmc_malformed_token.txt: '123-4.5' (a lost ':') on line 3, the spec's example.
    p = fixture(tmp_path, "xmc_malformed_token.txt")
    assert error_of(p) == f"{p}:3: expected 'feature:value', got '123-4.5'"


@pytest.mark.parametrize("line, what", [
    ("0 1:1 2:x", "expected 'feature:value', got '2:x'"),
    ("0 1:1 2:1.5.3", "expected 'feature:value', got '2:1.5.3'"),
    ("0 1:1 :3", "expected 'feature:value', got ':3'"),
    ("0 1:1 2:", "expected 'feature:value', got '2:'"),
    ("0 1:1 2:1e", "expected 'feature:value', got '2:1e'"),
    ("0 1:1 2:nan", "expected 'feature:value', got '2:nan'"),
    ("0 1:1 2:inf", "expected 'feature:value', got '2:inf'"),
    ("0 1:1 -2:1", "expected 'feature:value', got '-2:1'"),
    ("0 1:1 3", "expected 'feature:value', got '3'"),
    ("0 1:1 2:1,5", "expected 'feature:value', got '2:1,5'"),
    ("x 1:1", "expected labels 'l1,l2,...' or 'feature:value', got 'x'"),
    ("-1 1:1", "expected labels 'l1,l2,...' or 'feature:value', got '-1'"),
    ("0,,2 1:1", "expected labels 'l1,l2,...' (comma-separated indices), got '0,,2'"),
    ("0,2, 1:1", "expected labels 'l1,l2,...' (comma-separated indices), got '0,2,'"),
    ("0,2:1 1:1", "expected labels 'l1,l2,...' (comma-separated indices), got '0,2:1'"),
    ("0 1:1e39", "value in '1:1e39' is not a finite float32 (|value| <= 3.4028235e38)"),
    ("0 1:-4e38", "value in '1:-4e38' is not a finite float32 (|value| <= 3.4028235e38)"),
    ("0 1:1\r2:3", "expected '\\r' only right before '\\n' (line end), got a lone '\\r'"),
])
def test_malformed_tokens_name_line_and_token(tmp_path, line, what):
    p = tmp_path / "bad.txt"
    p.write_bytes(f"2 10 5\n1 3:1\n{line}\n".encode())
    assert error_of(p) == f"{p}:3: {what}"


def test_duplicate_features_rejected(tmp_path):
    # xmc_duplicate_feature.txt: feature 1 twice in line 2 (rejected, not summed).
    p = fixture(tmp_path, "xmc_duplicate_feature.txt")
    assert error_of(p) == (f"{p}:2: feature index 1 appears more than once in the line "
                           "(duplicates are rejected)")


def test_duplicate_labels_collapsed(tmp_path):
    # xmc_duplicate_label.txt: '3,1,3' and '4,4': labels are a set, also sorted.
    p = fixture(tmp_path, "xmc_duplicate_label.txt")
    d = read_xmc(p)
    assert d.Y.indptr.tolist() == [0, 2, 3]
    assert d.Y.indices.tolist() == [1, 3, 4]
    assert d.Y.data.tolist() == [1, 1, 1]


def test_unsorted_features_are_sorted(tmp_path):
    p = tmp_path / "unsorted.txt"
    p.write_text("2 10 5\n2,0 7:7 1:1 4:4\n1 9:9 0:0.5\n")
    d = read_xmc(p)
    assert d.X.indices.tolist() == [1, 4, 7, 0, 9]
    assert d.X.data.tolist() == [1, 4, 7, 0.5, 9]
    assert d.Y.indices.tolist() == [0, 2, 1]
    assert d.X.has_sorted_indices and d.Y.has_sorted_indices
    d.X.has_sorted_indices = False  # make scipy check for itself
    d.X.sort_indices()
    assert d.X.indices.tolist() == [1, 4, 7, 0, 9]


def test_crlf_line_ends(tmp_path):
    # xmc_crlf.txt: the same data as xmc_lf.txt with \r\n line ends (as the Amazon file).
    assert b"\r\n" in (FIXTURES / "xmc_crlf.txt").read_bytes()  # not converted by git
    a = read_xmc(fixture(tmp_path, "xmc_crlf.txt"))
    b = read_xmc(fixture(tmp_path, "xmc_lf.txt"))
    assert (a.X != b.X).nnz == 0 and (a.Y != b.Y).nnz == 0
    assert a.X.shape == (3, 10) and a.X.nnz == 5 and a.X[2, 3] == np.float32(1.25)


def test_gzip_detected_by_magic_bytes(tmp_path):
    # xmc_lf.txt.gz: gzip of xmc_lf.txt; read both under its own name and under a .txt name.
    plain = read_xmc(fixture(tmp_path, "xmc_lf.txt"))
    for name in ("xmc_lf.txt.gz", "disguised.txt"):
        d = read_xmc(fixture(tmp_path, "xmc_lf.txt.gz", rename=name))
        assert (d.X != plain.X).nnz == 0 and (d.Y != plain.Y).nnz == 0
        assert d.X.shape == plain.X.shape and d.Y.shape == plain.Y.shape


def test_gzip_error_positions_refer_to_the_text(tmp_path):
    p = tmp_path / "bad.gz"
    p.write_bytes(gzip.compress(b"2 10 5\n1 3:1\n0 1:1 7:?\n"))
    assert error_of(p) == f"{p}:3: expected 'feature:value', got '7:?'"


def test_truncated_gzip(tmp_path):
    p = tmp_path / "cut.txt.gz"
    p.write_bytes(gzip.compress(b"2 10 5\n1 3:1\n0 1:1 7:2\n")[:-12])
    assert error_of(p).startswith(f"{p}: corrupt or truncated gzip data (")


def test_last_line_without_newline(tmp_path):
    # xmc_no_final_newline.txt: xmc_lf.txt minus its last '\n'.
    a = read_xmc(fixture(tmp_path, "xmc_no_final_newline.txt"))
    b = read_xmc(fixture(tmp_path, "xmc_lf.txt"))
    assert (a.X != b.X).nnz == 0 and (a.Y != b.Y).nnz == 0 and a.X.shape == b.X.shape


def test_last_line_cut_mid_token(tmp_path):
    # xmc_truncated_mid_token.txt: ends in '3 5:' (a download cut short).
    p = fixture(tmp_path, "xmc_truncated_mid_token.txt")
    assert error_of(p) == (f"{p}:4: expected 'feature:value', got '5:' "
                           "(the last line has no newline: is the file truncated?)")


def test_trailing_blank_lines_ignored(tmp_path):
    # xmc_trailing_blank_lines.txt: xmc_lf.txt plus blank (and blank-looking) lines.
    a = read_xmc(fixture(tmp_path, "xmc_trailing_blank_lines.txt"))  # strict: no complaint
    b = read_xmc(fixture(tmp_path, "xmc_lf.txt"))
    assert (a.X != b.X).nnz == 0 and a.X.shape == b.X.shape == (3, 10)


def test_trailing_blank_lines_as_empty_points_the_header_needs(tmp_path):
    p = tmp_path / "tail.txt"
    p.write_text("4 10 5\n0 1:1\n\n\n\n\n")  # header needs 3 empty points; the 4th blank is padding
    d = read_xmc(p)
    assert d.X.shape == (4, 10) and d.X.indptr.tolist() == [0, 1, 1, 1, 1]


def test_header_counts_too_large(tmp_path):
    p = tmp_path / "h.txt"
    p.write_text("1 99999999999999999999 5\n0 1:1\n")
    assert error_of(p) == f"{p}:1: header counts must be < 2**62, got '1 99999999999999999999 5'"


@pytest.mark.parametrize("header", ["", "3 10", "3 10 5 1", "a 10 5", "-3 10 5", "3.0 10 5",
                                    "3,10,5", "+3 10 5"])
def test_bad_header_names_line_1(tmp_path, header):
    p = tmp_path / "h.txt"
    p.write_text(header + "\n0 1:1\n" if header else "")
    msg = error_of(p)
    assert msg.startswith(f"{p}:1: expected header 'n_points n_features n_labels' "
                          "(three non-negative integers), got ")


def test_empty_dataset(tmp_path):
    # xmc_empty_dataset.txt: header '0 10 5' and nothing else.
    d = read_xmc(fixture(tmp_path, "xmc_empty_dataset.txt"))
    assert d.X.shape == (0, 10) and d.Y.shape == (0, 5) and d.X.nnz == 0 and d.Y.nnz == 0
    assert d.X.indptr.tolist() == [0] and d.Y.indptr.tolist() == [0]
    q = tmp_path / "empty_again.txt"
    write_xmc(q, d.X, d.Y)
    assert q.read_text() == "0 10 5\n"
    p = tmp_path / "no_newline.txt"
    p.write_text("0 10 5")
    assert read_xmc(p).X.shape == (0, 10)


def test_tabs_and_repeated_blanks_separate_tokens(tmp_path):
    p = tmp_path / "tabs.txt"
    p.write_text("1 10 5\n1,2\t3:1  4:2 \t\n")
    d = read_xmc(p)
    assert d.X.toarray()[0].tolist() == [0, 0, 0, 1, 2, 0, 0, 0, 0, 0]
    assert d.Y.indices.tolist() == [1, 2]


def test_signed_tiny_and_extreme_values(tmp_path):
    values = ["-2.5", "+3", "0", "-0.0", ".5", "5.", "1E+2", "1e-50", "1e-40",
              "1.17549435e-38", "3.4028235e38", "-3.4028235e38", "0.000123", "007.25",
              "0.1000000000000000000000000001", "123456789012345678901234567890",
              "1" + "0" * 300 + "e-300", "0." + "0" * 300 + "15e300"]
    p = tmp_path / "v.txt"
    tokens = " ".join(f"{i}:{v}" for i, v in enumerate(values))
    p.write_text(f"1 {len(values)} 1\n0 {tokens}\n")
    got = read_xmc(p).X.toarray()[0]
    want = [float(np.float32(float(v))) for v in values]
    want[7] = want[8] = 0.0  # below the smallest normal float32: flushed, not denormal
    assert got.tolist() == want
    assert got[8] == 0 and not np.signbit(got[7])


# --------------------------------------------------------------------------- the float parser


def nearest_f32_ulps(s, got):
    """How many float32 steps `got` is from the float32 nearest to decimal s (exact arithmetic)."""
    exact = Fraction(s)
    f = np.float32(float(s))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    best = min(cands, key=lambda c: abs(Fraction(float(c)) - exact))
    if got == best:
        return 0
    lo, hi = sorted([float(best), float(got)])
    steps, x = 0, np.float32(lo)
    while float(x) < hi and steps < 5:
        x = np.nextafter(x, np.float32(np.inf))
        steps += 1
    return steps


def test_float_parser_within_one_ulp_of_nearest_float32(tmp_path):
    rng = np.random.default_rng(7)
    n = 6000
    mags = 10.0 ** rng.uniform(-37, 38, n)
    vals = mags * rng.uniform(1, 10, n) * np.where(rng.random(n) < 0.3, -1, 1)
    fmts = ["{:.6f}", "{!r}", "{:.9e}", "{:.3g}", "{:.17g}", "{:.20e}", "{:.2E}"]
    strs = []
    for i, v in enumerate(vals):
        if abs(v) >= 3.4e38 or abs(v) < 1.2e-38:
            v = 1.5 * (10.0 ** (i % 30 - 15))
        s = fmts[i % len(fmts)].format(float(v))
        if float(np.float32(float(s))) == 0.0 or not np.isfinite(np.float32(float(s))):
            s = repr(float(i) + 0.25)
        strs.append(s)
    # typical tf-idf-like values, as in the real files
    strs += [f"{v:.6f}" for v in rng.uniform(0, 700, 2000)]
    p = tmp_path / "floats.txt"
    width = 100
    rows = [strs[i:i + width] for i in range(0, len(strs), width)]
    with open(p, "w") as f:
        f.write(f"{len(rows)} {width} 1\n")
        for r in rows:
            f.write("0 " + " ".join(f"{j}:{s}" for j, s in enumerate(r)) + "\n")
    got = read_xmc(p, cache=False).X.data
    assert got.size == len(strs)
    ulps = np.array([nearest_f32_ulps(s, g) for s, g in zip(strs, got)])
    assert ulps.max() <= 1, [s for s, u in zip(strs, ulps) if u > 1][:5]
    assert np.mean(ulps == 0) >= 0.999  # off by one only next to float32 rounding midpoints


# --------------------------------------------------------------------------- the writer


def random_xmc(rng, n, n_features, n_labels, density=0.05):
    X = sp.random(n, n_features, density=density, format="csr", dtype=np.float64, random_state=rng)
    # values of every magnitude and sign that float32 holds, plus round numbers
    mags = 10.0 ** rng.uniform(-37, 38, X.nnz)  # times (-1, 1): denormals possible, removed below
    X.data = (mags * rng.uniform(-1, 1, X.nnz)).astype(np.float32).astype(np.float64)
    X.data[np.abs(X.data) < 1.2e-38] = 1.0  # read_xmc flushes float32 denormals to 0
    X.data[::7] = rng.integers(0, 50, X.data[::7].size)  # some explicit zeros, some integers
    Y = sp.random(n, n_labels, density=0.1, format="csr", dtype=np.float32, random_state=rng)
    Y.data[:] = 1
    return X.astype(np.float32), Y


def test_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(3)
    X, Y = random_xmc(rng, 300, 500, 40)
    X = sp.vstack([X, sp.csr_matrix((3, 500), dtype=np.float32)]).tocsr()  # empty points at the end
    Y = sp.vstack([Y, sp.csr_matrix((3, 40), dtype=np.float32)]).tocsr()
    Y.data[Y.indptr[5]:Y.indptr[6]] = 0  # a point without labels
    Y.eliminate_zeros()
    assert Y[5].nnz == 0 and X[5].nnz > 0
    for name in ("rt.txt", "rt.txt.gz"):
        p = tmp_path / name
        write_xmc(p, X, Y)
        assert p.read_bytes().startswith(b"\x1f\x8b" if name.endswith(".gz") else b"303 500 40\n")
        d = read_xmc(p)
        assert d.X.shape == X.shape and d.Y.shape == Y.shape
        for a, b in ((d.X, X), (d.Y, Y)):
            assert np.array_equal(a.indptr, b.indptr)
            assert np.array_equal(a.indices, b.indices)
            assert np.array_equal(a.data.view(np.uint32), b.data.view(np.uint32))  # bitwise
    assert sorted(os.listdir(tmp_path)) == ["rt.txt", "rt.txt.dslcache", "rt.txt.gz", "rt.txt.gz.dslcache"]


def test_round_trip_of_random_float32_bit_patterns(tmp_path):
    # Every normal float32 is equally likely here, whatever its exponent.
    rng = np.random.default_rng(13)
    bits = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32)
    v = bits.view(np.float32)
    v = v[np.isfinite(v) & (np.abs(v) >= np.float32(1.1754944e-38))]
    n = v.size // 100 * 100
    X = sp.csr_matrix(v[:n].reshape(-1, 100))
    assert X.nnz == n
    p = tmp_path / "bits.txt"
    write_xmc(p, X, sp.csr_matrix((X.shape[0], 1), dtype=np.float32))
    got = read_xmc(p, cache=False).X
    assert np.array_equal(got.data.view(np.uint32), X.data.view(np.uint32))
    assert np.array_equal(got.indices, X.indices)


def test_writer_text_is_exact(tmp_path):
    X = sp.csr_matrix(np.array([[0, 1.5, 0], [2.25, 0, 1e-3], [0, 0, 0]], dtype=np.float32))
    Y = sp.csr_matrix(np.array([[1, 0], [1, 1], [0, 0]], dtype=np.float32))
    p = tmp_path / "small.txt"
    write_xmc(p, X, Y)
    assert p.read_text() == "3 3 2\n0 1:1.5\n0,1 0:2.25 2:0.001\n\n"
    Y = sp.csr_matrix(np.array([[0, 0], [1, 1], [0, 0]], dtype=np.float32))
    write_xmc(p, X, Y)
    assert p.read_text() == "3 3 2\n 1:1.5\n0,1 0:2.25 2:0.001\n\n"


def test_writer_uses_shortest_round_trip_decimals(tmp_path):
    rng = np.random.default_rng(11)
    v = 10.0 ** rng.uniform(-37, 38, 3000) * rng.uniform(1, 10, 3000)
    v = v[v < 3.4e38].astype(np.float32)
    v = np.concatenate([v, np.float32([1, 0.1, 21.96159, 1e-7, 3.4028235e38, 1.1754944e-38,
                                       123456789, 1e10, 1e11, 2.0 ** -20, 7.5])])
    v = v[np.isfinite(v) & (v >= np.float32(1.1754944e-38))]
    X = sp.csr_matrix((v, np.arange(v.size), [0, v.size]), shape=(1, v.size))
    p = tmp_path / "short.txt"
    write_xmc(p, X, sp.csr_matrix((1, 1), dtype=np.float32))
    toks = p.read_text().split("\n")[1].split()
    assert len(toks) == v.size
    for tok, x in zip(toks, v):
        s = tok.split(":")[1]
        assert np.float32(float(s)) == x, (s, x)  # Python's correctly rounded parser agrees
        digits = re.sub(r"e.*|[.\-]", "", s).strip("0")
        shortest = re.sub(r"e.*|[.\-]", "", np.format_float_scientific(x, unique=True)).strip("0")
        assert len(digits) == len(shortest), (s, x)
        assert len(s) <= 16
    assert [t.split(":")[1] for t in toks[-11:]] == [
        "1", "0.1", "21.96159", "1e-07", "3.4028235e+38", "1.1754944e-38", "123456790",
        "10000000000", "1e+11", "9.536743e-07", "7.5"]


def test_writer_rejects_bad_input(tmp_path):
    p = tmp_path / "w.txt"
    X = sp.csr_matrix(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="X must be a scipy.sparse matrix"):
        write_xmc(p, np.ones((2, 3)), X)
    with pytest.raises(ValueError, match="X has 2 rows but Y has 3"):
        write_xmc(p, X, sp.csr_matrix((3, 4)))
    bad = X.copy()
    bad.data[1] = np.nan
    with pytest.raises(ValueError, match="nan .*finite"):
        write_xmc(p, bad, sp.csr_matrix((2, 4)))
    with pytest.raises(ValueError, match="inf .*finite"):
        write_xmc(p, sp.csr_matrix(np.float64([[1e300, 0, 0], [0, 0, 0]])), sp.csr_matrix((2, 4)))
    assert os.listdir(tmp_path) == []


def test_writer_canonicalises_and_converts(tmp_path):
    # duplicates summed, unsorted indices sorted, coo accepted, float64 written as float32
    X = sp.coo_matrix((np.float64([1, 2, 0.1]), ([0, 0, 1], [2, 2, 0])), shape=(2, 3))
    # unsorted label indices and a stored 0 (not a label)
    Y = sp.csr_matrix((np.float32([1, 1, 0]), [1, 0, 1], [0, 2, 3]), shape=(2, 2))
    p = tmp_path / "c.txt"
    write_xmc(p, X, Y)
    assert p.read_text() == "2 3 2\n0,1 2:3\n 0:0.1\n"


def test_write_is_atomic_and_leaves_no_tmp(tmp_path, monkeypatch):
    p = tmp_path / "a.txt"
    X = sp.csr_matrix(np.ones((2, 3), np.float32))
    Y = sp.csr_matrix(np.ones((2, 1), np.float32))
    write_xmc(p, X, Y)
    before = p.read_bytes()

    def boom(*args):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(W, "_format_rows", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_xmc(p, 2 * X, Y)
    assert p.read_bytes() == before  # the old file is untouched
    assert os.listdir(tmp_path) == ["a.txt"]
    assert oct(os.stat(p).st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode


@pytest.mark.parametrize("block", [1, 37, 700, 1 << 30])
def test_parsing_in_blocks_gives_the_same_data_and_reports_every_byte(tmp_path, monkeypatch, block):
    """The parse runs a block of lines at a time so that a bar can move: the result must not
    depend on where the blocks end (mid-line, at a line's end, one block), and the progress
    calls must add up to the file's size."""
    rng = np.random.default_rng(9)
    X, Y = random_xmc(rng, 150, 400, 30)
    p = tmp_path / "a.txt"
    write_xmc(p, X, Y)
    with open(p, "ab") as f:
        f.write(b"\n\n")  # trailing padding lines
    monkeypatch.setattr(P, "PARSE_BLOCK_BYTES", block)
    done = []
    got = read_xmc(p, cache=False, progress=done.append)
    assert same(got, XMCData(X, Y))
    assert sum(done) == os.path.getsize(p)
    longest = max(len(line) for line in p.read_bytes().split(b"\n")) + 1
    assert len(done) >= os.path.getsize(p) // (block + longest)  # a call ends at the first line's end past its block
    assert same(read_xmc(p, cache=False), got)  # and without a callback: one block


def test_an_error_in_a_later_block_names_its_line(tmp_path, monkeypatch):
    p = tmp_path / "a.txt"
    p.write_text("4 10 5\n0 1:1\n1 2:1\n2 3:1\n3 4:x\n")
    monkeypatch.setattr(P, "PARSE_BLOCK_BYTES", 3)
    with pytest.raises(XMCFormatError, match=r"a\.txt:5: expected 'feature:value', got '4:x'"):
        read_xmc(p, cache=False, progress=lambda n: None)


def test_write_in_many_chunks(tmp_path, monkeypatch):
    # The text must not depend on how the rows are cut into formatting chunks.
    rng = np.random.default_rng(5)
    X, Y = random_xmc(rng, 200, 300, 20)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_xmc(a, X, Y)
    monkeypatch.setattr(W, "_WRITE_CHUNK_BYTES", 700)  # a few rows per chunk, some rows alone
    write_xmc(b, X, Y)
    assert a.read_bytes() == b.read_bytes()
    assert same(read_xmc(b), XMCData(X, Y))


# --------------------------------------------------------------------------- the cache


def small_file(tmp_path, text="3 10 5\n0,2 1:0.5 4:2\n 0:1 9:3\n4 3:1.25\n"):
    p = tmp_path / "s.txt"
    p.write_text(text)
    return p


def same(a: XMCData, b: XMCData):
    for m, n in ((a.X, b.X), (a.Y, b.Y)):
        assert m.shape == n.shape
        for k in ("indptr", "indices", "data"):
            x, y = getattr(m, k), getattr(n, k)
            assert x.dtype == y.dtype and np.array_equal(x, y)
    return True


def test_cache_hit_gives_identical_arrays(tmp_path, monkeypatch):
    p = small_file(tmp_path)
    first = read_xmc(p)
    c = Path(cache_path(p))
    assert c.name == "s.txt.dslcache" and c.is_dir()
    assert sorted(os.listdir(c)) == sorted(k + ".npy" for k in ("key", *C._CACHE_KEYS))
    st = os.stat(p)
    key = np.load(c / "key.npy").tolist()
    assert key[:4] == [C.CACHE_VERSION, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    assert np.array(key[4:], dtype=np.int64).tobytes() == hashlib.sha256(p.read_bytes()).digest()
    # plain .npy files: what np.load reads is what the parse gave
    assert np.array_equal(np.load(c / "x_data.npy"), first.X.data)
    assert np.array_equal(np.load(c / "y_indices.npy"), first.Y.indices)

    def no_parse(*a, **k):
        raise AssertionError("parsed although the cache is valid")

    monkeypatch.setattr(D, "_parse", no_parse)
    second = read_xmc(p)
    assert same(first, second)
    assert second.X.has_sorted_indices and second.X.data.dtype == np.float32
    for a in (second.X.data, second.X.indices, second.X.indptr, second.Y.indices):
        assert _mapped(a), "read, not memory-mapped"
    second.X.data[0] = 42  # arrays are ordinary writable memory (copy-on-write)
    assert read_xmc(p).X.data[0] == np.float32(0.5)


def _mapped(a) -> bool:
    """Whether array a's memory is a file mapping (np.memmap somewhere down its base chain)."""
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = getattr(a, "base", None)
    return False


def test_cache_false_neither_reads_nor_writes(tmp_path):
    p = small_file(tmp_path)
    read_xmc(p, cache=False)
    assert not os.path.exists(cache_path(p))
    read_xmc(p)
    (Path(cache_path(p)) / "key.npy").write_bytes(b"garbage")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_xmc(p, cache=False)  # does not even look at it


@pytest.mark.parametrize("how", ["size", "mtime"])
def test_modified_source_invalidates_cache(tmp_path, how):
    p = small_file(tmp_path)
    assert read_xmc(p).X[0, 1] == np.float32(0.5)
    st = os.stat(p)
    if how == "size":
        p.write_text("3 10 5\n0,2 1:0.75 4:2\n 0:1 9:3\n4 3:1.25\n")
    else:  # same size, different bytes and mtime
        p.write_text("3 10 5\n0,2 1:0.7 4:2\n 0:1 9:3\n4 3:1.25\n")
        assert os.stat(p).st_size == st.st_size
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stale cache is silently replaced
        d = read_xmc(p)
    assert d.X[0, 1] == np.float32(0.75 if how == "size" else 0.7)
    assert np.load(Path(cache_path(p)) / "key.npy")[1:3].tolist() == [os.stat(p).st_size, os.stat(p).st_mtime_ns]
    assert sorted(os.listdir(tmp_path)) == ["s.txt", "s.txt.dslcache"]  # the stale one is gone


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "missing", "wrong_arrays", "pickle",
                                    "not_a_directory", "key_missing"])
def test_corrupt_cache_is_survived_and_rewritten(tmp_path, damage):
    p = small_file(tmp_path)
    good = read_xmc(p)
    c = Path(cache_path(p))
    if damage == "garbage":
        (c / "x_indices.npy").write_bytes(b"\x00not an npy file at all" * 10)
    elif damage == "truncated":
        raw = (c / "x_data.npy").read_bytes()
        (c / "x_data.npy").write_bytes(raw[: len(raw) - 3])
    elif damage == "empty":
        (c / "y_indptr.npy").write_bytes(b"")
    elif damage == "missing":
        (c / "y_indices.npy").unlink()
    elif damage == "wrong_arrays":  # valid .npy files with the right key but inconsistent arrays
        np.save(c / "x_indptr.npy", np.load(c / "x_indptr.npy")[:-1])
    elif damage == "pickle":
        np.save(c / "x_data.npy", np.array([object()], dtype=object), allow_pickle=True)
    elif damage == "not_a_directory":
        shutil.rmtree(c)
        c.write_bytes(b"a file where the cache directory belongs")
    else:
        (c / "key.npy").unlink()
    with pytest.warns(XMCCacheWarning, match="ignoring the unreadable cache"):
        d = read_xmc(p)
    assert same(d, good)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert same(read_xmc(p), good)  # rewritten: a clean hit now
    assert sorted(os.listdir(tmp_path)) == ["s.txt", "s.txt.dslcache"]  # no .tmp or .old left


def test_a_cache_written_meanwhile_for_the_same_source_is_kept(tmp_path):
    """Ranks of a node parse at once: the first complete cache wins, the others drop theirs."""
    p = small_file(tmp_path)
    read_xmc(p)
    c = Path(cache_path(p))
    inode = os.stat(c).st_ino
    arrays, st = D._parse(str(p), str(p))
    C._save_cache(str(c), st, arrays)  # a second writer for the same source
    assert os.stat(c).st_ino == inode
    assert sorted(os.listdir(tmp_path)) == ["s.txt", "s.txt.dslcache"]
    changed = SimpleNamespace(st_size=st.st_size, st_mtime_ns=st.st_mtime_ns + 1, st_ctime_ns=st.st_ctime_ns,
                              st_mode=st.st_mode, st_gid=st.st_gid)
    C._save_cache(str(c), changed, arrays)  # another key (the source changed): replaced
    assert os.stat(c).st_ino != inode
    assert np.load(c / "key.npy")[2] == st.st_mtime_ns + 1
    assert sorted(os.listdir(tmp_path)) == ["s.txt", "s.txt.dslcache"]


def test_the_single_file_cache_of_older_versions_is_removed(tmp_path):
    p = small_file(tmp_path)
    legacy = tmp_path / "s.txt.dslcache.npz"
    legacy.write_bytes(b"PK\x03\x04 an old cache")
    good = read_xmc(p)
    assert sorted(os.listdir(tmp_path)) == ["s.txt", "s.txt.dslcache"]
    assert same(read_xmc(p), good)


def test_no_tmp_left_behind(tmp_path):
    rng = np.random.default_rng(1)
    X, Y = random_xmc(rng, 50, 60, 7)
    p = tmp_path / "d.txt"
    write_xmc(p, X, Y)
    read_xmc(p)
    read_xmc(p)
    write_xmc(p, 2 * X, Y)  # the cache goes stale
    assert np.array_equal(read_xmc(p).X.data, (2 * X).data)
    assert sorted(os.listdir(tmp_path)) == ["d.txt", "d.txt.dslcache"]


def test_read_only_directory_skips_cache_silently(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    p = small_file(ro)
    ro.chmod(0o555)  # no write bit: left alone even when running as root
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            d = read_xmc(p)
        assert d.X.nnz == 5 and os.listdir(ro) == ["s.txt"]
    finally:
        ro.chmod(0o755)

    def denied(*a, **k):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(C.tempfile, "mkdtemp", denied)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_xmc(p)
    assert os.listdir(ro) == ["s.txt"]


def test_cache_keeps_the_strict_check(tmp_path):
    p = tmp_path / "m.txt"
    p.write_text("5 4 3\n0 1:1\n1 2:2\n")
    with pytest.warns(XMCFormatWarning):
        read_xmc(p, strict=False)  # caches the body
    assert os.path.exists(cache_path(p))
    assert "header says 5 points but the file has 2" in error_of(p)  # from the cache, still strict
    with pytest.warns(XMCFormatWarning):
        assert read_xmc(p, strict=False).n_points == 2


# --------------------------------------------------------------------------- real data


def test_real_bibtex_train(shared_data):
    p = shared_data("bibtex_train.txt")
    d = read_xmc(p, cache=False)  # never write beside the shared data
    assert (d.n_points, d.n_features, d.n_labels) == (4880, 1836, 159)
    lines = p.read_text().splitlines()
    assert d.X.nnz == sum(t.count(":") for t in lines[1:])
    assert d.Y.nnz == sum(len(line.split(" ")[0].split(",")) for line in lines[1:])
    # Read off the file by hand:
    # line 2: "3,23,61,63,76 0:1 5:1 6:1 20:1 33:1 ..."
    assert d.Y[0].indices.tolist() == [3, 23, 61, 63, 76]
    assert d.X[0, 0] == 1 and d.X[0, 5] == 1 and d.X[0, 6] == 1 and d.X[0, 20] == 1
    assert d.X[0, 1] == 0 and d.X[0, 4] == 0
    # line 3: "24,60,75,84,94,138 55:1 129:1 153:1 ..."
    assert d.Y[1].indices.tolist() == [24, 60, 75, 84, 94, 138]
    assert d.X[1].indices[:3].tolist() == [55, 129, 153]
    # the last line ends in "... 1697:1 1793:1 1813:1"
    assert d.X[4879].indices[-3:].tolist() == [1697, 1793, 1813]
    assert np.all(d.X.data == 1)
    assert_matches_reference(d, p.read_text())
