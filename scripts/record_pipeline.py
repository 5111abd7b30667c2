"""Record a pipeline-parallel sample: TinyGPT split into stages with torch.distributed.pipelining (gloo, CPU).

Example::

    python scripts/record_pipeline.py sample_traces/pipeline_2stage --microbatches 4

Spawns ``--stages`` processes (one pipeline stage each, world = stages) with torch.multiprocessing.
Stage 0 holds the embeddings and its share of the (MLP-only) blocks, the last stage its blocks, the
final LayerNorm, the LM head and the loss. The GPipe schedule (``ScheduleGPipe``) runs ``--microbatches``
micro-batches per step: all forwards, then all backwards; torch annotates each as ``Forward i`` /
``Backward i`` and the activations and gradients travel as gloo ``send`` / ``recv``. The traces
are written by traceprof's Kineto collector (``collectors/kineto/capture.py``), one
``rank<R>.trace.json.gz`` + ``rank<R>.meta.json`` per stage, and ``out_dir/README.md`` says how.
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
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from tiny_gpt import GPTConfig  # noqa: E402

from traceprof.collectors.kineto.capture import profile_ranks  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path, help="folder for the per-rank files")
    p.add_argument("--stages", type=int, default=2, help="pipeline stages = ranks (default 2)")
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks in all (default 2)")
    p.add_argument("--d-model", type=int, default=64, help="residual width (default 64)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--steps", type=int, default=8, help="training iterations (default 8)")
    p.add_argument("--skip-first", type=int, default=2, help="unprofiled first steps (default 2)")
    p.add_argument("--active", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--slow-stage", type=int, default=None, help="stage that sleeps in every forward")
    p.add_argument(
        "--slow-ms", type=float, default=0.0, help="sleep per micro-batch forward on --slow-stage (ms)"
    )
    p.add_argument(
        "--dp",
        type=int,
        default=1,
        help="data-parallel replicas of the pipeline (default 1); with 2+, world = stages x dp, rank = "
        "replica x stages + stage, a hand-written GPipe (module doc) and a gradient all-reduce per stage",
    )
    p.add_argument(
        "--p2p-group",
        choices=("world", "stage"),
        default="world",
        help="with --dp 2+: the process group of the sends / recvs: the default group (gloo's trace then "
        "names the peer's global rank) or one group per replica's pipeline (it names a group rank)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    p.add_argument("--overwrite", action="store_true", help="delete rank*.* files in out_dir first")
    args = p.parse_args(argv)
    if args.stages < 2 or args.layers < args.stages:
        p.error("need 2+ stages and at least one block per stage")
    if args.batch % args.microbatches:
        p.error(f"--batch {args.batch} is not a multiple of --microbatches {args.microbatches}")
    return args


class MLPBlock(nn.Module):
    """A pre-LayerNorm 4x GELU MLP with a residual (no attention: a pipeline stage needs some
    compute, and fewer ops per micro-batch keep the traces small)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d, elementwise_affine=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(F.gelu(self.fc(self.ln(x))))


class StageModule(nn.Module):
    """One pipeline stage: embeddings on the first, the LM head on the last, MLP blocks on each."""

    def __init__(self, cfg: GPTConfig, blocks: range, first: bool, last: bool, sleep_s: float) -> None:
        super().__init__()
        self.first, self.last, self.sleep_s = first, last, sleep_s
        if first:
            self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
            self.pos = nn.Embedding(cfg.seq, cfg.d_model)
            self.register_buffer("pos_ids", torch.arange(cfg.seq), persistent=False)
        self.blocks = nn.ModuleList(MLPBlock(cfg.d_model) for _ in blocks)
        if last:
            self.ln_f = nn.LayerNorm(cfg.d_model, elementwise_affine=False)
            self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)  # the injected slow stage
        if self.first:
            x = self.tok(x) + self.pos(self.pos_ids[: x.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x


def train_dp(rank: int, world: int, args: argparse.Namespace) -> None:
    """One rank of a pp x dp job (``--dp`` 2+): stage ``rank % stages`` of replica ``rank // stages``.

    torch.distributed.pipelining's ``PipelineStage`` needs its own process group per pipeline (its
    group may not be larger than the stages), and gloo's trace names the peer of a send / recv only
    as a rank in that group; so this GPipe is written out: all forwards (recv the activation from
    the previous stage, compute, send it on), then all backwards (recv the gradient, backward, send
    the input's gradient back), each annotated ``Forward i`` / ``Backward i``; then one all-reduce
    of the flattened gradients over the stage's replicas (its data-parallel group) and SGD.
    """
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    torch.manual_seed(args.seed + rank % args.stages)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    stages = args.stages
    replica, stage_i = divmod(rank, stages)
    dp_groups = [dist.new_group(list(range(s, world, stages))) for s in range(stages)]
    pp_groups = [dist.new_group(list(range(r * stages, (r + 1) * stages))) for r in range(args.dp)]
    p2p_group = pp_groups[replica] if args.p2p_group == "stage" else None
    cfg = GPTConfig(n_layers=args.layers, d_model=args.d_model)
    per = args.layers // stages
    blocks = range(stage_i * per, args.layers if stage_i == stages - 1 else (stage_i + 1) * per)
    sleep_s = args.slow_ms / 1000.0 if stage_i == args.slow_stage else 0.0
    first, last = stage_i == 0, stage_i == stages - 1
    module = StageModule(cfg, blocks, first, last, sleep_s)
    opt = torch.optim.SGD(module.parameters(), lr=1e-2, momentum=0.9, fused=True)
    mb = args.batch // args.microbatches
    gen = torch.Generator().manual_seed(args.seed * 1000 + replica)
    tokens = torch.randint(0, cfg.vocab, (4, args.batch, cfg.seq + 1), generator=gen)
    prev, nxt = rank - 1, rank + 1
    with profile_ranks(
        args.out_dir, skip_first=args.skip_first, wait=1, warmup=1, active=args.active
    ) as prof:
        for it in range(args.steps):
            batch = tokens[it % len(tokens)]
            inputs, outputs = [], []
            for i in range(args.microbatches):
                with torch.profiler.record_function(f"Forward {i}"):
                    if first:
                        x = batch[i * mb : (i + 1) * mb, :-1].contiguous()
                    else:
                        x = torch.empty(mb, cfg.seq, cfg.d_model)
                        dist.recv(x, src=prev, group=p2p_group)
                        x.requires_grad_(True)
                    y = module(x)
                    if last:
                        target = batch[i * mb : (i + 1) * mb, 1:]
                        y = F.cross_entropy(y.reshape(-1, cfg.vocab), target.reshape(-1))
                    else:
                        dist.send(y.detach().contiguous(), dst=nxt, group=p2p_group)
                inputs.append(x)
                outputs.append(y)
            for i in range(args.microbatches):
                with torch.profiler.record_function(f"Backward {i}"):
                    if last:
                        outputs[i].backward()
                    else:
                        g = torch.empty(mb, cfg.seq, cfg.d_model)
                        dist.recv(g, src=nxt, group=p2p_group)
                        outputs[i].backward(g)
                    if not first:
                        dist.send(inputs[i].grad.contiguous(), dst=prev, group=p2p_group)
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_groups[stage_i])
            flat /= args.dp
            at = 0
            for g in grads:
                g.copy_(flat[at : at + g.numel()].view_as(g))
                at += g.numel()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if args.dp > 1:
        train_dp(rank, world, args)
        return
    if hasattr(os, "sched_setaffinity"):  # stage r on core r % n, before gloo's threads exist
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    torch.manual_seed(args.seed + rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = GPTConfig(n_layers=args.layers, d_model=args.d_model)
    per = args.layers // world
    blocks = range(rank * per, args.layers if rank == world - 1 else (rank + 1) * per)
    sleep_s = args.slow_ms / 1000.0 if rank == args.slow_stage else 0.0
    module = StageModule(cfg, blocks, rank == 0, rank == world - 1, sleep_s)
    mb = args.batch // args.microbatches
    example = (
        torch.zeros(mb, cfg.seq, dtype=torch.long) if rank == 0 else torch.zeros(mb, cfg.seq, cfg.d_model),
    )
    stage = PipelineStage(module, rank, world, torch.device("cpu"), input_args=example)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, cfg.vocab), target.reshape(-1))

    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=1e-2, momentum=0.9, fused=True)
    gen = torch.Generator().manual_seed(args.seed * 1000)
    tokens = torch.randint(0, cfg.vocab, (4, args.batch, cfg.seq + 1), generator=gen)
    with profile_ranks(
        args.out_dir, skip_first=args.skip_first, wait=1, warmup=1, active=args.active
    ) as prof:
        for it in range(args.steps):
            batch = tokens[it % len(tokens)]
            if rank == 0:
                schedule.step(batch[:, :-1].contiguous())
            elif rank == world - 1:
                schedule.step(target=batch[:, 1:].contiguous())
            else:
                schedule.step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    train(rank, world, args)


def summarize(out_dir: Path) -> dict[int, dict[str, float]]:
    """Per rank: median ProfilerStep (ms) and the mean ``Forward i`` / ``Backward i`` annotation (ms)."""
    out: dict[int, dict[str, float]] = {}
    for path in sorted(out_dir.glob("rank*.trace.json.gz")):
        trace = json.loads(gzip.decompress(path.read_bytes()))
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        rank = trace["distributedInfo"]["rank"]
        out[rank] = {
            "step_ms": statistics.median(
                e["dur"] / 1e3 for e in events if e["name"].startswith("ProfilerStep#")
            ),
            "fwd_ms": statistics.mean(e["dur"] / 1e3 for e in events if e["name"].startswith("Forward ")),
            "bwd_ms": statistics.mean(e["dur"] / 1e3 for e in events if e["name"].startswith("Backward ")),
        }
    return out


def write_readme(args: argparse.Namespace, argv: list[str], summary: dict[int, dict[str, float]]) -> None:
    meta = json.loads((args.out_dir / "rank0.meta.json").read_text())
    steps = meta["profiled_steps"]
    date = time.strftime("%Y-%m-%d", time.gmtime(meta["written_at_ns"] / 1e9))
    command = " ".join(a for a in argv if a != "--overwrite")
    slow = (
        f"stage {args.slow_stage} sleeps {args.slow_ms:g} ms in every micro-batch forward"
        if args.slow_stage is not None and args.slow_ms
        else "nothing injected"
    )
    mesh = (
        f"a {args.stages}-stage pipeline (mesh `pp:{args.stages}`, rank r = stage r)"
        if args.dp == 1
        else f"{args.dp} data-parallel replicas of a {args.stages}-stage pipeline (mesh `dp:{args.dp},pp:{args.stages}`, "
        f"rank r = stage r % {args.stages} of replica r // {args.stages}; sends / recvs in the "
        f"{'default group' if args.p2p_group == 'world' else 'replica pipeline group'}, the stage's gradients "
        "all-reduced over its replicas; hand-written GPipe, `train_dp`)"
    )
    rows = "\n".join(
        f"| {r} | {r % args.stages} | {v['step_ms']:.1f} | {v['fwd_ms']:.2f} | {v['bwd_ms']:.2f} |"
        for r, v in sorted(summary.items())
    )
    text = f"""# {args.out_dir.name}

Recorded with traceprof's Kineto collector (`collectors/kineto/capture.py`) by

    python scripts/record_pipeline.py {command}

(add `--overwrite` to replace an earlier recording).

- **Known**: {mesh}, GPipe schedule with
  {args.microbatches} micro-batches per step, so the schedule's own bubble is (p-1)/(m+p-1) =
  {args.stages - 1}/{args.microbatches + args.stages - 1} of a step; {slow}. The last stage also runs the LM
  head and the loss.
- **When, where**: {date}, torch {meta["torch_version"]}, 2-core CPU VM without GPU, backend gloo;
  {args.stages * args.dp} ranks spawned by torch.multiprocessing on one host, one torch thread each, rank r pinned
  to core r % 2.
- **Job**: {args.layers} pre-LayerNorm 4x GELU MLP blocks (no attention, to keep the traces small) split
  evenly over the stages, d_model {args.d_model}, seq 64, vocab 512, token and position embeddings on
  stage 0, LM head and cross-entropy on the last; batch {args.batch} sequences per step in {args.microbatches} micro-batches;
  {"`torch.distributed.pipelining` `PipelineStage` + `ScheduleGPipe`" if args.dp == 1 else "a hand-written GPipe"} (each micro-batch annotated
  `Forward i` / `Backward i`; activations and gradients sent with gloo `send` / `recv`); fused SGD;
  seed {args.seed}.
- **Profiled**: {args.steps} iterations; schedule skip_first {args.skip_first}, wait 1, warmup 1, active
  {args.active}, so the traces hold ProfilerStep#{steps[0]}..#{steps[-1]}.
- **Files**: `rank<R>.trace.json.gz` (Kineto Chrome trace), `rank<R>.meta.json` (sidecar).

Measured from the traces:

| rank | stage | median step (ms) | mean `Forward i` (ms) | mean `Backward i` (ms) |
|---|---|---|---|---|
{rows}
"""
    (args.out_dir / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stale = sorted(args.out_dir.glob("rank*.*")) if args.out_dir.is_dir() else []
    if stale and not args.overwrite:
        sys.exit(f"{args.out_dir} already holds {stale[0].name} and more; pass --overwrite")
    for path in stale:
        path.unlink()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = args.stages * args.dp
    mp.spawn(_spawned, args=(world, port, args), nprocs=world)
    summary = summarize(args.out_dir)
    write_readme(args, sys.argv[1:] if argv is None else argv, summary)
    for rank, v in sorted(summary.items()):
        print(
            f"rank {rank}: median step {v['step_ms']:.1f} ms, forward {v['fwd_ms']:.2f} ms, backward {v['bwd_ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()
