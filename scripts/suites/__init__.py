"""The suites of `python -m scripts.bench`: one module per part, each with `run(a, suite)`.

- `main`: the same network by dslide, dense, data-parallel and PyTorch (parts of --suite quick and full);
- `peers`: dslide's defaults against omikuji, napkinXC and a PyTorch sampled softmax;
- `lsh`: what the hash tables buy, and `--lsh` inference;
- `schedule`: the same with the default schedule;
- `shapes` (`run(a)`): --suite shapes, every data shape against the tree libraries;
- `scale` (`run(a)`): --suite scale, a member at 300,000 training points, dslide's P@1 against time;
- `common`: the suites' data and settings, printing, plotting and recording a part.
"""
