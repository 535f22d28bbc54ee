"""One decode step as it ran: the CSV of libdsv4_trace.so (kernel start / end on the GPU clock, nothing
serialised) → per kernel its duration and its *exposed* time, end − the previous kernel's end: what it added
to the step. With programmatic dependent launch a kernel starts before its predecessor ends, so durations
overlap and sum to more than the step; exposed times sum to the step (less the first kernel's start).

    python3 tools/trace/timeline.py TRACE.csv [--prefill] [--sequence] [--rank R]

--prefill takes the trace's last long step (kernel_names.prefill_step) instead of its last step. --rank R
reads one GPU of a several-GPU run (--tp / --ep): each rank launches on a stream of its own, the R-th stream
that starts a step (ranks create their streams in order).
"""
import collections
import csv
import os
import signal
import sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_names import short, last_step, prefill_step  # noqa: E402

rows = list(csv.DictReader(open(sys.argv[1])))
kernels = [(r["name"], int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), int(r["grid_blocks"]),
            int(r["block_threads"])) for r in rows]
if "--rank" in sys.argv[2:]:
    rank = int(sys.argv[sys.argv.index("--rank") + 1])
    streams = sorted({k[3] for k in kernels if short(k[0]).startswith("embed_kernel")})
    if rank >= len(streams):
        raise SystemExit(f"--rank {rank}: the trace has {len(streams)} ranks")
    kernels = sorted((k for k in kernels if k[3] == streams[rank]), key=lambda k: k[1])
step = prefill_step(kernels) if "--prefill" in sys.argv[2:] else last_step(kernels)
if len({k[3] for k in step}) > 1:
    print("note: the step's kernels ran on several streams; exposed times assume one")
step_start, step_end = step[0][1], max(k[2] for k in step)
groups = collections.OrderedDict()
sequence = "--sequence" in sys.argv[2:]
prev_end = step_start
if sequence:
    print(f"{'#':>4} {'kernel':40} {'start':>8} {'dur':>7} {'gap':>6} {'exposed':>8} {'blocks':>7} {'threads':>7}"
          "   (µs from the step's start)")
for i, (name, start, end, _, blocks, threads) in enumerate(step):
    k = short(name)
    dur, gap, exposed = (end - start) / 1e3, (start - prev_end) / 1e3, (end - prev_end) / 1e3
    if sequence:
        print(f"{i:4d} {k:40.40} {(start - step_start) / 1e3:8.1f} {dur:7.1f} {gap:6.1f} {exposed:8.1f} {blocks:7d} "
              f"{threads:7d}")
    n, d, e = groups.get(k, (0, 0.0, 0.0))
    groups[k] = (n + 1, d + dur, e + exposed)
    prev_end = max(prev_end, end)
wall = (step_end - step_start) / 1e3
print(f"{'kernel':40} {'launches':>8} {'duration µs':>12} {'exposed µs':>11} {'share':>6}")
for k, (n, d, e) in sorted(groups.items(), key=lambda kv: -kv[1][2]):
    print(f"{k:40.40} {n:8d} {d:12.1f} {e:11.1f} {100 * e / wall:5.1f}%")
busy = sum(d for _, d, _ in groups.values())
print(f"{'step (first start to last end)':40} {len(step):8d} {busy:12.1f} {wall:11.1f}")
