"""`python -m dslide.cli`: the same as the `dslide` command."""

import sys

from dslide.cli import main

sys.exit(main())
