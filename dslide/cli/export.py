"""`dslide export`: a run's latest checkpoint without its optimiser state, for eval and predict."""

from __future__ import annotations

EXAMPLES = """example:
  dslide export --model runs/small --out deploy/small"""


def add_parser(command) -> None:
    x = command("export", "copy a run's latest checkpoint without optimiser state (for eval/predict)", EXAMPLES)
    x.add_argument("--model", required=True, metavar="RUN_DIR", help="run directory to export")
    x.add_argument("--out", required=True, metavar="NEW_RUN_DIR", help="new run directory")


def run(args, comm) -> int:
    from dslide.io import checkpoint as ck

    if comm.rank == 0:
        target = ck.export(args.model, args.out)
        manifest = ck.read_manifest(target)
        print(f"wrote {args.out}: the weights of {manifest.get('n_params', 0):,} parameters at step {manifest['step']} "
              f"({ck.size_bytes(target) / 2**20:,.1f} MiB, {manifest['world_size']} rank(s)); "
              f"use it with eval/predict --model {args.out}")
    comm.barrier()
    return 0
