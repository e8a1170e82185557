"""dslide's benchmarks, one package: run each from the repository root as `python -m scripts.NAME --help`.

`measure` is what they share (threads, peak memory of a process tree, time to
a target P@1, the machine line, the record in docs/benchmarks.md); `_bench`
runs one training case in its own process; `suites` holds the parts of
`python -m scripts.bench`; `archive` the studies whose question is settled
(its README.md says what each studied). Modules import each other by relative imports; a
child process runs a module as `python -m scripts.NAME` with the repository
root as its working directory (`measure.module_cmd`, `measure.run`).

Importing this package imports nothing: the baselines' trainers run under
`.venv-baselines`' python, which has neither dslide nor its dependencies.
"""
