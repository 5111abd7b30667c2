"""HTA 0.5.0's whole microseconds, as SQL over traceprof's exact nanoseconds (``hta=true`` modes).

Holistic Trace Analysis reads a Kineto trace's ``ts`` and ``dur`` (decimal microseconds) with a JSON
parser into float64: each is the double nearest the decimal text. When a trace has a fractional
timestamp it then rounds every event inward to whole microseconds (``round_down_time_stamps``):
start = ceil(ts), end = floor(ts + dur), with ts + dur a float64 sum. Near the epoch (1.7e15 us)
doubles are 0.25 us apart, so the float start is not the decimal one: 1712195495519689.047 reads as
...689.0 and rounds up to ...689, where the exact decimal rounds up to ...690. traceprof stores the
exact integer ns (README "What traceprof handles": Time); these expressions redo HTA's float steps on
them, so that ``hta=true`` reproduces HTA's figures exactly:
  1. The file's value in ns: x = ts_ns - shift_ns (shift: the trace's ``base_time_ns`` plus its
     ``clock_offset_ns``).
  2. float64(x / 1000), correctly rounded as a parser reads "x/1000" written in decimal: for
     |x| < 2^53 the double of x is exact and one division rounds once; beyond it x = 1000 q + r and
     float64(q) + float64(r / 1000) (q < 2^53 exact; r / 1000 is dyadic, and so exact, or at least
     1e-6 from any halfway point of a double >= 2^43, so its one rounding cannot move the sum's).
  3. start = ceil of (2); end = floor of (2) + float64(dur / 1000), the sum rounded as a double.
  4. Back to ns: shift_ns + whole us x 1000.
Exact only while the file's times have at most 3 decimals (traceprof rounds a 4th decimal to ns;
HTA's float keeps it): the README's "Windows and HTA" says so.
"""

from __future__ import annotations

__all__ = ["float_us_sql", "start_ns_sql", "end_ns_sql"]

#: Below this magnitude (ns) an int64 converts to float64 exactly.
_EXACT = 2**53


def float_us_sql(ns: str) -> str:
    """SQL (DOUBLE) of the float64 nearest ``ns`` / 1000: integer nanoseconds as the microseconds a
    JSON parser reads from their decimal text (module doc, step 2).

    Args:
        ns: SQL expression of a BIGINT, ns.
    """
    return (
        f"(CASE WHEN abs({ns}) < {_EXACT} THEN CAST({ns} AS DOUBLE) / CAST(1000 AS DOUBLE) "
        f"ELSE CAST(({ns}) // 1000 AS DOUBLE) + CAST(({ns}) % 1000 AS DOUBLE) / CAST(1000 AS DOUBLE) END)"
    )


def start_ns_sql(ts: str, shift: str) -> str:
    """SQL (BIGINT, ns) of HTA's rounded start of an event at ``ts`` (ns, the store's): the file's
    microseconds as a float64, rounded up to a whole microsecond (module doc).

    Args:
        ts: SQL expression of the event's start (``events.ts_ns``).
        shift: SQL expression of the trace's shift from the file's time to the store's (ns).
    """
    return f"({shift} + CAST(ceil({float_us_sql(f'{ts} - {shift}')}) AS BIGINT) * 1000)"


def end_ns_sql(ts: str, dur: str, shift: str) -> str:
    """SQL (BIGINT, ns) of HTA's rounded end of an event at ``ts`` lasting ``dur`` (ns): the float64
    sum of the file's start and duration, rounded down to a whole microsecond (module doc).

    Args:
        ts: SQL expression of the event's start (``events.ts_ns``).
        dur: SQL expression of its recorded duration (ns).
        shift: As :func:`start_ns_sql`.
    """
    total = f"{float_us_sql(f'{ts} - {shift}')} + {float_us_sql(dur)}"
    return f"({shift} + CAST(floor({total}) AS BIGINT) * 1000)"
