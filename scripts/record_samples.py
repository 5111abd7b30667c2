"""Record a sample trace set: a small GPT-like DDP job on CPU (gloo) under traceprof's Kineto collector.

Examples::

    python scripts/record_samples.py sample_traces/normal
    python scripts/record_samples.py sample_traces/straggler_rank2 --slow-rank 2 --slow-ms 30
    python scripts/record_samples.py sample_traces/extra_matmul --extra-matmul

Spawns ``--world-size`` processes with torch.multiprocessing (or runs as one worker when launched
by torchrun, i.e. when ``RANK`` and ``WORLD_SIZE`` are set). Each rank trains on its own random
tokens with one torch thread; ``out_dir`` receives ``rank<R>.trace.json.gz`` and
``rank<R>.meta.json`` per rank (optionally ``rank<R>.fr.json``), and the script prints each
rank's median ProfilerStep duration and all-reduce arrival order read back from the traces, which
also go into ``out_dir/README.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from tiny_gpt import GPTConfig, TinyGPT  # noqa: E402

from traceprof.collectors.flight_recorder.capture import dump_fr_json, enable_fr  # noqa: E402
from traceprof.collectors.kineto.capture import profile_ranks  # noqa: E402

FR_BUFFER_ENTRIES = 2000  # Flight Recorder ring size (collective records per rank)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path, help="folder for the per-rank files")
    p.add_argument("--world-size", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--steps", type=int, default=8, help="training iterations (default 8)")
    p.add_argument("--skip-first", type=int, default=2, help="unprofiled first steps (default 2)")
    p.add_argument("--wait", type=int, default=1, help="profiler wait steps (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps (default 1)")
    p.add_argument("--active", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--slow-rank", type=int, default=None, help="rank to slow down")
    p.add_argument("--slow-ms", type=float, default=0.0, help="sleep per step on --slow-rank (ms)")
    p.add_argument(
        "--slow-every",
        type=int,
        default=1,
        help="sleep only on every K-th iteration (those whose ProfilerStep number is a multiple of K; "
        "default 1: every step): the steps in between are the same job without the delay, "
        "recorded under the same machine load (benchmarks/validate_critical_path.py)",
    )
    p.add_argument(
        "--slow-at",
        choices=("backward", "step"),
        default="backward",
        help="where --slow-rank sleeps: after forward, before backward (default), or before each "
        "step starts (before its forward pass)",
    )
    p.add_argument("--extra-matmul", action="store_true", help="one extra matmul per block")
    p.add_argument(
        "--extra-cols",
        type=int,
        default=0,
        help="width of the extra matmul (implies --extra-matmul; default 4*d_model = +17.8%% FLOPs; "
        "96, 288, 864 give +3.3, +10, +30%%)",
    )
    p.add_argument(
        "--extra-rank",
        type=int,
        default=None,
        help="run the extra matmul on this rank only (a compute straggler; default: every rank)",
    )
    p.add_argument("--bucket-cap-mb", type=float, default=0.5, help="DDP bucket size (MB)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--d-model", type=int, default=128, help="residual width (default 128)")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--flight-recorder", action="store_true", help="also write rank<R>.fr.json")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin rank r to core r %% n")
    p.add_argument("--readme-only", action="store_true", help="only rewrite out_dir/README.md")
    p.add_argument("--overwrite", action="store_true", help="delete rank*.* files in out_dir first")
    args = p.parse_args(argv)
    if args.extra_cols or args.extra_rank is not None:
        args.extra_matmul = True
    if args.extra_cols < 0:
        p.error(f"--extra-cols {args.extra_cols} is negative")
    if args.extra_rank is not None and not 0 <= args.extra_rank < args.world_size:
        p.error(f"--extra-rank {args.extra_rank} is not a rank of --world-size {args.world_size}")
    if args.slow_every < 1:
        p.error(f"--slow-every {args.slow_every}: must be 1 or more")
    if args.slow_rank is not None and not 0 <= args.slow_rank < args.world_size:
        p.error(f"--slow-rank {args.slow_rank} is not a rank of --world-size {args.world_size}")
    return args


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    """Run the profiled training loop on one rank (process group must not exist yet)."""
    if args.pin and hasattr(os, "sched_setaffinity"):
        # Before any thread exists, so gloo's threads inherit it: rank r on core r % n_cores.
        # Pinned pairs time-slice one core evenly; unpinned, the scheduler migrates ranks and
        # the natural arrival skew at all-reduces grows to tens of ms on 2 cores.
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    extra = args.extra_matmul and args.extra_rank in (None, rank)
    cfg = GPTConfig(
        n_layers=args.layers, d_model=args.d_model, extra_matmul=extra, extra_cols=args.extra_cols
    )
    # forward_sync_buffers=False: the buffers (causal mask, position ids) are constant, so each step's
    # collectives are just the gradient all-reduces of DDP's buckets.
    model = DDP(TinyGPT(cfg), bucket_cap_mb=args.bucket_cap_mb, forward_sync_buffers=False)
    # Fused SGD: one optimizer op per step. Per-parameter optimizer ops (AdamW here) would
    # double the trace size for no analytical gain.
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, fused=True)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    tokens = torch.randint(0, cfg.vocab, (4, args.batch, cfg.seq + 1), generator=gen)
    slow_s = args.slow_ms / 1000.0 if rank == args.slow_rank else 0.0

    with profile_ranks(
        args.out_dir,
        skip_first=args.skip_first,
        wait=args.wait,
        warmup=args.warmup,
        active=args.active,
    ) as prof:
        for it in range(args.steps):
            batch = tokens[it % len(tokens)]
            slow = slow_s if it % args.slow_every == 0 else 0.0  # ProfilerStep#it
            if slow and args.slow_at == "step":
                time.sleep(slow)  # the known straggler: starts every step late
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), batch[:, 1:].reshape(-1))
            if slow and args.slow_at == "backward":
                time.sleep(slow)  # the known straggler: late for the gradient all-reduce
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()

    if args.flight_recorder:
        dump_fr_json(args.out_dir)
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    train(rank, world_size, args)


def summarize(out_dir: Path) -> dict[int, dict[str, float]]:
    """Read the written traces back: per rank, step time and gradient all-reduce arrivals.

    All-reduces are matched across ranks by order (the k-th ``c10d::allreduce_`` of every rank is
    one instance; DDP issues them in the same bucket order everywhere). Arrival is the op's start,
    i.e. when the DDP reducer enqueues the bucket. One host, so no clock alignment is needed.

    Returns:
        ``{rank: {"step_ms": median ProfilerStep duration (ms), "last": instances where this rank
        arrived last (count), "late_ms": mean arrival after the first rank's (ms)}}``.
    """
    steps: dict[int, float] = {}
    arrivals: dict[int, list[int]] = {}
    for path in sorted(out_dir.glob("rank*.trace.json.gz")):
        trace = json.loads(gzip.decompress(path.read_bytes()))
        rank, base = trace["distributedInfo"]["rank"], trace["baseTimeNanoseconds"]
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        steps[rank] = statistics.median(
            e["dur"] / 1e3 for e in events if e["name"].startswith("ProfilerStep#")
        )
        arrivals[rank] = sorted(
            base + round(e["ts"] * 1e3) for e in events if e["name"] == "c10d::allreduce_"
        )
    n = min(len(a) for a in arrivals.values())
    out = {r: {"step_ms": steps[r], "last": 0, "late_ms": 0.0} for r in steps}
    for k in range(n):
        first = min(a[k] for a in arrivals.values())
        out[max(arrivals, key=lambda r: arrivals[r][k])]["last"] += 1
        for r, a in arrivals.items():
            out[r]["late_ms"] += (a[k] - first) / 1e6 / n
    return out


def write_readme(args: argparse.Namespace, argv: list[str], summary: dict[int, dict[str, float]]) -> None:
    """Write ``out_dir/README.md``: how the folder was recorded and what is known about it."""
    meta = json.loads((args.out_dir / "rank0.meta.json").read_text())
    if args.slow_rank is not None and args.slow_ms:
        mate = [r for r in range(args.world_size) if r % 2 == args.slow_rank % 2 and r != args.slow_rank]
        where = (
            "at the start of every step, before its forward pass"
            if args.slow_at == "step"
            else "every step after its forward pass, before backward"
        )
        if args.slow_every > 1:
            where = where.replace(
                "every step",
                f"one step in {args.slow_every} (ProfilerStep#N with N % {args.slow_every} == 0)",
            )
        known = (
            f"rank {args.slow_rank} sleeps {args.slow_ms:g} ms {where} (nothing marks the "
            "sleep: it is a gap between CPU ops on its main "
            "thread), so it reaches the gradient all-reduces late and the others wait for it in "
            f"`gloo:all_reduce`. While it sleeps its core-mate (rank {', '.join(map(str, mate))}) "
            "has a core to itself and runs ahead, so the job's step time grows by less than the sleep."
        )
    elif args.extra_matmul:
        cols = args.extra_cols or 4 * args.d_model
        where = (
            "every rank" if args.extra_rank is None else f"rank {args.extra_rank} only (a compute straggler)"
        )
        shape = "(d, 4d)" if cols == 4 * args.d_model else f"(d, {cols}), zero-padded to 4d,"
        known = (
            f"one extra parameter-free matmul per block on {where}, (B*T, d) @ {shape} added to the MLP's "
            "hidden activation: more model FLOPs (nearly all in `aten::mm`; the sidecar's figure is "
            "below), same parameters and collectives; a real compute regression against `normal`."
        )
    else:
        known = "nothing injected: the unchanged job."
    n_ar = sum(int(v["last"]) for v in summary.values())
    rows = "\n".join(
        f"| {r} | {v['step_ms']:.1f} | {int(v['last'])} of {n_ar} | {v['late_ms']:.1f} |"
        for r, v in sorted(summary.items())
    )
    fr = ", `rank<R>.fr.json` (Flight Recorder JSON dump)" if args.flight_recorder else ""
    steps = meta["profiled_steps"]
    date = time.strftime("%Y-%m-%d", time.gmtime(meta["written_at_ns"] / 1e9))
    command = " ".join(a for a in argv if a not in ("--overwrite", "--readme-only"))
    text = f"""# {args.out_dir.name}

Recorded with traceprof's Kineto collector (`collectors/kineto/capture.py`) by

    python scripts/record_samples.py {command}

(add `--overwrite` to replace an earlier recording; `--readme-only` rewrites this file from the
traces).

- **Known**: {known}
- **When, where**: {date}, torch {meta["torch_version"]}, 2-core CPU VM without GPU, backend gloo;
  {args.world_size} ranks spawned by torch.multiprocessing on one host, one torch thread each, rank r
  pinned to core r % 2 (two ranks share each core, so step times vary by about 15 % between runs).
- **Job**: TinyGPT (`scripts/tiny_gpt.py`): {args.layers} blocks, d_model {args.d_model}, 4 heads, seq 64,
  vocab 512, no biases, non-parametric LayerNorm; batch {args.batch} sequences per rank; DDP with
  bucket_cap_mb {args.bucket_cap_mb:g} ({n_ar // len(steps)} gradient all-reduces per step, the only collectives in a step)
  and forward_sync_buffers off; fused SGD; seed {args.seed}.
- **Profiled**: {args.steps} iterations; schedule skip_first {args.skip_first}, wait {args.wait}, warmup
  {args.warmup}, active {args.active}, so the traces hold ProfilerStep#{steps[0]}..#{steps[-1]}.
- **Files**: `rank<R>.trace.json.gz` (Kineto Chrome trace), `rank<R>.meta.json` (sidecar){fr}.
- **Model FLOPs** per step and rank (sidecar, torch `with_flops`): {meta["flops_total"] / len(steps):.6g}.

Measured from the traces (all-reduces matched across ranks by order; arrival = start of the
rank's `c10d::allreduce_`):

| rank | median step (ms) | arrived last | mean arrival after the first rank (ms) |
|---|---|---|---|
{rows}
"""
    (args.out_dir / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.readme_only:
        stale = sorted(args.out_dir.glob("rank*.*")) if args.out_dir.is_dir() else []
        if stale and not args.overwrite:
            sys.exit(f"{args.out_dir} already holds {stale[0].name} and more; pass --overwrite")
        for path in stale:
            path.unlink(missing_ok=True)  # missing_ok: under torchrun every rank does this
        if args.flight_recorder:
            enable_fr(FR_BUFFER_ENTRIES)  # before any process group exists (children inherit env)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: files only, no README
            train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_spawned, args=(args.world_size, port, args), nprocs=args.world_size)
    summary = summarize(args.out_dir)
    write_readme(args, sys.argv[1:] if argv is None else argv, summary)
    for rank, v in sorted(summary.items()):
        print(
            f"rank {rank}: median step {v['step_ms']:.1f} ms, arrived last {int(v['last'])}x, "
            f"mean arrival after first {v['late_ms']:.1f} ms"
        )


if __name__ == "__main__":
    main()
