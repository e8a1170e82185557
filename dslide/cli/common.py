"""What several commands of the `dslide` command line share.

    settings        make_config: a TOML file (--config) with --set overlaid, as a Config;
                    apply_sets: the overlay alone (train --resume checks which keys it sets)
    data arguments  read (a file or FEATURES,LABELS, checked and announced), read_accepted
                    (its cache written only once the command accepts the data), data_files
                    (which files a data argument names, with their sha256)
    a trained model load_model (eval's and predict's; a test may replace it), check_scoring
                    (--k and --lsh), check_out (their --out), points_bar
    help            Help (the formatter), FORMAT_HELP, DATA_HELP and the options several
                    commands take: add_debug, add_sets, add_in_format, add_model_options

What the Python interface needs as well lives one layer down, in dslide.session.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time

from dslide import session
from dslide.session import UsageError, check_k, check_lsh, normalise_values

#: how eval and predict load a model (dslide.session.load_model); a test may replace it
load_model = session.load_model

#: data files at least this large are announced on stderr before and after reading
LOUD_READ_BYTES = 64 << 20


# ----------------------------------------------------------------------------
# configuration: TOML files and --set
# ----------------------------------------------------------------------------


def _toml_load(path: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"configuration file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from None


def _parse_value(text: str):
    """A --set value: a TOML value if it parses as one ("3", "1e-3", "true", "[128, 64]",
    "'dwta'"), a list for comma-separated items ("128,64"), else the bare string."""
    try:
        import tomllib
    except ModuleNotFoundError:
        import tomli as tomllib
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    if "," in text:
        return [_parse_value(t.strip()) for t in text.split(",") if t.strip()]
    return text


def apply_sets(values: dict, sets: list[str]) -> dict:
    """Overlay `key=value` strings on a flat configuration dict; dotted keys reach the [lsh]
    table (lsh.K=8), and name a setting by its TOML table (train.lr=1e-3 is lr=1e-3)."""
    from dslide.config.fields import TABLES

    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in values.items()}
    for item in sets or []:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected key=value, e.g. --set lr=1e-3 or --set lsh.K=8")
        key, text = item.split("=", 1)
        key = key.strip()
        value = _parse_value(text.strip())
        if "." in key and key.split(".", 1)[0] in TABLES:
            out[key.split(".", 1)[1]] = value  # train.lr: the flat name (dslide.config.fields)
        elif "." in key:
            table, sub = key.split(".", 1)
            out.setdefault(table, {})
            if not isinstance(out[table], dict):
                raise UsageError(f"--set {key}: {table!r} is not a table of settings")
            out[table][sub] = value
        else:
            out[key] = value
    return out


def make_config(config_file: str | None, sets: list[str]):
    from dslide.config import Config

    values = Config.flatten(_toml_load(config_file)) if config_file else {}
    values = apply_sets(values, sets)
    return Config.from_dict(normalise_values(values))


# ----------------------------------------------------------------------------
# data arguments
# ----------------------------------------------------------------------------


def read(path: str, what: str, fmt: str | None = None, n_features: int | None = None,
         n_labels: int | None = None, comm=None, points: bool = True, quiet: bool = False):
    """Read data argument `path` (dslide.io.formats: a file or FEATURES,LABELS; `fmt` or by name);
    points: refuse data without data points. A file of LOUD_READ_BYTES or more shows, on rank 0
    and unless quiet, a bar of the bytes parsed (stderr a terminal) or a line before and after."""
    from dslide.io import formats

    if not path:
        raise UsageError(f"{what} is required")
    first, second = formats.split_pair(path)
    for p in (first, second) if second else (first,):
        if not os.path.exists(p):
            raise UsageError(f"{what} {p} does not exist")
        if os.path.isdir(p):
            raise UsageError(f"{what} {p} is a directory, expected a data file")
        if not os.access(p, os.R_OK):
            raise UsageError(f"{what} {p} is not readable")
        if not stat.S_ISREG(os.stat(p).st_mode):  # a pipe cannot be read twice (format, then data)
            raise UsageError(f"{what} {p} is not a regular file (a pipe or a device); dslide reads data "
                             f"files more than once: save it to a file first")
    size = sum(os.path.getsize(p) for p in (first, second) if p)
    t0 = time.perf_counter()
    loud = comm is not None and comm.rank == 0 and size >= LOUD_READ_BYTES and not quiet
    bar = None
    if loud and sys.stderr.isatty():
        from tqdm import tqdm

        # the bytes of text parsed (a file's cache, when it has one, loads at once and moves no bar)
        bar = tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=f"reading {what}",
                   dynamic_ncols=True, leave=False)
    elif loud:
        print(f"reading {what} {path} ({size / 2**20:,.0f} MiB)...", file=sys.stderr, flush=True)
    try:
        data = formats.read_data(path, fmt, n_features=n_features, n_labels=n_labels,
                                 progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    if loud:
        print(f"read {what} {path}: {data.n_points:,} points in {time.perf_counter() - t0:.1f}s",
              file=sys.stderr, flush=True)
    if points and data.n_points == 0:
        raise UsageError(f"{what} {path} holds no data points")
    return data


def read_accepted(path: str, what: str, accept, fmt: str | None = None, n_features: int | None = None,
                  n_labels: int | None = None, comm=None, quiet: bool = False):
    """`read`, the file's cache written only once accept(data) (checks that raise) has passed."""
    from dslide.io.data import caches_held, write_caches

    with caches_held() as held:
        data = read(path, what, fmt, n_features, n_labels, comm=comm, quiet=quiet)
        accept(data)
        write_caches(held)
    return data


def data_files(path: str) -> dict:
    """What a data argument (FILE or FEATURES,LABELS) names: {"data": path, "files": [{"path":
    absolute path, "sha256": hex digest}, ...]}, features file first, so that figures saved from
    it say which data they are of."""
    import hashlib

    from dslide.io import formats

    files = []
    for p in (q for q in formats.split_pair(path) if q):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        files.append({"path": os.path.abspath(p), "sha256": h.hexdigest()})
    return {"data": path, "files": files}


# ----------------------------------------------------------------------------
# eval and predict: a trained model
# ----------------------------------------------------------------------------


def check_out(args) -> None:
    """eval's and predict's --out: never one of their inputs (the data, a pair's labels file,
    the model's files) nor inside a run's checkpoints; checked before anything is read."""
    from dslide.io import formats, rundir

    rundir.check_output(args.out, [*formats.split_pair(args.data or ""), *rundir.run_inputs(args.model)])


def check_scoring(model, args) -> None:
    """--k in [1, n_labels]; --lsh only with an inference index (dslide.session)."""
    try:
        check_k(args.k, model.n_labels)
        check_lsh(model, args.lsh)
    except ValueError as e:
        raise UsageError(str(e).replace("k = ", "--k ").replace("lsh scoring", "--lsh")) from None


def points_bar(comm, n: int, args, what: str):
    """A tqdm bar of scored points on rank 0 when stderr is a terminal and not --quiet, else None."""
    if comm.rank != 0 or getattr(args, "quiet", False) or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=n, unit="point", desc=what, dynamic_ncols=True, leave=False)


# ----------------------------------------------------------------------------
# help
# ----------------------------------------------------------------------------


class Help(argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help (where it has one and the help does not say it);
    examples (the epilog) kept as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if "default" in text or d is None or d is False or d == [] or d == argparse.SUPPRESS \
                or not action.option_strings:
            return text
        return f"{text} (default: {d})"


FORMAT_HELP = ("data format: xmc (one file with header 'points features labels'), split (the repository's "
               "X_Xf.txt + X_Y.txt), libsvm (headerless 'l1,l2 f:v ...'), npz (scipy CSR pair X.npz,Y.npz); "
               "default: by the file's name and first line")
DATA_HELP = ("FEATURES[,LABELS]: an XMC file, or a pair (the labels file is found beside X_Xf / X* / NAME files by "
             "name: X_Y / Y* / NAME_Y)")


def add_debug(c) -> None:
    """--debug also after a command's name, as in `dslide train ... --debug`; not in its help."""
    c.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_sets(c) -> None:
    c.add_argument("--config", help="TOML configuration file (the keys of --set)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting (repeatable), e.g. --set lr=1e-3 --set lsh.K=8 --set hidden=256,128; "
                        "all of them: dslide config show")


def add_in_format(c, what: str) -> None:
    from dslide.io.formats import FORMATS

    # the input's format beside an output's (--out-format): named apart; --format, its old
    # name, still works but is not listed
    c.add_argument("--in-format", dest="format", choices=FORMATS,
                   help=f"format of {what}, the input (--format is the same option; the output's is "
                        f"--out-format): " + FORMAT_HELP)
    c.add_argument("--format", dest="format", choices=FORMATS, help=argparse.SUPPRESS)


def add_model_options(c, exact_flag: bool) -> None:
    """The options of the commands that score data with a trained model (eval, predict)."""
    c.add_argument("--model", required=True, metavar="RUN_DIR", help="run directory of dslide train (or export)")
    c.add_argument("--data", required=True, metavar="DATA", help=DATA_HELP)
    add_in_format(c, "--data")
    c.add_argument("--k", type=int, default=5, help="labels per point: P@1..k, or the top k written")
    g = c.add_mutually_exclusive_group()
    if exact_flag:
        g.add_argument("--exact", action="store_true", help="score every label (the default)")
    g.add_argument("--lsh", action="store_true",
                   help="score only the labels the output layer's inference index retrieves (LSH output only)")
    c.add_argument("--quiet", action="store_true", help="no progress bar; the final figures only")
