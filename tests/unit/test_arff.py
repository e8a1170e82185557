"""dslide.datasets.arff: Mulan ARFF files against hand-built expected matrices, and every malformed-input error."""

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.datasets.arff import read_arff
from dslide.io.data import XMCFormatError, read_xmc

DATA = Path(__file__).resolve().parents[1] / "data"


def csr(rows, n_cols):
    """csr float32 from a list of {column: value} dicts (the expected matrix, built by hand)."""
    M = sp.lil_matrix((len(rows), n_cols), dtype=np.float32)
    for i, row in enumerate(rows):
        for j, v in row.items():
            M[i, j] = v
    return M.tocsr()


def assert_csr_equal(got, expected):
    assert got.format == "csr" and got.dtype == np.float32
    assert got.shape == expected.shape
    assert got.has_sorted_indices
    for i in range(got.shape[0]):  # sorted, no duplicates, no explicit zeros
        idx = got.indices[got.indptr[i]:got.indptr[i + 1]]
        assert np.all(np.diff(idx) > 0)
    assert np.all(got.data != 0)
    assert np.array_equal(got.indptr, expected.indptr)
    assert np.array_equal(got.indices, expected.indices)
    assert np.array_equal(got.data, expected.data)


# arff_sparse.arff catches: comments (whole-line and trailing), blank lines, mixed-case
# keywords, quoted names with blanks and '%', '{0, 1}' with a blank, an empty row '{}',
# unsorted indices, an explicit 0 (not stored), a quoted value, a leading blank.
SPARSE_X = csr([{0: 1.5, 3: 1.0}, {1: 2.0}, {}, {2: -0.25}, {1: 3.0, 2: np.float32(1e-3)}], 4)
SPARSE_Y = csr([{0: 1}, {1: 1}, {}, {1: 1}, {0: 1}], 2)


def test_sparse_rows():
    data, features, labels = read_arff(DATA / "arff_sparse.arff", 2, names=True)
    assert_csr_equal(data.X, SPARSE_X)
    assert_csr_equal(data.Y, SPARSE_Y)
    assert features == ["f0", "word two", "f%2", "f3"]
    assert labels == ["label a", "lab_b"]


def test_gzip_is_recognised_by_its_magic_bytes(tmp_path):
    # Catches: a gzip file whose name does not end in .gz.
    path = tmp_path / "sparse.arff"
    with open(DATA / "arff_sparse.arff", "rb") as f, gzip.open(path, "wb") as g:
        shutil.copyfileobj(f, g)
    data = read_arff(path, 2)
    assert_csr_equal(data.X, SPARSE_X)
    assert_csr_equal(data.Y, SPARSE_Y)


def test_dense_rows():
    # arff_dense.arff catches: dense rows, real/integer types, 'E+2' exponents, '?' in a
    # feature (read as 0), quoted values and blanks around values.
    data = read_arff(DATA / "arff_dense.arff", 3)
    assert_csr_equal(data.X, csr([{0: 0.5, 1: 2.0, 2: -125.0}, {}, {0: 3.0, 1: 7.0, 2: np.float32(1e-3)}], 3))
    assert_csr_equal(data.Y, csr([{0: 1, 2: 1}, {}, {1: 1}], 3))


def test_labels_named_by_mulan_xml_anywhere_in_the_file():
    # arff_labels_first.arff + .xml catch: labels first, a nested (hierarchical) XML with a
    # namespace, a quoted label name with a blank, sparse and dense rows in one file.
    data, features, labels = read_arff(DATA / "arff_labels_first.arff",
                                       labels_xml=DATA / "arff_labels_first.xml", names=True)
    assert features == ["w0", "w1"]
    assert labels == ["Sports", "Ball Games", "News"]
    assert_csr_equal(data.X, csr([{0: 0.5}, {1: 2.0}, {0: 1.0, 1: 1.0}], 2))
    assert_csr_equal(data.Y, csr([{0: 1, 1: 1}, {2: 1}, {}], 3))


def test_xml_and_n_labels_agree_when_labels_are_last(tmp_path):
    xml = tmp_path / "labels.xml"
    xml.write_text('<labels><label name="label a"/><label name="lab_b"/></labels>')
    by_xml = read_arff(DATA / "arff_sparse.arff", labels_xml=xml)
    assert_csr_equal(by_xml.X, SPARSE_X)
    assert_csr_equal(by_xml.Y, SPARSE_Y)


# Each malformed fixture: (file, line of the error, what the message must say). The
# comment says what it catches.
BAD = [
    # a sparse index past the last attribute
    ("arff_bad_index_range.arff", 7, r"expected an attribute index below 3, got '3'"),
    # the same index twice in one sparse row
    ("arff_bad_duplicate_index.arff", 6, r"expected each attribute index at most once per row, got '0'"),
    # a dense row with too few values
    ("arff_bad_dense_count.arff", 7, r"expected 3 comma-separated values .*got 2 values"),
    # a label value outside {0,1}
    ("arff_bad_label_value.arff", 6, r"expected one of \{0,1\} for attribute 'y', got '2'"),
    # a feature value that is not a number
    ("arff_bad_number.arff", 7, r"expected a finite number for attribute 'b', got 'abc'"),
    # a sparse row without its closing brace
    ("arff_bad_unclosed_row.arff", 6, r"expected a sparse row .* ending with '\}'"),
    # a sparse item without a value
    ("arff_bad_sparse_pair.arff", 6, r"expected 'index value' in a sparse row, got '2'"),
    # instance weights after a sparse row
    ("arff_bad_weights.arff", 6, r"instance weights \{w\} are not supported, got '\{2\}'"),
    # a missing value for a label
    ("arff_bad_missing_label.arff", 6, r"expected 0 or 1 for label 'y' .*got '\?'"),
    # a value beyond float32
    ("arff_bad_overflow.arff", 6, r"expected a value within float32 range for attribute 'a', got '1e39'"),
    # a string attribute
    ("arff_bad_type.arff", 3, r"expected attribute type numeric, real, integer or .* got 'string'"),
    # a misspelt keyword
    ("arff_bad_keyword.arff", 2, r"expected @relation, @attribute or @data, got '@atribute'"),
    # data rows without @data
    ("arff_bad_no_data.arff", 4, r"expected @data before the first data row, got '\{0'"),
    # an attribute name with an unclosed quote
    ("arff_bad_quote.arff", 2, r"expected a closing ' after the attribute name"),
    # a sparse row although an omitted label would mean 1 ({1,0})
    ("arff_bad_nonzero_default.arff", 6, r"attribute 'y' \(line 3\) declares \{1,0\}"),
]


@pytest.mark.parametrize("name, line, message", BAD, ids=[b[0] for b in BAD])
def test_malformed_input_names_file_line_and_token(name, line, message):
    path = DATA / name
    with pytest.raises(XMCFormatError, match=message) as err:
        read_arff(path, 1)
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert isinstance(err.value, ValueError)


def test_end_of_file_before_data(tmp_path):
    path = tmp_path / "header_only.arff"
    path.write_text("@relation r\n@attribute a numeric\n")
    with pytest.raises(XMCFormatError, match=r"header_only.arff: expected an @data line"):
        read_arff(path, 1)


def test_bad_arguments_and_label_files(tmp_path):
    path = DATA / "arff_sparse.arff"
    with pytest.raises(ValueError, match="give exactly one of n_labels .* and labels_xml"):
        read_arff(path)
    with pytest.raises(ValueError, match="give exactly one of"):
        read_arff(path, 2, labels_xml=DATA / "arff_labels_first.xml")
    with pytest.raises(ValueError, match=r"n_labels \(0\) must be an integer >= 1"):
        read_arff(path, 0)
    with pytest.raises(XMCFormatError, match=r"n_labels=7 but the file declares only 6 attributes"):
        read_arff(path, 7)
    # The XML names a label the ARFF does not have.
    with pytest.raises(XMCFormatError,
                       match=r"label\(s\) 'Sports', 'Ball Games', 'News' of .* are not attributes"):
        read_arff(path, labels_xml=DATA / "arff_labels_first.xml")
    broken = tmp_path / "broken.xml"
    broken.write_text("<labels><label name='a'></labels>")
    with pytest.raises(XMCFormatError, match=r"broken.xml:1: expected well-formed XML"):
        read_arff(path, labels_xml=broken)
    empty = tmp_path / "empty.xml"
    empty.write_text("<labels></labels>")
    with pytest.raises(XMCFormatError, match=r"expected <label name=.*found none"):
        read_arff(path, labels_xml=empty)


def test_bibtex_round_trip_through_arff(tmp_path, shared_data):
    # The real BibTeX training set written as a sparse Mulan ARFF (labels last) by a
    # plain writer here, then read back: the same matrices as read_xmc gives.
    ref = read_xmc(shared_data("bibtex_train.txt"), cache=False)
    n_f, n_l = ref.n_features, ref.n_labels
    lines = ["% BibTeX as Mulan ARFF", "@relation 'bibtex: -C -159'"]
    lines += [f"@attribute w{j} {{0,1}}" for j in range(n_f)]
    lines += [f"@attribute 'TAG {j}' {{0,1}}" for j in range(n_l)]
    lines.append("@data")
    for i in range(ref.n_points):
        xs = ref.X.indices[ref.X.indptr[i]:ref.X.indptr[i + 1]]
        ys = ref.Y.indices[ref.Y.indptr[i]:ref.Y.indptr[i + 1]]
        items = [f"{j} 1" for j in xs] + [f"{n_f + j} 1" for j in ys]
        lines.append("{" + ",".join(items) + "}")
    path = tmp_path / "bibtex.arff"
    path.write_text("\n".join(lines) + "\n")
    data, features, labels = read_arff(path, n_l, names=True)
    assert labels[0] == "TAG 0" and len(features) == n_f
    assert_csr_equal(data.X, ref.X)
    assert_csr_equal(data.Y, ref.Y)
