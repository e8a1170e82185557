"""The network and its parts: what one training step computes.

`network` the list of layers and its step; `layers/` one module per layer kind,
`candidates/` one module per candidate source of an LSH layer; `batch` what
passes between the network and its layers, `inputs` a data set's rows as
batches; `loss`, `optim` (Adam) and the step's numba kernels in `kernels`
(with `bfloat16`, Adam's moments stored as bfloat16 bits, and `prefetch`, a cache hint for
rows read a few iterations later); `topk` the top k
of a layer's scores and their merge over ranks; `sharding` which columns a
rank owns (arithmetic only).
"""
