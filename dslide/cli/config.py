"""`dslide config show`: every setting with its default and valid range, and what a data set resolves it to;
`dslide config table`: the settings table of docs/configuration.md."""

from __future__ import annotations

from dslide.cli import common

EXAMPLES = """examples:
  dslide config show
  dslide config show --data data/small_train.txt --set hidden=256
  dslide config table > table.md"""


def add_parser(command) -> None:
    from dslide.io.formats import FORMATS

    c = command("config", "list the settings: default, valid range, and the value for a data set", EXAMPLES)
    csub = c.add_subparsers(dest="config_cmd", required=True, metavar="CONFIG_COMMAND")
    show = csub.add_parser("show", help="every setting with its default and valid range (and with --data the value "
                                        "the data resolves it to)", formatter_class=common.Help, epilog=EXAMPLES)
    show.add_argument("--data", metavar="DATA", help="resolve the settings taken from the data for this training set")
    show.add_argument("--format", choices=FORMATS, help=common.FORMAT_HELP)
    common.add_sets(show)
    common.add_debug(show)
    md = csub.add_parser("table", help="every setting as the Markdown table of docs/configuration.md",
                         formatter_class=common.Help, epilog=EXAMPLES)
    common.add_debug(md)


def run(args, comm) -> int:
    from dslide import settings

    if args.config_cmd == "table":
        if comm.rank == 0:
            print(settings.markdown(), end="")
        return 0
    config = common.make_config(args.config, args.set)
    shape = (None, None, None, None, None)
    if args.data:
        from dslide.config import resolve_shape

        data = common.read(args.data, "--data", args.format, comm=comm)
        shape = (data.n_features, *resolve_shape(data))
    if comm.rank == 0:
        if args.data:
            print(f"{args.data}: {shape[0]:,} features, {shape[1]:,} labels, "
                  f"{shape[2]:.2f} training points per label, {shape[4]:.2f} labels per point")
        print(settings.format_table(settings.table(config, *shape), with_value=bool(args.data or args.set
                                                                                     or args.config)))
    return 0
