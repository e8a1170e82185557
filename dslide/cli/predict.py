"""`dslide predict`: the top k labels of each point of a data file, written as text or npz."""

from __future__ import annotations

import time

from dslide.cli import common
from dslide.session import UsageError, check_memory, on_rank0

EXAMPLES = """examples:
  dslide predict --model runs/small --data data/small_test.txt --k 5 --out pred.txt
  dslide predict --model runs/small --data tst.svm --lsh --k 100 --out pred.npz   (CSR of top-k scores)"""


def add_parser(command) -> None:
    from dslide.io.formats import PREDICTION_FORMATS

    r = command("predict", "write the top-k labels of each point", EXAMPLES)
    common.add_model_options(r, exact_flag=False)
    r.add_argument("--out", required=True, metavar="PRED",
                   help="output file: text ('points labels' header, then the top k's label:score pairs per line "
                        "in label order, as pyxclib's read_sparse_file reads them) or, for .npz, a scipy CSR "
                        "matrix of the top-k scores; ranked by score, ties to the lower label id")
    r.add_argument("--out-format", choices=PREDICTION_FORMATS,
                   help="format of --out, the output (the input's is --in-format; default: npz for a .npz name)")


def run(args, comm) -> int:
    import dslide
    from dslide.infer.predict import predict_topk_scores
    from dslide.io import formats, rundir

    common.check_out(args)
    on_rank0(comm, lambda: rundir.check_writable(args.out))  # before the model and the scoring
    t_load = time.perf_counter()
    model = common.load_model(args.model, comm, args.k)
    load_s = time.perf_counter() - t_load
    common.check_scoring(model, args)
    out_fmt = args.out_format or ("npz" if args.out.endswith(".npz") else "text")

    def accept(data):
        if data.n_features != model.n_features:
            raise UsageError(f"{args.data} has {data.n_features} features; the model was trained on "
                             f"{model.n_features}")
        # the top-k ids and scores of every point (int64 and float64)
        check_memory(comm, 16 * data.n_points * args.k, f"the top {args.k:,} labels of {data.n_points:,} points")

    data = common.read_accepted(args.data, "--data", accept, args.format, model.n_features, model.n_labels, comm=comm,
                                quiet=getattr(args, "quiet", False))
    stats = {}
    bar = common.points_bar(comm, data.n_points, args, "predicting")
    t0 = time.perf_counter()
    ids, scores = predict_topk_scores(model, data.X, args.k, exact=not args.lsh, stats=stats,
                                        progress=bar.update if bar else None)
    dt = time.perf_counter() - t0
    if bar:
        bar.close()
    # seconds from the process's start until scoring began, and of it loading the model
    startup = max(comm.allgather_object(t0 - dslide.IMPORTED_AT))
    load_s = max(comm.allgather_object(load_s))
    if comm.rank == 0:
        # a fresh temporary file renamed into place, never through a planted link (dslide.io.rundir)
        formats.write_predictions(args.out, ids, scores, model.n_labels, out_fmt)
        what = ("a CSR matrix of the top-k scores, scipy.sparse.load_npz" if out_fmt == "npz" else
                "a header line 'points labels', then label:score pairs in label order per line, pyxclib's "
                "read_sparse_file")
        print(f"wrote the top {args.k} labels of {data.n_points:,} points to {args.out} ({what}; "
              f"{100 * stats['scored_share']:.2f}% of the labels scored per point)")
        print(f"{data.n_points:,} points in {dt:.2f}s ({'lsh' if args.lsh else 'exact'} scoring), after "
              f"{startup:.1f}s of start-up ({load_s:.1f}s loading the model)")
    return 0
