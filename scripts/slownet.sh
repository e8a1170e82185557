#!/usr/bin/env bash
# Run a command (typically an MPI job) over an emulated slow network on one machine.
#
#   scripts/slownet.sh [--rate RATE] [--mtu BYTES] [--burst SIZE] [--limit SIZE]
#                      [--delay TIME] [--yield] [--stats FILE] -- COMMAND...
#
#   scripts/slownet.sh --rate 100mbit --stats s.json -- \
#       .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py -m dslide train ...
#
# What it does:
#   * makes a private network namespace `dslide-<pid>` with only a loopback
#     device, brought up with an Ethernet-sized MTU (--mtu, default 1500);
#   * caps that loopback with a token-bucket filter (tc `tbf`) at --rate
#     (e.g. 10gbit, 1gbit, 100mbit; `none` puts a plain counting `pfifo` there
#     instead, so the byte counters exist without any cap);
#   * tells MPICH to send everything, between local ranks too, through its
#     network module over TCP (see "MPICH settings" below), so every byte the
#     ranks exchange crosses the capped loopback;
#   * runs COMMAND inside the namespace (all its processes, hence every rank,
#     inherit it; traffic never leaves the namespace);
#   * prints the qdisc's counters at the end (`--stats FILE` also writes them as
#     JSON) and removes the namespace, also on failure, Ctrl-C or SIGTERM.
# Exit status: COMMAND's; 2 when the emulation is impossible here (not root,
# no namespaces, no iproute2) or the arguments are wrong.
#
# One link for all ranks. Every rank's traffic, both directions, goes through
# the one capped loopback queue: the cap is the capacity of a shared medium,
# not of each node's full-duplex link. When all P ranks send at once (ring
# collectives), each gets about RATE / P; scripts/_costmodel.py takes this into
# account (`shared_medium=True`) when it is fitted to these runs.
#
# Token-bucket settings (why these values):
#   * MTU 1500: the frames of the cheap Ethernet this emulates. The loopback's
#     own MTU (64 KiB) would make single packets larger than any sensible
#     bucket, and tbf drops a non-GSO packet larger than its bucket (TCP on
#     loopback then stalls in 200 ms retransmission timeouts). Larger GSO
#     packets are split into MTU-sized segments by tbf itself.
#   * burst = max(4 * (MTU + 14), RATE * 200 us): what may pass at once after
#     an idle moment. It must hold a few full frames, and at high rates cover
#     the kernel timer's granularity: measured here (a busy 2-core VM), 100 MB
#     at 10gbit got 4.5-5 Gbit/s with a 62 kB (50 us) bucket and 5.3-9.4
#     Gbit/s with 250 kB (200 us; 9.6-9.8 with MTU 9000: segmenting into
#     1500-byte frames costs CPU), while 1gbit and 100mbit reach 90-93%
#     payload throughput (98% on the wire) with 4 frames. It must also stay small next
#     to the messages we time: each idle gap lets at most one bucket through
#     uncapped, saving at most burst / RATE (0.5 ms at 100mbit, 0.2 ms at
#     1gbit and 10gbit). dslide's smallest per-step message in the benchmark
#     (256 x 128 float32 = 128 KiB) is 20x the bucket at 100mbit, 5x at 1gbit.
#   * limit 64 MiB of queue: never drop. On a real switch a drop costs a
#     retransmission after a round trip of ~100 us; on loopback TCP's minimum
#     retransmission timeout is 200 ms, which would dominate every timing. TCP's
#     small-queues limit keeps the actual backlog at ~1 MiB per socket anyway.
#     The `dropped` counter is reported so a run can be checked.
#   * delay: the `netem` qdisc (added latency) is checked for; many VM kernels
#     are built without it (CONFIG_NET_SCH_NETEM). Without it the loopback's own
#     latency stays (MPI 1-byte messages: ~5-20 us, ~90 us with --yield), and
#     the cost model's latency term (alpha) covers slower networks.
#
# MPICH settings (MPICH 5.0.2 from the PyPI wheel, device ch4:ucx,ofi, found by
# measuring the qdisc counters; the defaults move zero bytes over the loopback):
#   MPIR_CVAR_NOLOCAL=1        ranks do not use MPICH's shared-memory module for
#                              peers on the same host (collectives included);
#   MPIR_CVAR_CH4_NETMOD=ofi   the libfabric network module (the default, UCX,
#                              uses its own shared memory/CMA transports between
#                              local processes, and its tcp transport refuses
#                              the loopback: "Destination is unreachable");
#   FI_PROVIDER=tcp            libfabric's TCP provider (not shm);
#   FI_TCP_IFACE=lo            the namespace's only device.
# --yield adds MPIR_CVAR_ENABLE_HEAVY_YIELD=1: a rank waiting for the network
# sleeps between polls instead of spinning (measured: 0.6 s of CPU instead of
# 2.1 s for a 1.7 s transfer at 100mbit; bandwidth unchanged; the 1-byte
# latency rises from ~10 to ~90 us, about that of TCP over real Ethernet).
# Useful when ranks outnumber cores or the machine is shared.
set -uo pipefail

prog="$(basename "$0")"
rate="1gbit"
mtu=1500
burst=""
limit="64mb"
delay=""
stats=""
yield_cpu=false

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    echo "RATE: <number><unit> with unit bit|kbit|mbit|gbit|tbit (e.g. 10gbit, 1gbit, 100mbit), or none"
}

die2() { echo "$prog: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --rate) rate="${2:-}"; shift 2 ;;
        --rate=*) rate="${1#*=}"; shift ;;
        --mtu) mtu="${2:-}"; shift 2 ;;
        --mtu=*) mtu="${1#*=}"; shift ;;
        --burst) burst="${2:-}"; shift 2 ;;
        --burst=*) burst="${1#*=}"; shift ;;
        --limit) limit="${2:-}"; shift 2 ;;
        --limit=*) limit="${1#*=}"; shift ;;
        --delay) delay="${2:-}"; shift 2 ;;
        --delay=*) delay="${1#*=}"; shift ;;
        --yield) yield_cpu=true; shift ;;
        --stats) stats="${2:-}"; shift 2 ;;
        --stats=*) stats="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        *) usage >&2; die2 "unknown argument '$1' (options: --rate --mtu --burst --limit --delay --yield --stats, then -- COMMAND...)" ;;
    esac
done
[ $# -gt 0 ] || { usage >&2; die2 "no COMMAND given after --"; }

# Rate in bits per second (integer), or 0 for none.
rate_bps=0
if [ "$rate" != "none" ]; then
    if [[ ! "$rate" =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)$ ]]; then
        die2 "--rate '$rate' is not valid; give <number><unit> with unit bit, kbit, mbit, gbit or tbit (e.g. 100mbit, 1gbit, 10gbit), or none"
    fi
    case "${BASH_REMATCH[3]}" in
        bit) mult=1 ;; kbit) mult=1000 ;; mbit) mult=1000000 ;; gbit) mult=1000000000 ;; tbit) mult=1000000000000 ;;
    esac
    rate_bps="$(awk -v n="${BASH_REMATCH[1]}" -v m="$mult" 'BEGIN { printf "%.0f", n * m }')"
    [ "$rate_bps" -ge 8000 ] || die2 "--rate '$rate' is below 8kbit; give a rate of at least 8kbit, or none"
fi
[[ "$mtu" =~ ^[0-9]+$ ]] && [ "$mtu" -ge 576 ] && [ "$mtu" -le 65536 ] ||
    die2 "--mtu '$mtu' is not valid; give bytes in [576, 65536] (1500: Ethernet, 9000: jumbo frames)"
if [ -z "$burst" ]; then
    # max(4 frames, 200 us at the rate), in bytes
    burst="$(awk -v r="$rate_bps" -v m="$mtu" 'BEGIN { a = 4 * (m + 14); b = r / 8 * 200e-6; printf "%d", (a > b ? a : b) }')"
fi

# -- can we emulate here? ----------------------------------------------------------
[ "$(id -u)" = 0 ] || die2 "needs root (network namespaces and tc); run as root, or skip the slow-network emulation"
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "$prog: ip/tc missing; installing iproute2" >&2
        apt-get install -y iproute2 >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y iproute2 >/dev/null 2>&1; }
    fi
    command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 ||
        die2 "needs iproute2 (ip, tc) and could not install it (apt-get install -y iproute2)"
fi

ns="dslide-$$"
child=""
cleanup() {
    local code=$?
    trap - EXIT INT TERM HUP
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$child" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$child" 2>/dev/null
    fi
    # a signal between the fork and `child=$!` leaves the command unnamed: end whatever runs in
    # the namespace (it would hold our pipes open for as long as it runs)
    local pids
    pids="$(ip netns pids "$ns" 2>/dev/null)"
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    exit "$code"
}
on_signal() { echo "$prog: interrupted; removing namespace $ns" >&2; exit 130; }
trap cleanup EXIT
trap on_signal INT TERM HUP

err="$(ip netns add "$ns" 2>&1)" || die2 "cannot create network namespace $ns ($err); needs CAP_SYS_ADMIN and namespace support"
nsx() { ip netns exec "$ns" "$@"; }
nsx ip link set lo mtu "$mtu" up || die2 "cannot configure the loopback of $ns"

# netem available? Probe on the namespace's loopback before the real qdisc goes on.
netem=false
if nsx tc qdisc add dev lo root handle 9: netem delay 0ms >/dev/null 2>&1; then
    netem=true
    nsx tc qdisc del dev lo root >/dev/null 2>&1
fi

if [ "$rate" = "none" ]; then
    nsx tc qdisc add dev lo root handle 1: pfifo limit 100000 || die2 "tc could not add a pfifo qdisc in $ns"
else
    err="$(nsx tc qdisc add dev lo root handle 1: tbf rate "$rate" burst "$burst" limit "$limit" 2>&1)" ||
        die2 "tc could not add tbf rate $rate burst $burst limit $limit in $ns ($err)"
fi
if [ -n "$delay" ]; then
    if [ "$netem" = true ]; then
        if [ "$rate" = "none" ]; then
            nsx tc qdisc replace dev lo root handle 1: netem delay "$delay" limit 100000 || die2 "tc could not add netem delay $delay"
        else
            nsx tc qdisc add dev lo parent 1:1 handle 10: netem delay "$delay" limit 100000 || die2 "tc could not add netem delay $delay"
        fi
    else
        die2 "--delay $delay asked for, but the netem qdisc is not available in this kernel (CONFIG_NET_SCH_NETEM); run without --delay: the scaling model (scripts/_costmodel.py) covers latency"
    fi
elif [ "$netem" = false ]; then
    echo "$prog: netem qdisc not available in this kernel: no added delay (loopback latency only); the scaling model (scripts/_costmodel.py) covers latency" >&2
fi

# Local ranks over TCP on the namespace's loopback, not shared memory.
export MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo
[ "$yield_cpu" = true ] && export MPIR_CVAR_ENABLE_HEAVY_YIELD=1
echo "$prog: namespace $ns, lo mtu $mtu, $( [ "$rate" = none ] && echo 'no cap (pfifo, counting only)' || echo "tbf rate $rate burst ${burst} limit $limit" )$( [ -n "$delay" ] && echo ", netem delay $delay" )" >&2

ip netns exec "$ns" "$@" &
child=$!
wait "$child"
rc=$?
child=""

# Root qdisc counters: "Sent N bytes M pkt (dropped D, overlimits O requeues Q)".
read -r qbytes qpkts qdropped qover < <(
    nsx tc -s qdisc show dev lo | awk '
        / root / { root = 1; next }
        /^qdisc/ { root = 0 }
        root && /Sent/ { gsub(/[(),]/, " "); print $2, $4, $7, $9; exit }')
qbytes="${qbytes:-0}"; qpkts="${qpkts:-0}"; qdropped="${qdropped:-0}"; qover="${qover:-0}"
echo "$prog: qdisc sent ${qbytes} bytes, ${qpkts} packets (dropped ${qdropped}, overlimits ${qover}); command exit status $rc" >&2
if [ -n "$stats" ]; then
    printf '{"rate": "%s", "rate_bps": %s, "qdisc_bytes": %s, "qdisc_packets": %s, "dropped": %s, "overlimits": %s, "netem": %s, "delay": "%s", "mtu": %s, "burst_bytes": %s, "limit": "%s", "namespace": "%s", "yield": %s, "exit_code": %s}\n' \
        "$rate" "$rate_bps" "$qbytes" "$qpkts" "$qdropped" "$qover" "$netem" "$delay" "$mtu" \
        "$( [[ "$burst" =~ ^[0-9]+$ ]] && echo "$burst" || echo null )" "$limit" "$ns" "$yield_cpu" "$rc" > "$stats" ||
        echo "$prog: could not write $stats" >&2
fi
exit "$rc"
