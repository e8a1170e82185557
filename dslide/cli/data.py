"""`dslide data`: generate (gen), convert and inspect (stats) data sets."""

from __future__ import annotations

import os

from dslide.cli import common
from dslide.session import UsageError

EXAMPLES = """examples:
  dslide data gen --preset tiny --out data/tiny
  dslide data convert trn_X_Xf.txt data/trn.txt
  dslide data stats data/tiny_train.txt"""


def add_parser(command) -> None:
    from dslide.io.formats import FORMATS

    d = command("data", "generate, convert and inspect data sets", EXAMPLES)
    dsub = d.add_subparsers(dest="data_cmd", required=True, metavar="DATA_COMMAND")

    def data_command(name, help_text):
        c = dsub.add_parser(name, help=help_text, description=help_text, formatter_class=common.Help)
        common.add_debug(c)
        return c

    gen = data_command("gen", "write a synthetic data set (PREFIX_train.txt, PREFIX_test.txt)")
    # Checked by dslide.datasets.suite (its message names every preset): importing the
    # generators here would load numba for every command.
    gen.add_argument("--preset", required=True, metavar="NAME",
                     help="tiny, small, amazon-like, amazon-tail, baskets-*, a670k-* (the suite's members)")
    gen.add_argument("--points", type=int, help="training points (default: the preset's)")
    gen.add_argument("--test-points", type=int, help="test points (default: the preset's)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the generator: the same seed, the same files")
    gen.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX_train.txt and PREFIX_test.txt")
    conv = data_command("convert", "between the data formats (xmc, split, libsvm, npz), mulan ARFF -> XMC text, "
                                   "or XMC text -> binary cache")
    conv.add_argument("input", metavar="IN", help="input: " + common.DATA_HELP + ", or a mulan .arff file")
    conv.add_argument("output", metavar="OUT", help="output (format by name: .npz, .svm, X_Xf, else XMC text), "
                                                    "or 'cache' for IN's binary cache")
    common.add_in_format(conv, "IN")
    conv.add_argument("--out-format", choices=FORMATS, help="format of OUT (default: by its name)")
    conv.add_argument("--labels", type=int, help="ARFF: the last N attributes are the labels")
    conv.add_argument("--labels-xml", help="ARFF: mulan's XML file naming the labels")
    st = data_command("stats", "statistics of a data file")
    st.add_argument("file", metavar="DATA", help=common.DATA_HELP)
    st.add_argument("--format", choices=FORMATS, help=common.FORMAT_HELP)


def run(args, comm) -> int:
    from dslide.datasets import stats, suite, synthetic

    if comm.rank != 0:
        return 0
    if args.data_cmd == "gen":
        train, test = suite.generate_split(args.preset, n_train=args.points, n_test=args.test_points, seed=args.seed)
        paths = synthetic.write(args.out, train, test)
        print(f"wrote {paths[0]} ({train.n_points:,} points) and {paths[1]} ({test.n_points:,} points): "
              f"{train.n_features:,} features, {train.n_labels:,} labels")
        return 0
    if args.data_cmd == "stats":
        data = common.read(args.file, "data file", args.format, points=False)  # (statistics of nothing are zeros)
        print(stats.format_stats(stats.stats(data)))
        return 0
    if args.data_cmd == "convert":
        return _convert(args)
    raise UsageError("dslide data needs a command: gen, convert or stats")


def _convert(args) -> int:
    from dslide.io import formats
    from dslide.io.data import cache_path, read_xmc, write_xmc

    src, dst = args.input, args.output
    if not os.path.exists(formats.split_pair(src)[0]):
        raise UsageError(f"input {src} does not exist")
    _check_convert_outputs(src, dst, args)
    if src.endswith(".arff") or src.endswith(".arff.gz"):
        from dslide.datasets.arff import read_arff

        if args.labels is None and args.labels_xml is None:
            raise UsageError("converting ARFF needs the number of labels (--labels N, the last N attributes) "
                             "or the mulan label file (--labels-xml F)")
        data = read_arff(src, args.labels, labels_xml=args.labels_xml) if args.labels_xml is None \
            else read_arff(src, labels_xml=args.labels_xml)
        write_xmc(dst, data.X, data.Y)
        print(f"wrote {dst}: {data.n_points:,} points, {data.n_features:,} features, {data.n_labels:,} labels")
        return 0
    if dst == "cache" or os.path.normpath(dst) == os.path.normpath(cache_path(src)):
        data = read_xmc(src, cache=True)
        print(f"cached {src} as {cache_path(src)} ({data.n_points:,} points)")
        return 0
    data = common.read(src, "input", args.format, points=False)
    paths = formats.write_data(dst, data, args.out_format)
    print(f"wrote {' and '.join(paths)}: {data.n_points:,} points, {data.n_features:,} features, "
          f"{data.n_labels:,} labels")
    return 0


def _check_convert_outputs(src: str, dst: str, args) -> None:
    """Every file convert would write (a pair format's two: dslide.io.formats.write_data) is none of
    its inputs (a pair's second file included) and lies in no run's checkpoints."""
    from dslide.io import formats, rundir

    inputs = [*formats.split_pair(src), getattr(args, "labels_xml", None)]
    outputs = [dst]
    name = dst.split(",", 1)[0].lower()
    fmt = args.out_format or ("npz" if name.endswith(".npz") else "libsvm" if name.endswith(formats.LIBSVM_SUFFIXES)
                              else "split" if ("x_xf" in os.path.basename(name) or "," in dst) else "xmc")
    is_arff = src.endswith(".arff") or src.endswith(".arff.gz")
    if fmt in ("npz", "split") and not is_arff and dst != "cache":
        outputs = list(formats._pair_names(dst))
    for out in outputs:
        rundir.check_output(out, inputs, "output")
        if dst != "cache":
            rundir.check_writable(out, "output")  # before the input is read
