"""The parallelism mesh of a run: each rank's coordinate on each axis, and the axis of each group.

A helper of ``traceprof.analyses.parallelism`` (not an analysis). Axis names: ``dp``, ``dp_shard``,
``dp_replicate``, ``tp``, ``pp``, ``cp``, ``ep`` (:data:`AXIS_WORDS` says which words of a group's
name or description give which), ``dim<k>`` for an axis found by structure alone.

Algorithm:
  1. Groups: every process group the run records, with name, description and member ranks: the
     collectors' normalized ``traces.meta.process_groups`` (Kineto ``distributedInfo.pg_config``,
     Flight Recorder ``pg_config`` and entries), the ``collectives`` rows' (``pg``, ``pg_ranks``),
     and for a group with a name but no member list (NDTimeline's groups, which name them exactly)
     the ranks holding its rows.
  2. Axis words: a group's name and description are split into lower-case words (``mesh_dp_shard``
     -> mesh, dp, shard; ``TENSOR_MODEL_PARALLEL_GROUP`` -> tensor, model, parallel, group;
     ``pp0:1->2:fwd`` -> pp, fwd; trailing digits dropped) and looked up in :data:`AXIS_WORDS`. One
     axis: a group of that axis; two or more (``dp_shard_cp``, ``tensor_and_data_parallel``): a
     group spanning them (no axis of its own); ``default_pg`` / ``world``: the world; an
     ``embedding`` group (first and last pipeline stage) is no axis.
  3. Families: the groups of one axis, merged where they share ranks (NDTimeline's stage pairs
     pp0:0->1 and pp0:1->2 join into the pipeline of replica 0), are that axis' groups: all of one
     size, else the axis is dropped with a note. Groups without axis words (of 2 to world-1 ranks,
     evenly spaced) of one (size, stride) that tile the world (disjoint, of one size, covering every
     rank: {1, 2, 3} alone in a world of 6 is a subgroup, no axis, with a note) are an axis found by structure:
     ``pp`` when its traffic is point-to-point only, ``ep`` when all-to-all only, else
     ``dim<stride>``, or ``dim<stride>_<size>`` where an axis of that name exists already (groups
     of 2 and of 3, both stride 1: ``dim1`` and ``dim1_3``).
  4. One mesh: the candidate axes of step 3 must fit together. In a mesh the members of a group of
     one axis share their coordinate on every other axis (so two groups of different axes share at
     most one rank), and the sizes multiply to the world size or a divisor of it. Blocks of 3
     ({0, 1, 2}, {3, 4, 5}) and stride-2 groups of 3 ({0, 2, 4}, {1, 3, 5}) in a world of 6 cannot
     both be axes ({0, 1, 2} holds 0 and 2 of {0, 2, 4}; 3 x 3 = 9); blocks of 2 and stride-2 groups of
     3 can (a 3 x 2 mesh). Where they do not fit, axes are kept one at a time, each when it fits the
     ones kept: named before found by structure, smaller groups first (a larger one that clashes is
     most often a product of axes, a flattened DeviceMesh), more collectives rows on its groups,
     smaller stride; each one left out is a note naming its groups, the axis it clashes with and
     the ranks that show it.
  5. Coordinates: a rank's coordinate on an axis is its position in its group of the axis (sorted
     ranks). NDTimeline traces give them directly (``traces.meta`` ``stage`` and ``dp_rank``: pp and
     dp; tensor parallelism is collapsed there, one worker per TP group). A mesh the user states
     (``pp:4,dp:2,tp:8``, outermost first) replaces all of this: the last axis varies fastest,
     rank = sum of coordinate x stride.
  6. Completion: axes whose sizes multiply to less than the world size leave one more axis, the
     rest (``dp`` when there is no data-parallel axis yet, else ``rest``): a rank's coordinate is
     its position among the ranks that share its other coordinates. A run with no axis at all and
     the world group recorded is one axis of the world size: ``pp`` when ranks exchange
     point-to-point traffic (a pipeline's activations), else ``dp`` (DDP). With no group recorded
     at all the axis is ``world`` (unknown: state the mesh).
  7. Order: axes by the stride of their groups, outermost (largest) first.
  8. The axis of a group (:meth:`Mesh.label`): a group of an axis left out in step 4 is that axis
     (its members' coordinates on the kept axes would call the stride-2 groups of 3 above
     ``dp+dim1``, a label of 6 ranks for groups of 3); else the axes along which its members'
     coordinates differ, joined by ``+`` in mesh order (``dp``, ``dp+pp``); a group of every rank of
     a mesh of two or more axes is ``world``.

Work: linear in the groups and ranks (plus one sort), never in events.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import polars as pl

from traceprof.core.errors import UsageError
from traceprof.core.text import COUNTED, first_few
from traceprof.engine.arrivals import components
from traceprof.storage.store import Store

__all__ = ["AXIS_WORDS", "Axis", "Mesh", "Group", "infer", "parse_mesh", "axis_words", "run_groups"]

#: Words of a group's name or description and the axis they name (module doc, step 2).
AXIS_WORDS = {
    "tp": "tp",
    "tensor": "tp",
    "pp": "pp",
    "pipeline": "pp",
    "pipe": "pp",
    "dp": "dp",
    "data": "dp",
    "ddp": "dp",
    "shard": "dp_shard",
    "fsdp": "dp_shard",
    "replicate": "dp_replicate",
    "cp": "cp",
    "context": "cp",
    "sp": "cp",
    "sequence": "cp",
    "dsp": "cp",
    "ep": "ep",
    "expert": "ep",
    "moe": "ep",
}
_WORLD_WORDS = frozenset({"world", "default"})
_NOT_AXIS = frozenset({"embedding", "embd"})
_DP_AXES = ("dp", "dp_shard", "dp_replicate")
_WORD = re.compile(r"[^a-z0-9]+")


def axis_words(*texts: str | None) -> tuple[frozenset[str], bool, bool]:
    """(axes named, names the world, names an embedding group) of a group's name and description
    (module doc, step 2)."""
    words: set[str] = set()
    for t in texts:
        if t:
            words |= {re.sub(r"\d+$", "", w) for w in _WORD.split(t.lower()) if w}
    axes = {AXIS_WORDS[w] for w in words if w in AXIS_WORDS}
    if axes & {"dp_shard", "dp_replicate"}:  # dp_shard / dp_replicate: the dp word is theirs
        axes.discard("dp")
    return frozenset(axes), bool(words & _WORLD_WORDS), bool(words & _NOT_AXIS)


@dataclass(frozen=True)
class Group:
    """A process group: name (``collectives.pg``; a Flight Recorder ``:p2p`` suffix dropped),
    description (or None) and member ranks (sorted)."""

    name: str | None
    desc: str | None
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Axis:
    """An axis of the mesh: name, size (ranks per group), stride (rank distance of neighbours in
    its groups, for the order) and how it was found."""

    name: str
    size: int
    found_by: str
    stride: float = 0.0


@dataclass(frozen=True)
class Mesh:
    """The mesh of a run: ``axes`` outermost first, ``coords`` rank -> coordinate per axis (None
    where unknown), ``world_size``, ``notes``, and the candidate axes left out of it (step 4) with
    their groups (``left_out``: (axis, groups), each group's ranks sorted)."""

    axes: tuple[Axis, ...]
    coords: dict[int, tuple[int | None, ...]]
    world_size: int
    notes: tuple[str, ...] = field(default=())
    left_out: tuple[tuple[Axis, tuple[tuple[int, ...], ...]], ...] = field(default=())

    def axis(self, name: str) -> int | None:
        """Position of axis ``name`` in :attr:`axes`, or None."""
        return next((i for i, a in enumerate(self.axes) if a.name == name), None)

    def label(self, members: Iterable[int]) -> str | None:
        """The axis label of a group of ``members`` (module doc, step 8); None when fewer than two
        members have coordinates."""
        ranks = tuple(sorted(set(members)))
        left = next((a.name for a, gs in self.left_out if ranks in gs), None)
        if left is not None:  # a group of a left-out axis: that axis, not the mesh axes it cuts across
            return left
        known = [self.coords[r] for r in ranks if r in self.coords]
        if len(known) < 2:
            return None
        varying = [
            a.name for i, a in enumerate(self.axes) if len({c[i] for c in known if c[i] is not None}) > 1
        ]
        multi = sum(1 for a in self.axes if a.size > 1)
        if not varying:
            return None
        if multi >= 2 and len(set(members)) == self.world_size and len(varying) == multi:
            return "world"
        return "+".join(varying)

    def frame(self, traced: Iterable[int]) -> pl.DataFrame:
        """The ``ranks`` table: rank, traced (bool), one column per axis (coordinate, null unknown)."""
        ranks = sorted(self.coords)
        seen = set(traced)
        data: dict[str, list[Any]] = {"rank": ranks, "traced": [r in seen for r in ranks]}
        for i, a in enumerate(self.axes):
            data[a.name] = [self.coords[r][i] for r in ranks]
        return pl.DataFrame(
            data, schema={"rank": pl.Int32, "traced": pl.Boolean, **{a.name: pl.Int32 for a in self.axes}}
        )


def parse_mesh(text: str, world: int) -> list[tuple[str, int]]:
    """A mesh stated as ``pp:4,dp:2,tp:8`` (outermost first) as [(axis, size)].

    Raises:
        UsageError: Not ``name:size`` pairs, a size below 1, a name twice, or sizes whose product
            is not the run's world size.
    """
    out: list[tuple[str, int]] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, size = part.partition(":")
        name = name.strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not size.strip().isdigit() or int(size) < 1:
            raise UsageError(f"mesh={text!r}: expected axis:size pairs such as pp:4,dp:2,tp:8 (got {part!r})")
        if name in {n for n, _ in out}:
            raise UsageError(f"mesh={text!r}: axis {name!r} given twice")
        out.append((name, int(size)))
    if not out:
        raise UsageError(f"mesh={text!r}: expected axis:size pairs such as pp:4,dp:2,tp:8")
    product = 1
    for _, n in out:
        product *= n
    if product != world:
        raise UsageError(f"mesh={text!r}: the sizes multiply to {product}, but the run has {world} ranks")
    return out


def _stated(text: str, world: int) -> Mesh:
    axes = parse_mesh(text, world)
    coords: dict[int, tuple[int | None, ...]] = {}
    for r in range(world):
        c, rest = [], r
        for _, n in reversed(axes):
            c.append(rest % n)
            rest //= n
        coords[r] = tuple(reversed(c))
    stride, out = 1, []
    for name, n in reversed(axes):
        out.append(Axis(name, n, f"stated (-p mesh={text})", float(stride)))
        stride *= n
    return Mesh(tuple(reversed(out)), coords, world)


def run_groups(store: Store, run_id: int) -> tuple[list[Group], dict[int, list[Group]]]:
    """The run's groups (module doc, step 1) and each traced rank's own groups (from its traces'
    ``process_groups``)."""
    traces = store.sql(
        "SELECT rank, json_extract(meta, '$.process_groups') AS pgs FROM traces WHERE run_id = ?", [run_id]
    )
    groups: dict[tuple[str | None, tuple[int, ...]], Group] = {}
    own: dict[int, list[Group]] = {}
    descs: dict[str, str] = {}
    for rank, text in traces.iter_rows():
        try:
            pgs = msgspec.json.decode(text) if text else []
        except msgspec.DecodeError:
            pgs = []
        for g in pgs if isinstance(pgs, list) else []:
            ranks = g.get("ranks") if isinstance(g, dict) else None
            name, desc = (g.get("name"), g.get("desc")) if isinstance(g, dict) else (None, None)
            if isinstance(name, str) and isinstance(desc, str) and desc:
                descs.setdefault(name, desc)
            if not isinstance(ranks, list) or not ranks or not all(isinstance(x, int) for x in ranks):
                continue
            grp = Group(
                name if isinstance(name, str) else None,
                desc if isinstance(desc, str) else None,
                tuple(sorted(set(ranks))),
            )
            groups.setdefault((grp.name, grp.ranks), grp)
            if rank is not None:
                own.setdefault(int(rank), []).append(grp)
    rows = store.sql(
        """SELECT regexp_replace(pg, ':p2p$', '') AS pg, pg_ranks, list(DISTINCT rank ORDER BY rank) AS seen
           FROM collectives WHERE run_id = ? AND pg IS NOT NULL GROUP BY ALL""",
        [run_id],
    )
    for pg, pg_ranks, seen in rows.iter_rows():
        ranks = _ranks(pg_ranks) or tuple(int(r) for r in seen)
        if (pg, ranks) not in groups:
            groups[(pg, ranks)] = Group(pg, descs.get(pg), ranks)
    return list(groups.values()), own


def _ranks(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        v = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return tuple(sorted(int(x) for x in v)) if isinstance(v, list) and v else None


def _listed(groups: list[tuple[int, ...]], n: int = 3) -> str:
    """The first ``n`` groups as ``{1, 2, 3}``, then how many more."""
    return first_few(groups, n, more=COUNTED, shown=lambda g: "{" + ", ".join(map(str, g)) + "}")


def _stride(groups: list[tuple[int, ...]]) -> float:
    return (
        float(statistics.median((g[-1] - g[0]) / (len(g) - 1) for g in groups if len(g) > 1))
        if groups
        else 0.0
    )


def _family(
    name: str, comps: list[tuple[int, ...]], found_by: str, notes: list[str]
) -> tuple[Axis, dict[int, int]] | None:
    sizes = sorted({len(c) for c in comps})
    if len(sizes) != 1:
        notes.append(
            f"axis {name}: its groups have {', '.join(map(str, sizes))} ranks, not one size: left out "
            "(state the mesh with -p mesh=...)"
        )
        return None
    coord = {r: i for c in comps for i, r in enumerate(c)}
    return Axis(name, sizes[0], found_by, _stride(comps)), coord


def _ndtimeline(store: Store, run_id: int) -> tuple[list[tuple[Axis, dict[int, int]]], list[str]] | None:
    df = store.sql(
        """SELECT rank, try_cast(json_extract(meta, '$.stage') AS INTEGER) AS stage,
                  try_cast(json_extract(meta, '$.dp_rank') AS INTEGER) AS dp,
                  json_extract_string(meta, '$.parallelism.tp_size') AS tp
           FROM traces WHERE run_id = ? AND source = 'ndtimeline'""",
        [run_id],
    )
    if df.is_empty() or df["stage"].null_count() or df["dp"].null_count():
        return None
    out = []
    first = df.row(0, named=True)
    for col, axis, other in (("stage", "pp", "dp"), ("dp", "dp", "stage")):
        coord = {int(r): int(c) for r, c in zip(df["rank"], df[col], strict=True)}
        # stride: the rank distance between neighbours on the axis, among the workers that share
        # the other coordinate with the first worker
        line = sorted(
            (int(c), int(r))
            for r, c, o in zip(df["rank"], df[col], df[other], strict=True)
            if o == first[other]
        )
        stride = (line[-1][1] - line[0][1]) / (len(line) - 1) if len(line) > 1 else 0.0
        out.append(
            (
                Axis(
                    axis,
                    len(set(coord.values())),
                    f"NDTimeline: each worker's {'stage' if col == 'stage' else 'dp_rank'}",
                    abs(stride),
                ),
                coord,
            )
        )
    workers = df["rank"].n_unique()
    world = store.sql("SELECT max(world_size) FROM traces WHERE run_id = ?", [run_id]).item()
    tp = df["tp"].drop_nulls()
    notes = (
        [
            f"NDTimeline traces hold one worker per {world // workers} GPUs (tensor parallelism, tp "
            f"{tp[0] if tp.len() else '?'}, and sequence parallelism are collapsed): the mesh is over the "
            f"{workers} workers"
        ]
        if world and world > workers
        else []
    )
    return out, notes


def infer(store: Store, run_id: int, stated: str = "") -> tuple[Mesh, list[Group], dict[int, list[Group]]]:
    """The mesh of a run (module doc), its groups and each rank's own groups.

    Args:
        store: An open store.
        run_id: The run.
        stated: The user's mesh (``pp:4,dp:2,tp:8``), "" to infer it.

    Raises:
        UsageError: A stated mesh that is malformed or does not multiply to the world size.
    """
    traced = store.sql("SELECT DISTINCT rank FROM traces WHERE run_id = ? AND rank IS NOT NULL", [run_id])[
        "rank"
    ]
    world = int(
        store.sql("SELECT coalesce(max(world_size), 0) FROM runs WHERE run_id = ?", [run_id]).item() or 0
    )
    world = max(world, int(traced.max()) + 1 if traced.len() else 1)  # type: ignore[arg-type]
    groups, own = run_groups(store, run_id)
    if stated:
        return _stated(stated, world), groups, own
    notes: list[str] = []
    nd = _ndtimeline(store, run_id)
    found: list[tuple[Axis, dict[int, int]]] = []
    left: list[tuple[Axis, tuple[tuple[int, ...], ...]]] = []
    if nd is not None:
        found, nd_notes = nd
        notes += nd_notes
        world = traced.n_unique()  # one worker per collapsed group: the mesh is over the workers
    else:
        found, left = _from_groups(store, run_id, groups, world, notes)
    mesh = _complete(store, run_id, found, groups, world, notes)
    return Mesh(mesh.axes, mesh.coords, mesh.world_size, mesh.notes, tuple(left)), groups, own


def _from_groups(
    store: Store, run_id: int, groups: list[Group], world: int, notes: list[str]
) -> tuple[list[tuple[Axis, dict[int, int]]], list[tuple[Axis, tuple[tuple[int, ...], ...]]]]:
    """Axes of the named families and of the unnamed ones found by structure (module doc, step 3),
    and the candidates left out of the mesh (step 4) with their groups."""
    named: dict[str, set[tuple[int, ...]]] = {}
    labels: dict[str, set[str]] = {}
    unnamed: set[tuple[int, ...]] = set()
    for g in groups:
        if not 1 < len(g.ranks) <= world:
            continue
        axes, is_world, embedding = axis_words(g.name, g.desc)
        if embedding or is_world:
            continue
        if len(axes) == 1:  # a named group of every rank (mesh_ep over the world) is a whole axis too
            (a,) = axes
            named.setdefault(a, set()).add(g.ranks)
            labels.setdefault(a, set()).add(g.desc or g.name or "?")
        elif not axes and len(g.ranks) < world:
            unnamed.add(g.ranks)
    out: list[tuple[Axis, dict[int, int]]] = []
    fams: list[_Fam] = []
    known: set[tuple[int, ...]] = set()  # member sets of the named axes' groups
    for a in sorted(named):
        comps = components(sorted(named[a]))
        how = f"named groups ({first_few(sorted(labels[a]))})"
        fam = _family(a, comps, how, notes)
        if fam is not None:
            out.append(fam)
            fams.append(_Fam(*fam, comps, named=True))
            known |= set(comps)
    by_sig: dict[tuple[int, float], list[tuple[int, ...]]] = {}
    for members in sorted(unnamed):
        steps = {b - a for a, b in zip(members, members[1:], strict=False)}
        if members in known or len(steps) != 1:  # not evenly spaced (Megatron's tp x pp groups): no axis
            continue
        d = (members[-1] - members[0]) / (len(members) - 1)
        by_sig.setdefault((len(members), d), []).append(members)
    for (size, d), gs in sorted(by_sig.items()):
        covered = len({r for m in gs for r in m})
        if covered != size * len(gs):
            continue  # overlapping groups of one shape: not one axis
        if covered != world:  # {1, 2, 3} alone in a world of 6: a subgroup, no axis (module doc, step 3)
            notes.append(
                f"unnamed groups of {size} ranks, stride {d:g} ({_listed(gs)}) cover {covered} of the world's "
                f"{world} ranks: no axis (the groups of an axis tile the world)"
            )
            continue
        taken = {a.name for a, _ in out}
        name = _traffic_name(store, run_id, gs) or f"dim{d:g}"
        if name in taken:
            name = f"dim{d:g}"
        if name in taken:  # groups of 2 and of 3, both stride 1: dim1 and dim1_3 (module doc, step 3)
            name = f"dim{d:g}_{size}"
        fam = _family(name, gs, f"structure: unnamed groups of {size} ranks, stride {d:g}", notes)
        if fam is not None:
            out.append(fam)
            fams.append(_Fam(*fam, gs, named=False))
    return _one_mesh(store, run_id, fams, groups, world, notes)


@dataclass(frozen=True)
class _Fam:
    """A candidate axis (module doc, step 3): the axis, each member's coordinate, its groups (each
    sorted) and whether its groups' names gave it."""

    axis: Axis
    coord: dict[int, int]
    groups: list[tuple[int, ...]]
    named: bool


def _clash(x: _Fam, y: _Fam) -> str | None:
    """Why candidate axes ``x`` and ``y`` cannot be two axes of one mesh (module doc, step 4), or
    None: in a mesh the members of a group of one axis share their coordinate on every other axis
    (so two groups of different axes share at most one rank). Linear in the ranks."""
    for a, b in ((x, y), (y, x)):
        group_of = {r: g for g in b.groups for r in g}
        for g in a.groups:
            on = [r for r in g if r in b.coord]
            odd = next((r for r in on if b.coord[r] != b.coord[on[0]]), None)
            if odd is None:
                continue
            r0, h0, h1 = on[0], group_of[on[0]], group_of[odd]
            where = (
                f"both in {b.axis.name}'s group {_listed([h0])}, at positions {b.coord[r0]} and {b.coord[odd]} "
                "(two groups of different axes share at most one rank)"
                if h0 == h1
                else f"at positions {b.coord[r0]} and {b.coord[odd]} of {b.axis.name}'s groups {_listed([h0, h1])} "
                "(the members of one axis' group share their coordinate on every other axis)"
            )
            return f"{a.axis.name}'s group {_listed([g])} holds ranks {r0} and {odd}, {where}"
    return None


def _one_mesh(
    store: Store, run_id: int, fams: list[_Fam], groups: list[Group], world: int, notes: list[str]
) -> tuple[list[tuple[Axis, dict[int, int]]], list[tuple[Axis, tuple[tuple[int, ...], ...]]]]:
    """The candidate axes that form one mesh (module doc, step 4), in their order, and those left
    out with their groups.

    Every pair of kept axes passes :func:`_clash` and the kept sizes multiply to a divisor of the
    world size. When the candidates do not, they are kept one at a time in this precedence, each
    when it fits the ones kept before it: named before found by structure, smaller groups first (a
    family of larger groups that clashes is most often a product of axes, such as a flattened
    DeviceMesh), more collectives rows on its groups, smaller stride, name. Each one left out gets a
    note naming its groups, the axis it clashes with and the ranks that show it.
    """
    clashes = {
        (i, j): why
        for i in range(len(fams))
        for j in range(i + 1, len(fams))
        if (why := _clash(fams[i], fams[j])) is not None
    }
    product = 1
    for f in fams:
        product *= f.axis.size
    if not clashes and world % product == 0:
        return [(f.axis, f.coord) for f in fams], []
    rows = _rows_per_group(store, run_id, groups)
    traffic = [sum(rows.get(g, 0) for g in f.groups) for f in fams]
    order = sorted(
        range(len(fams)),
        key=lambda i: (
            not fams[i].named,
            fams[i].axis.size,
            -traffic[i],
            fams[i].axis.stride,
            fams[i].axis.name,
        ),
    )
    kept: list[int] = []
    product = 1
    for i in order:
        f = fams[i]
        against = next(
            ((j, clashes[min(i, j), max(i, j)]) for j in kept if (min(i, j), max(i, j)) in clashes), None
        )
        if against is not None:
            j, why = against
            k = fams[j]
            reason = (
                f"it and axis {k.axis.name} ({k.axis.size} ranks, groups {_listed(k.groups, 2)}; {traffic[j]} "
                f"collectives rows on them against {traffic[i]}) cannot both be axes of one mesh: {why}"
            )
        elif world % (product * f.axis.size):
            sizes = " x ".join(str(fams[j].axis.size) for j in [*kept, i])
            reason = f"the axes' sizes {sizes} = {product * f.axis.size} do not divide the world size {world}"
        else:
            kept.append(i)
            product *= f.axis.size
            continue
        notes.append(
            f"axis {f.axis.name} ({f.axis.size} ranks, groups {_listed(f.groups, 2)}; {f.axis.found_by}) left out: "
            f"{reason}. Of axes that cannot form one mesh, those named by their groups, then those of smaller "
            "groups, then those more collectives ran on are kept (state the mesh with -p mesh=...)"
        )
    left = [(fams[i].axis, tuple(fams[i].groups)) for i in order if i not in kept]
    return [(fams[i].axis, fams[i].coord) for i in sorted(kept)], left


def _rows_per_group(store: Store, run_id: int, groups: list[Group]) -> dict[tuple[int, ...], int]:
    """Collectives rows per group members (``pg_ranks``, else the one recorded group of the row's
    ``pg`` name holding its rank)."""
    by_name: dict[str, set[tuple[int, ...]]] = {}
    for g in groups:
        if g.name is not None:
            by_name.setdefault(g.name, set()).add(g.ranks)
    df = store.sql(
        """SELECT rank, regexp_replace(pg, ':p2p$', '') AS pg, pg_ranks, count(*) AS n
           FROM collectives WHERE run_id = ? GROUP BY ALL""",
        [run_id],
    )
    out: dict[tuple[int, ...], int] = {}
    for rank, pg, pg_ranks, n in df.iter_rows():
        members = _ranks(pg_ranks)
        if members is None and pg is not None:
            cands = [m for m in by_name.get(pg, ()) if rank in m]
            members = cands[0] if len(cands) == 1 else None
        if members is not None:
            out[members] = out.get(members, 0) + int(n)
    return out


def _traffic_name(store: Store, run_id: int, gs: list[tuple[int, ...]]) -> str | None:
    """``pp`` when the collectives on groups ``gs`` are all point-to-point, ``ep`` when all
    all-to-all, else None."""
    texts = ["[" + ", ".join(map(str, g)) + "]" for g in gs]
    df = store.sql(
        """SELECT bool_and(coalesce(p2p, false)) AS p2p, bool_and(op LIKE 'all_to_all%') AS a2a, count(*) AS n
           FROM collectives WHERE run_id = ? AND list_contains(?, pg_ranks)""",
        [run_id, texts],
    )
    row = df.row(0, named=True)
    if not row["n"]:
        return None
    return "pp" if row["p2p"] else "ep" if row["a2a"] else None


def _complete(
    store: Store,
    run_id: int,
    found: list[tuple[Axis, dict[int, int]]],
    groups: list[Group],
    world: int,
    notes: list[str],
) -> Mesh:
    """Coordinates per rank, the rest axis, the one-axis fallbacks and the order (steps 5-7)."""
    product = 1
    for a, _ in found:
        product *= a.size
    if not found:
        has_world = any(len(g.ranks) == world for g in groups) or world == 1
        if has_world:
            p2p = bool(
                store.sql("SELECT count(*) FROM collectives WHERE run_id = ? AND p2p", [run_id]).item()
            )
            name = "pp" if p2p and world > 1 else "dp"
            why = (
                "only the world group, and its ranks exchange point-to-point traffic: one pipeline of the world size"
                if name == "pp"
                else "only the world group: data parallel over every rank (DDP)"
            )
        else:
            name, why = "world", "no process group recorded: the mesh is unknown; state it with -p mesh=..."
        return Mesh((Axis(name, world, why, 1.0),), {r: (r,) for r in range(world)}, world, tuple(notes))
    axes = [a for a, _ in found]
    coords = {r: tuple(c.get(r) for _, c in found) for r in sorted({r for _, c in found for r in c})}
    if (
        product < world
        and world % product == 0
        and all(r in coords and None not in coords[r] for r in range(world))
    ):
        clusters: dict[tuple[int | None, ...], list[int]] = {}
        for r in range(world):
            clusters.setdefault(coords[r], []).append(r)
        rest = world // product
        if all(len(v) == rest for v in clusters.values()):
            name = "dp" if not any(a.name in _DP_AXES for a in axes) else "rest"
            pos = {r: i for v in clusters.values() for i, r in enumerate(sorted(v))}
            axes.append(
                Axis(
                    name,
                    rest,
                    f"the rest of the world: {world} ranks / {product} (the other axes)",
                    _stride([tuple(sorted(v)) for v in clusters.values()]),
                )
            )
            coords = {r: (*coords[r], pos[r]) for r in coords}
    elif product != world:
        notes.append(
            f"the axes found ({', '.join(f'{a.name} {a.size}' for a in axes)}) multiply to {product}, not "
            f"the world size {world}: some ranks' coordinates are unknown (state the mesh with -p mesh=...)"
        )
    order = sorted(range(len(axes)), key=lambda i: (-axes[i].stride, axes[i].name))
    return Mesh(
        tuple(axes[i] for i in order),
        {r: tuple(c[i] for i in order) for r, c in coords.items()},
        world,
        tuple(notes),
    )
