"""Read the multi-label ARFF files of the Mulan collection into XMCData.

Mulan data sets (bibtex, delicious, mediamill, eurlex, ...) are ARFF files whose
attributes are the features followed by the labels; which attributes are labels
is given either by their number (the last ``n_labels`` attributes) or by Mulan's
XML label file (``<labels><label name="..."/>...</labels>``, possibly nested for
hierarchies: every ``label`` element counts).

What is read
============
* Header: ``@relation name``, then ``@attribute name type`` lines, then ``@data``.
  Keywords are case-insensitive. Names may be quoted with ``'`` or ``"`` (then
  they may hold blanks, ``%``, ``,`` and backslash escapes). Types:
  ``numeric``, ``real``, ``integer`` or a nominal list ``{v1,v2,...}`` whose
  values are numbers (``{0,1}`` for the labels); string, date and relational
  attributes, and nominal values that are not numbers, are rejected.
* Comments: ``%`` outside quotes starts a comment up to the end of the line;
  blank lines are ignored everywhere.
* Data rows, sparse ``{i v, j v, ...}`` (zero-based attribute indices, any
  order, each at most once; an omitted attribute is 0) or dense
  ``v1,v2,...`` (one value per attribute). Values may be quoted. ``?``
  (missing) is read as 0 for a feature and rejected for a label; instance
  weights (``{...}, {w}``) are rejected.
* A label value must be 0 or 1. A feature value must be a finite float32; it is
  stored as float32, and zeros (and values below the smallest normal float32,
  flushed to zero so that no denormals reach the kernels) are not stored.

Result: XMCData with X csr float32 [n_rows, n_features] (the non-label
attributes, in file order) and Y csr float32 [n_rows, n_labels] (the label
attributes, in file order), both with sorted indices and no explicit zeros.

Every malformed line raises :class:`dslide.io.data.XMCFormatError` (a ValueError)
as ``file:line: what was expected, got 'token'``.
"""

from __future__ import annotations

import gzip
import math
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dslide.io.data import XMCData, XMCFormatError

__all__ = ["read_arff"]

_FLT_MAX = 3.4028234663852886e38
_FLT_MIN_NORMAL = 1.1754943508222875e-38
_NUMERIC_TYPES = ("numeric", "real", "integer")
_QUOTES = "'\""
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "%": "%"}


@dataclass(frozen=True)
class _Attribute:
    name: str
    nominal: tuple[str, ...] | None  # declared values (unquoted); None for numeric
    line: int

    @property
    def default(self) -> float:
        """What an omitted value means in a sparse row: 0, or a nominal's first value."""
        return 0.0 if self.nominal is None else float(self.nominal[0])


class _Source:
    """Lines of a (possibly gzip) text file with their numbers, for error messages."""

    def __init__(self, path: str):
        self.path = path

    def lines(self):
        with open(self.path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    yield number, raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise XMCFormatError(f"{self.path}:{number}: expected UTF-8 text ({e.reason} "
                                         f"at byte {e.start})") from None

    def error(self, line: int, what: str, got: str | None = None) -> XMCFormatError:
        tail = "" if got is None else f", got {got!r}"
        return XMCFormatError(f"{self.path}:{line}: {what}{tail}")


# --------------------------------------------------------------------------- tokens


def _strip_comment(text: str) -> str:
    """text without a trailing ``% comment`` (a ``%`` inside quotes is kept)."""
    if "%" not in text:
        return text
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in _QUOTES:
            quote = c
        elif c == "%":
            return text[:i]
        i += 1
    return text


def _unquote(token: str, src: _Source, line: int) -> str:
    """A value or name without its quotes and escapes (unquoted tokens are returned as they are)."""
    if not token or token[0] not in _QUOTES:
        return token
    q = token[0]
    if len(token) < 2 or token[-1] != q:
        raise src.error(line, f"expected a closing {q}", token)
    out = []
    i = 1
    while i < len(token) - 1:
        c = token[i]
        if c == "\\" and i + 1 < len(token) - 1:
            out.append(_ESCAPES.get(token[i + 1], token[i + 1]))
            i += 2
            continue
        if c == q:
            raise src.error(line, f"expected {q} inside a quoted token to be escaped", token)
        out.append(c)
        i += 1
    return "".join(out)


def _split(text: str, sep: str, src: _Source, line: int) -> list[str]:
    """text split at `sep` outside quotes; items stripped of blanks (quotes kept)."""
    if "'" not in text and '"' not in text:
        return [t.strip() for t in text.split(sep)]
    items, cur, quote = [], [], None
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            cur.append(c)
            if c == "\\" and i + 1 < len(text):
                cur.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in _QUOTES:
            quote = c
            cur.append(c)
        elif c == sep:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if quote:
        raise src.error(line, f"expected a closing {quote}", text.strip())
    items.append("".join(cur).strip())
    return items


def _split_name(rest: str, src: _Source, line: int) -> tuple[str, str]:
    """(name, what follows) of an @attribute line's remainder."""
    rest = rest.strip()
    if not rest:
        raise src.error(line, "expected an attribute name after @attribute")
    if rest[0] in _QUOTES:
        q = rest[0]
        i = 1
        while i < len(rest):
            if rest[i] == "\\":
                i += 2
                continue
            if rest[i] == q:
                break
            i += 1
        if i >= len(rest):
            raise src.error(line, f"expected a closing {q} after the attribute name", rest)
        return _unquote(rest[:i + 1], src, line), rest[i + 1:].strip()
    end = len(rest)
    for j, c in enumerate(rest):
        if c.isspace() or c == "{":
            end = j
            break
    return rest[:end], rest[end:].strip()


def _closing_brace(text: str) -> int:
    """Index of the first '}' outside quotes in text (which starts with '{'), or -1."""
    quote = None
    i = 1
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in _QUOTES:
            quote = c
        elif c == "}":
            return i
        i += 1
    return -1


def _number(token: str) -> float | None:
    try:
        v = float(token)
    except ValueError:
        return None
    return v if math.isfinite(v) and "_" not in token else None


# --------------------------------------------------------------------------- header


def _parse_attribute(rest: str, src: _Source, line: int) -> _Attribute:
    name, kind = _split_name(rest, src, line)
    if not kind:
        raise src.error(line, f"expected a type after the attribute name {name!r} "
                              "(numeric, real, integer or {v1,v2,...})")
    low = kind.lower()
    if low in _NUMERIC_TYPES:
        return _Attribute(name, None, line)
    if kind.startswith("{"):
        if not kind.endswith("}"):
            raise src.error(line, "expected a nominal list {v1,v2,...} ending with '}'", kind)
        values = tuple(_unquote(v, src, line) for v in _split(kind[1:-1], ",", src, line))
        bad = [v for v in values if _number(v) is None]
        if not values or bad:
            raise src.error(line, f"expected numeric nominal values such as {{0,1}} for attribute {name!r}",
                            bad[0] if bad else kind)
        return _Attribute(name, values, line)
    raise src.error(line, f"expected attribute type numeric, real, integer or {{v1,v2,...}} "
                          f"for attribute {name!r} (string, date and relational are not supported)", kind)


def _parse_header(src: _Source, lines) -> tuple[list[_Attribute], int]:
    """Attributes and the number of the @data line; consumes `lines` up to @data."""
    attributes: list[_Attribute] = []
    for number, raw in lines:
        text = _strip_comment(raw).strip()
        if not text:
            continue
        head = text.split(None, 1)
        keyword = head[0].lower()
        rest = head[1] if len(head) > 1 else ""
        if keyword == "@relation":
            if attributes:
                raise src.error(number, "expected @relation before the first @attribute", text)
        elif keyword == "@attribute":
            attributes.append(_parse_attribute(rest, src, number))
        elif keyword == "@data":
            if rest.strip():
                raise src.error(number, "expected nothing after @data on its line", rest.strip())
            if not attributes:
                raise src.error(number, "expected @attribute lines before @data")
            return attributes, number
        elif not keyword.startswith("@"):
            raise src.error(number, "expected @data before the first data row", head[0])
        else:
            raise src.error(number, "expected @relation, @attribute or @data", head[0])
    raise XMCFormatError(f"{src.path}: expected an @data line, reached the end of the file")


# --------------------------------------------------------------------------- label selection


def _labels_from_xml(xml_path: str) -> list[str]:
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as e:
        raise XMCFormatError(f"{xml_path}:{e.position[0]}: expected well-formed XML ({e})") from None
    names = []
    for el in root.iter():
        if el.tag.rsplit("}", 1)[-1] == "label":
            name = el.get("name")
            if name is None:
                raise XMCFormatError(f"{xml_path}: expected a name=\"...\" on every <label> element")
            names.append(name)
    if not names:
        raise XMCFormatError(f"{xml_path}: expected <label name=\"...\"> elements, found none")
    seen = set()
    for name in names:
        if name in seen:
            raise XMCFormatError(f"{xml_path}: label {name!r} is listed twice")
        seen.add(name)
    return names


def _label_mask(attributes: list[_Attribute], src: _Source, n_labels, labels_xml) -> np.ndarray:
    n_attr = len(attributes)
    if labels_xml is not None:
        wanted = _labels_from_xml(os.fspath(labels_xml))
        index = {}
        for k, a in enumerate(attributes):
            if a.name in index:
                raise src.error(a.line, f"attribute name {a.name!r} is declared twice "
                                        f"(first on line {attributes[index[a.name]].line})")
            index[a.name] = k
        missing = [w for w in wanted if w not in index]
        if missing:
            raise XMCFormatError(f"{src.path}: label(s) {', '.join(map(repr, missing[:5]))}"
                                 f"{' ...' if len(missing) > 5 else ''} of {os.fspath(labels_xml)} "
                                 f"are not attributes of the file")
        mask = np.zeros(n_attr, dtype=bool)
        mask[[index[w] for w in wanted]] = True
        return mask
    if n_labels > n_attr:
        raise XMCFormatError(f"{src.path}: n_labels={n_labels} but the file declares only "
                             f"{n_attr} attributes")
    mask = np.zeros(n_attr, dtype=bool)
    mask[n_attr - n_labels:] = True
    return mask


# --------------------------------------------------------------------------- data


def _value(token: str, a: _Attribute, is_label: bool, src: _Source, line: int) -> float:
    """The number of one data value (0 for a missing feature)."""
    if token == "?":
        if is_label:
            raise src.error(line, f"expected 0 or 1 for label {a.name!r} (missing values are not "
                                  "allowed for labels)", token)
        return 0.0
    if token and token[0] in _QUOTES:
        token = _unquote(token, src, line)
    if a.nominal is not None:
        if token not in a.nominal:
            raise src.error(line, f"expected one of {{{','.join(a.nominal)}}} for attribute {a.name!r}",
                            token)
        v = float(token)
    else:
        v = _number(token)
        if v is None:
            raise src.error(line, f"expected a finite number for attribute {a.name!r}", token)
    if is_label:
        if v not in (0.0, 1.0):
            raise src.error(line, f"expected 0 or 1 for label {a.name!r}", token)
    elif abs(v) > _FLT_MAX:
        raise src.error(line, f"expected a value within float32 range for attribute {a.name!r}", token)
    return v


def _read_rows(src: _Source, lines, attributes, is_label, col):
    """CSR arrays of X and Y from the data lines."""
    n_attr = len(attributes)
    x_ind, x_val, x_ptr = [], [], [0]
    y_ind, y_ptr = [], [0]
    nonzero_default = [k for k, a in enumerate(attributes) if a.default != 0.0]
    for number, raw in lines:
        text = _strip_comment(raw).strip()
        if not text:
            continue
        if text.startswith("{"):
            close = _closing_brace(text)
            if close < 0:
                raise src.error(number, "expected a sparse row {i v, j v, ...} ending with '}'", text[-20:])
            after = text[close + 1:].strip()
            if after:
                if after.startswith(",") and after[1:].strip().startswith("{"):
                    raise src.error(number, "instance weights {w} are not supported", after[1:].strip())
                raise src.error(number, "expected the end of the line after the sparse row", after)
            if nonzero_default:
                a = attributes[nonzero_default[0]]
                raise src.error(number, f"a sparse row, but attribute {a.name!r} (line {a.line}) declares "
                                        f"{{{','.join(a.nominal)}}}: an omitted value would mean "
                                        f"{a.nominal[0]!r}; declare {{0,...}} first")
            body = text[1:close].strip()
            pairs = []
            if body:
                for item in _split(body, ",", src, number):
                    parts = item.split(None, 1)
                    if len(parts) != 2:
                        raise src.error(number, "expected 'index value' in a sparse row", item)
                    idx_tok, val_tok = parts[0], parts[1].strip()
                    if not idx_tok.isdigit() or not idx_tok.isascii():
                        raise src.error(number, "expected a non-negative attribute index", idx_tok)
                    k = int(idx_tok)
                    if k >= n_attr:
                        raise src.error(number, f"expected an attribute index below {n_attr}", idx_tok)
                    pairs.append((k, val_tok))
                pairs.sort(key=lambda t: t[0])
                for (k0, _), (k1, _) in zip(pairs, pairs[1:]):
                    if k0 == k1:
                        raise src.error(number, "expected each attribute index at most once per row", str(k1))
        else:
            tokens = _split(text, ",", src, number)
            if len(tokens) != n_attr:
                if tokens[-1].startswith("{"):
                    raise src.error(number, "instance weights {w} are not supported", tokens[-1])
                raise src.error(number, f"expected {n_attr} comma-separated values (dense row) "
                                        f"or a sparse row {{i v, ...}}, got {len(tokens)} values")
            pairs = list(enumerate(tokens))
        for k, tok in pairs:
            a = attributes[k]
            if is_label[k]:
                if _value(tok, a, True, src, number) == 1.0:
                    y_ind.append(col[k])
            else:
                v = _value(tok, a, False, src, number)
                if abs(v) >= _FLT_MIN_NORMAL:
                    x_ind.append(col[k])
                    x_val.append(v)
        x_ptr.append(len(x_ind))
        y_ptr.append(len(y_ind))
    return (np.asarray(x_ptr, dtype=np.int64), np.asarray(x_ind, dtype=np.int32),
            np.asarray(x_val, dtype=np.float32), np.asarray(y_ptr, dtype=np.int64),
            np.asarray(y_ind, dtype=np.int32))


def _csr(indptr, indices, data, shape) -> sp.csr_matrix:
    m = sp.csr_matrix((data, indices, indptr), shape=shape)
    m.has_sorted_indices = True  # rows were filled in attribute order
    return m


def read_arff(path, n_labels: int | None = None, *, labels_xml=None, names: bool = False):
    """Read a Mulan multi-label ARFF file (plain or gzip) into XMCData.

    path:       the ARFF file.
    n_labels:   the last n_labels attributes are the labels, or
    labels_xml: Mulan's XML label file; the attributes it names are the labels
                (wherever they are). Give exactly one of the two.
    names:      also return the feature and label attribute names.

    X[i, f] = value of the f-th non-label attribute in row i (float32, zeros not
    stored); Y[i, l] = 1 where the l-th label attribute is 1 in row i. Features
    and labels keep the order of the attributes in the file.

    Returns XMCData, or (XMCData, feature_names, label_names) when names is true.
    Raises XMCFormatError (file:line, what was expected, the offending token) on
    malformed input, ValueError on bad arguments, OSError if a file cannot be read.
    """
    if (n_labels is None) == (labels_xml is None):
        raise ValueError("give exactly one of n_labels (the last n_labels attributes are labels) "
                         "and labels_xml (Mulan's XML label file)")
    if n_labels is not None and (isinstance(n_labels, bool) or not isinstance(n_labels, (int, np.integer))
                                 or n_labels < 1):
        raise ValueError(f"n_labels ({n_labels!r}) must be an integer >= 1")
    src = _Source(os.fspath(path))
    lines = src.lines()
    attributes, _ = _parse_header(src, lines)
    is_label = _label_mask(attributes, src, n_labels, labels_xml)
    # Column of each attribute among the features or among the labels.
    col = np.where(is_label, np.cumsum(is_label) - 1, np.cumsum(~is_label) - 1).tolist()
    x_ptr, x_ind, x_val, y_ptr, y_ind = _read_rows(src, lines, attributes, is_label.tolist(), col)
    n = len(x_ptr) - 1
    n_lab = int(is_label.sum())
    data = XMCData(_csr(x_ptr, x_ind, x_val, (n, len(attributes) - n_lab)),
                   _csr(y_ptr, y_ind, np.ones(len(y_ind), dtype=np.float32), (n, n_lab)))
    if names:
        return (data, [a.name for a, lab in zip(attributes, is_label) if not lab],
                [a.name for a, lab in zip(attributes, is_label) if lab])
    return data
