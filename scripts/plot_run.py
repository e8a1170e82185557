"""Kept for old commands: `python -m scripts.plot_run RUN_DIR ... --out p.png` is `dslide plot`."""

import sys

from dslide.cli import main

if __name__ == "__main__":
    sys.exit(main(["plot", *sys.argv[1:]]))
