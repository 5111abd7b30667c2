"""Bounds on nested data decoded from untrusted files: depth, cycles and shared-reference expansion.

JSON sidecars, Flight Recorder dumps (JSON and pickle), NCCL plugin dumps and YAML metadata are
decoded into Python containers that traceprof then walks, copies or encodes again. A pickle (or a
YAML file with aliases) can hold the same container many times: a list of 40 levels, each holding
the previous level twice, is 326 bytes on disk and 2**40 values once walked as a tree; a cycle never
ends; nesting thousands deep overflows the interpreter's stack. :func:`check_nesting` measures a
decoded value without expanding it (each distinct container is visited once, iteratively) and
refuses it before anything walks it as a tree.

The decoders themselves are bounded where they run: msgspec and PyYAML stop at Python's recursion
limit (RecursionError, reported as :func:`too_deep`), pickle builds each object once (its memo
shares objects, it never copies them), and YAML aliases are refused outright (``traceprof.collectors.ndtimeline``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceprof.core.errors import TraceFormatError

__all__ = ["MAX_DEPTH", "MIN_NODES", "NODES_PER_BYTE", "max_nodes", "check_nesting", "too_deep"]

#: Deepest nesting of arrays/objects (lists, tuples, dicts) read in a document. Real sidecars, Flight
#: Recorder entries and plugin args nest 2 to 6 deep; Python's own limit is about 1000 frames.
MAX_DEPTH = 100
#: Values (containers and scalars) a document may expand to when shared references are followed as
#: copies: :data:`MIN_NODES`, or :data:`NODES_PER_BYTE` per byte of the file if that is more. Without
#: sharing a value takes at least one byte; torch's Flight Recorder pickles share each stack frame
#: between the entries that hold it (about 3 values per byte), so 16 leaves a wide margin while a
#: pickle bomb (2**40 values from 326 bytes) is refused, and memory stays proportional to the file.
MIN_NODES, NODES_PER_BYTE = 1_000_000, 16

_CONTAINERS = (list, tuple, dict)


def too_deep(path: str | Path, where: str = "", what: str = "JSON") -> TraceFormatError:
    """The one error for a document nested beyond the decoder's (Python's) recursion limit."""
    return TraceFormatError(
        path, where, f"invalid {what}: nested too deeply (over ~1000 levels of arrays or objects)"
    )


def max_nodes(nbytes: int) -> int:
    """Most values a document of ``nbytes`` bytes may expand to (:data:`MIN_NODES`, :data:`NODES_PER_BYTE`)."""
    return max(MIN_NODES, NODES_PER_BYTE * nbytes)


def check_nesting(
    value: Any,
    path: str | Path,
    what: str = "document",
    *,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MIN_NODES,
) -> int:
    """Refuse a decoded value that nests too deeply, holds itself, or expands too far.

    Visits each distinct container once (by identity), without recursion, so it takes time linear in
    the decoded objects whatever the expansion.

    Args:
        value: The decoded document (lists, tuples, dicts and scalars).
        path: The file, for the message.
        what: What the value is, for the message (``"pickle"``, ``"sidecar"``, ``"event #3 args"``).
        max_depth: Deepest container nesting allowed.
        max_nodes: Most values the document may expand to (shared references counted every time):
            :func:`max_nodes` of the file's size.

    Returns:
        The number of values the document expands to (containers and scalars, dict keys included).

    Raises:
        TraceFormatError: Naming the file and the bound exceeded.
    """
    if not isinstance(value, _CONTAINERS):
        return 1
    size: dict[int, int] = {}  # id -> expanded values, for containers done
    open_: set[int] = set()  # ids of the containers on the current path (a cycle comes back to one)
    stack: list[tuple[Any, Any, list[int]]] = [(value, iter(_items(value)), [1])]
    open_.add(id(value))
    while stack:
        node, items, count = stack[-1]
        for child in items:
            if not isinstance(child, _CONTAINERS):
                count[0] += 1
                continue
            cid = id(child)
            if cid in size:
                count[0] += size[cid]
                if count[0] > max_nodes:
                    raise _expands(path, what, max_nodes)
                continue
            if cid in open_:
                raise TraceFormatError(path, "", f"{what} holds itself (a reference cycle); refused")
            if len(stack) >= max_depth:
                raise TraceFormatError(
                    path, "", f"{what} nested deeper than {max_depth} levels of arrays or objects; refused"
                )
            open_.add(cid)
            stack.append((child, iter(_items(child)), [1]))
            break
        else:
            stack.pop()
            open_.discard(id(node))
            size[id(node)] = count[0]
            if count[0] > max_nodes:
                raise _expands(path, what, max_nodes)
            if stack:
                stack[-1][2][0] += count[0]
    return size[id(value)]


def _items(node: Any) -> Any:
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield v
    else:
        yield from node


def _expands(path: str | Path, what: str, max_nodes: int) -> TraceFormatError:
    return TraceFormatError(
        path,
        "",
        f"{what} expands to over {max_nodes:,} values through shared references (an expansion bomb); refused",
    )
