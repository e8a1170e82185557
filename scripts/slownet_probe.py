"""Send a known number of bytes between MPI ranks and time it (checks scripts/slownet.sh).

    mpiexec -n 2 python scripts/slownet_probe.py --mbytes 100 [--pattern p2p] [--json out.json]

(It imports nothing of the package, so it runs as a file too, as scripts/slownet.sh's tests run it;
`python -m scripts.slownet_probe` from the repository root is the same.)

Patterns (payload bytes counted are what the program itself must move):
  p2p        rank 0 sends the bytes to rank 1 in `--chunk` sized messages;
             payload = the bytes (one direction: the effective bandwidth of the cap).
  allreduce  every rank all-reduces a float32 array of the given size, once;
             payload = sum over ranks of 2 (P - 1) / P * bytes, the least any
             bandwidth-optimal all-reduce moves (ring, Rabenseifner).
Rank 0 prints one JSON line (and writes it to --json): pattern, world_size,
payload_bytes, seconds, mbit_s (payload bits per second), and the per-message
round-trip latency of a 1-byte ping-pong (latency_us, half the round trip).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI


def ping_pong_latency(comm, repeats: int = 200) -> float:
    """Half the mean round trip of a 1-byte message between ranks 0 and 1, in seconds."""
    buf = np.zeros(1, dtype=np.uint8)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        if comm.rank == 0:
            comm.Send(buf, 1)
            comm.Recv(buf, 1)
        elif comm.rank == 1:
            comm.Recv(buf, 0)
            comm.Send(buf, 0)
    dt = time.perf_counter() - t0
    return dt / repeats / 2


def p2p(comm, nbytes: int, chunk: int) -> tuple[int, float]:
    buf = np.ones(min(chunk, nbytes), dtype=np.uint8)
    comm.Barrier()
    t0 = time.perf_counter()
    left = nbytes
    while left > 0:
        n = min(left, buf.size)
        if comm.rank == 0:
            comm.Send(buf[:n], 1)
        elif comm.rank == 1:
            comm.Recv(buf[:n], 0)
        left -= n
    # the receiver's completion marks the end; a zero-byte message tells rank 0
    if comm.rank == 1:
        comm.Send(np.zeros(0, dtype=np.uint8), 0)
    elif comm.rank == 0:
        comm.Recv(np.zeros(0, dtype=np.uint8), 1)
    return nbytes, time.perf_counter() - t0


def allreduce(comm, nbytes: int) -> tuple[int, float]:
    n = max(1, nbytes // 4)
    send = np.ones(n, dtype=np.float32)
    recv = np.empty_like(send)
    comm.Barrier()
    t0 = time.perf_counter()
    comm.Allreduce(send, recv, op=MPI.SUM)
    dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    if recv[0] != comm.size:
        raise RuntimeError(f"all-reduce gave {recv[0]}, expected {comm.size}")
    P = comm.size
    return P * (2 * (P - 1) * 4 * n // P), dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbytes", type=float, default=20.0, help="payload size in MB (10^6 bytes)")
    ap.add_argument("--pattern", choices=("p2p", "allreduce"), default="p2p")
    ap.add_argument("--chunk", type=int, default=4 << 20, help="message size of the p2p pattern, bytes")
    ap.add_argument("--json", default="", help="also write the result here (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        print(f"slownet_probe needs at least 2 ranks, got {comm.size}", file=sys.stderr)
        return 2
    nbytes = int(args.mbytes * 1e6)
    if nbytes <= 0 or args.chunk <= 0:
        print(f"--mbytes ({args.mbytes}) and --chunk ({args.chunk}) must be positive", file=sys.stderr)
        return 2
    lat = ping_pong_latency(comm)
    if args.pattern == "p2p":
        payload, dt = p2p(comm, nbytes, args.chunk)
    else:
        payload, dt = allreduce(comm, nbytes)
    if comm.rank == 0:
        out = {"pattern": args.pattern, "world_size": comm.size, "payload_bytes": int(payload),
               "seconds": dt, "mbit_s": payload * 8 / dt / 1e6, "latency_us": lat * 1e6}
        line = json.dumps(out)
        print(line, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
