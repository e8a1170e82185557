"""Files: what dslide reads and writes.

`data` reads and writes XMC text (`read_xmc`, `write_xmc`, `XMCData`), with its
parser kernels in `xmc_parse`, its writer in `xmc_write` and the binary cache
beside a text file in `xmc_cache`; `formats` the other formats (`read_data`,
`write_data`, predictions); `rundir` a run directory's locks and atomic files;
`checkpoint` saving and loading a model over `checkpoint_files` (one array to
its .npy file and back, hashed; a manifest's fields).
"""
