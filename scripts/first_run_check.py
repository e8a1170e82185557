"""Run a command as on a fresh install (an empty numba cache) and fail if it is silent for too long.

    python -m scripts.first_run_check [--max-gap 10] [--keep-cache] -- COMMAND [ARG ...]

Every line the command writes (stdout and stderr, a progress bar's carriage
returns included) is timed; the check fails when more than --max-gap seconds
pass without one, or when the command fails. NUMBA_CACHE_DIR points at a
fresh directory unless --keep-cache, so every kernel compiles as on a fresh
install. scripts/test.sh runs it on `dslide data gen --preset tiny` (the
generator's kernels: about 20 s of compiling); the whole first demo is
`python -m scripts.first_run_check -- ./scripts/demo.sh` (minutes).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def timed_output(argv: list[str], env: dict | None = None) -> tuple[int, list[tuple[float, str]]]:
    """Run argv; return its exit status and its output as (seconds since the start, line)."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    lines, pending = [], b""
    while True:
        chunk = p.stdout.read1(65536)
        if not chunk:
            break
        now = time.monotonic() - t0
        pending += chunk.replace(b"\r", b"\n")
        *done, pending = pending.split(b"\n")
        lines.extend((now, line.decode(errors="replace")) for line in done if line.strip())
        if pending.strip():  # a partial line (a progress bar) counts as output too
            lines.append((now, pending.decode(errors="replace")))
            pending = b""
    lines.append((time.monotonic() - t0, "(end)"))
    return p.wait(), lines


def longest_gap(lines: list[tuple[float, str]]) -> tuple[float, str]:
    """The longest silence (seconds) and the line that ended it, the start counting as a line."""
    gap, after, last = 0.0, "", 0.0
    for t, text in lines:
        if t - last > gap:
            gap, after = t - last, text
        last = t
    return gap, after


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-gap", type=float, default=10.0, help="seconds of silence allowed (default 10)")
    p.add_argument("--keep-cache", action="store_true", help="keep numba's cache (do not start empty)")
    p.add_argument("command", nargs="+")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dslide-first-run-") as tmp:
        env = dict(os.environ)
        if not a.keep_cache:
            env["NUMBA_CACHE_DIR"] = os.path.join(tmp, "numba")
        code, lines = timed_output(a.command, env)
    gap, after = longest_gap(lines)
    print(f"first_run_check: {' '.join(a.command)}: exit {code}, {lines[-1][0]:.1f}s, {len(lines) - 1} lines, "
          f"longest silence {gap:.1f}s (before: {after[:100]!r})")
    if code != 0:
        print("\n".join(text for _, text in lines[-20:]), file=sys.stderr)
        return 1
    return 0 if gap <= a.max_gap else 1


if __name__ == "__main__":
    sys.exit(main())
