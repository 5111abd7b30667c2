"""The ``traceprof`` command line: thin wrappers over the library. The only module importing typer.

Exit codes: 0 ok, 1 input or usage error (one-line message), 3 regression found (``diff``), 4 inconclusive
(``diff``: the noise does not allow a verdict).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import orjson
import typer
from rich.console import Console

from traceprof.core import fileio, term
from traceprof.core.blas import one_blas_thread
from traceprof.core.errors import Interrupted, TraceFormatError, TraceprofError, UsageError
from traceprof.core.lazy import lazy

if TYPE_CHECKING:
    import polars as pl
    from rich.progress import Progress

    from traceprof.engine import analysis as registry
    from traceprof.ingest.ingest import IngestResult
    from traceprof.storage.store import Store
else:
    # polars, pyarrow and DuckDB take ~0.5 s to import, which ``traceprof --help`` and usage errors
    # should not pay
    pl = lazy("polars")
    registry = lazy("traceprof.engine.analysis")

    def Store(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - stands in for the class
        from traceprof.storage.store import Store as _Store

        return _Store(*args, **kwargs)


#: = traceprof.storage.store.DEFAULT_DB, not imported from there so that --help stays fast (test_cli_output checks both).
DEFAULT_DB = "traceprof.duckdb"

app = typer.Typer(
    help="Profile distributed training traces: ingest into DuckDB, analyze, report.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    # -h as well as --help on every command (subcommands inherit it from the app's context)
    context_settings={"help_option_names": ["-h", "--help"]},
)


class _PipedConsole(Console):
    """rich's Console for stdout, whose reader leaving early (``| head -1``) raises a BrokenPipeError
    that the CLI ends quietly with the command's verdict (:func:`_settle`: 0 unless the command had
    one; :func:`_reader_gone`), where rich's own exits 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more to write
        # no errno: typer exits 1 on an EPIPE raised inside a command, and lets this one through
        raise BrokenPipeError("stdout's reader left")


# Strings from traces are untrusted: nothing printed is read as markup or emoji codes, and every
# message and cell goes through traceprof.core.term (control characters written out as \x1b, \n).
err = Console(stderr=True, markup=False, emoji=False, highlight=False)
# Tables of ns values are wide: do not squeeze them to 80 columns when piped.
out = _PipedConsole(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False, highlight=False)


def say(message: object, console: Console = err, label: str = "", style: str = "") -> None:
    """Print one message, escaped (:func:`traceprof.core.term.escape`), after an optional styled label."""
    line = term.text(label, style) + " " if label else term.text("")
    console.print(line + term.text(message), soft_wrap=True)


def _store_path(value: str | Path) -> Path:
    """``--db``'s value as a Path, refused when it is a folder (checked on the text as typed:
    ``Path("x/")`` is ``x``, a file).

    Raises:
        StoreError: ``traceprof.core.locking.check_not_folder``'s.
    """
    from traceprof.core.locking import check_not_folder

    check_not_folder(value)
    return Path(value)


def _given(value: str | Path, option: str, takes: str) -> Path:
    """A path option's value as a Path, refused when it is empty: ``Path("")`` is ``.``, the
    current folder, so ``-o ''`` would otherwise be read as a folder (or written into).

    Args:
        value: The value as typed.
        option: The option as messages name it (``-o``, ``--config``, ``PATH``).
        takes: What the option takes, for the message (``the output file's name``).

    Raises:
        UsageError: ``{option}: the path is empty ('')``, with what it takes.
    """
    if not os.fspath(value):
        raise UsageError(f"{option}: the path is empty (''); {option} takes {takes}")
    return Path(value)


def _config_path(value: str | Path) -> Path:
    """``--config``'s value (:func:`_given`)."""
    return _given(value, "--config", "a config file")


def _out_dir(value: str | Path) -> Path:
    """``collect --out``'s value (:func:`_given`)."""
    return _given(value, "--out", "the folder for the rank traces")


def _trace_path(value: str | Path) -> Path:
    """One of ``ingest``'s paths (:func:`_given`)."""
    return _given(value, "PATH", "a trace file or folder")


def _file_path(value: str | Path) -> Path:
    """An output file option's value (``report -o``, ``export perfetto -o``) as a Path, refused
    when it is empty (:func:`_given`) or written as a folder (ending in ``/``: ``Path("x/")`` is
    the file ``x``). ``-`` is stdout (:data:`traceprof.core.fileio.STDOUT`).

    Raises:
        UsageError: Naming the path as typed.
    """
    _given(value, "-o", "the output file's name")
    text = os.fspath(value)
    if text.endswith(("/", "/.")) or text in (".", ".."):
        raise UsageError(f"{text!r}: a folder, not a file; -o takes the output file's name")
    return Path(value)


DbOpt = Annotated[
    Path,
    typer.Option(
        "--db", help="Store file (DuckDB).", envvar="TRACEPROF_DB", parser=_store_path, metavar="PATH"
    ),
]
RunOpt = Annotated[
    str | None, typer.Option("--run", help="Run name or id (default: latest run).", metavar="RUN")
]


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


ExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        metavar="local|dask",
        help="Where per-rank analyses run: here, or dask (one task per rank on a Dask cluster, see --scheduler; "
        "needs a Parquet-layout store on a filesystem every worker mounts). Cross-rank analyses run here.",
    ),
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="ADDR",
        help="Dask scheduler address for --executor dask, e.g. tcp://HOST:8786.",
    ),
]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]


class CommentFormat(str, Enum):
    """``summary`` and ``diff``'s formats: :class:`Format`'s and markdown (a pull-request comment)."""

    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


CommentFormatOpt = Annotated[
    CommentFormat,
    typer.Option("--format", "-f", help="Output format; markdown: a pull-request comment (GitHub tables)."),
]
NoCacheOpt = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        help="Compute every analysis again rather than reuse the results an earlier command kept "
        "beside the store (STORE.results/, dropped whenever the store changes).",
    ),
]
UnitsOpt = Annotated[
    str,
    typer.Option(
        "--units",
        metavar="human|ns",
        help="Table durations: human (the default: each column in s, ms or us, its header saying "
        "which, e.g. 'step (ms)') or ns (exact integers). JSON and CSV are always exact ns.",
    ),
]
#: ``-p ANALYSIS.KEY=VALUE`` of the commands that run the report's analyses (summary, report).
AnalysisParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--param",
        "-p",
        metavar="[ANALYSIS.]KEY=VALUE",
        help="Analysis parameter ANALYSIS.KEY=VALUE, e.g. mfu.peak_tflops=989; KEY=VALUE sets it in every "
        "analysis that takes KEY.",
    ),
]
#: ``-p KEY=VALUE`` of the commands whose one analysis parameter set is mfu's (diff, history).
MfuParamOpt = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="mfu parameter KEY=VALUE (or mfu.KEY=VALUE).", metavar="KEY=VALUE"),
]
#: ``--force`` with ``--baseline`` (summary, report).
BaselineForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="With --baseline: compare runs that are not comparable by per-rank medians."
    ),
]
RawOpt = Annotated[
    bool,
    typer.Option(
        "--raw",
        help="CSV: write cells exactly as stored (default: control characters escaped, and cells "
        "starting with = + - @ prefixed with ' so that spreadsheets do not run them as formulas).",
    ),
]


#: Default and largest ``sql --timeout`` (s): a CI job's query on a large store takes seconds to a minute.
SQL_TIMEOUT_S, MAX_SQL_TIMEOUT_S = 300.0, 7 * 86400

#: Rows a table shows (rich lays out every row before printing: 100,000 steps took over a minute);
#: JSON and CSV always give every row.
TABLE_ROWS = 200


def render(df: pl.DataFrame, fmt: Format, title: str = "", raw: bool = False, units: str = "human") -> None:
    """Print a frame as a rich table (strings escaped; the first :data:`TABLE_ROWS` rows, and a
    line on stderr saying how many more), a JSON list of objects, or CSV (string cells escaped and
    neutralized by :func:`traceprof.core.term.csv_cell` unless ``raw``)."""
    _emit(_shown(df, fmt, raw, units), title)


#: What :func:`render` prints of a frame: JSON or CSV text, or a table's :func:`_table_parts`.
Shown = str | tuple[list[str], list[bool], list[list[str]], str]


def _shown(df: pl.DataFrame, fmt: Format, raw: bool = False, units: str = "human", worst: str = "") -> Shown:
    """What :func:`render` prints of ``df`` in ``fmt`` (:data:`Shown`); ``worst``: a table of per-step
    rows shows its worst by that column (:func:`traceprof.core.display.shown_rows`).

    Raises:
        UsageError: ``units`` is neither human nor ns (a table).
    """
    if fmt is Format.json:
        return _json_text(df)
    if fmt is Format.csv:
        return _csv_text(df, raw)
    from traceprof.core import display  # durations in human units, long names shortened

    if units not in display.UNITS:
        raise UsageError(f"--units {units!r}: expected human or ns")
    return _table_parts(df, units, worst)


def _emit(shown: Any, title: str) -> None:
    """Print :func:`_shown`'s text, or its table parts as a table titled ``title`` (a kept view's
    parts are JSON lists)."""
    if isinstance(shown, str):
        sys.stdout.write(shown)
        return
    columns, numeric, cells, more = shown
    _show_table(columns, numeric, cells, more, title)


def _json_text(df: pl.DataFrame) -> str:
    """``-f json``'s text of a frame: a list of objects (bidi and C1 controls as ``\\uXXXX``)."""
    text = orjson.dumps(df.to_dicts(), option=orjson.OPT_INDENT_2, default=str).decode()
    return term.json_text(text) + "\n"


def _csv_text(df: pl.DataFrame, raw: bool) -> str:
    """``-f csv``'s text of a frame: nested cells as JSON, string cells through
    :func:`traceprof.core.term.csv_cell` unless ``raw``."""
    nested = [c for c, t in df.schema.items() if t.is_nested()]
    flat = df.with_columns(
        pl.Series(c, [orjson.dumps(v, default=str).decode() for v in df[c].to_list()]) for c in nested
    )
    if not raw:
        flat = flat.with_columns(
            pl.col(c).map_elements(term.csv_cell, return_dtype=pl.String)
            for c, t in flat.schema.items()
            if t == pl.String
        )
    return flat.write_csv()


def _table_parts(
    df: pl.DataFrame, units: str, worst: str = ""
) -> tuple[list[str], list[bool], list[list[str]], str]:
    """What a table of ``df`` shows (:func:`_show_table`): headers, which columns are numeric, the
    cells of :data:`TABLE_ROWS` rows (:mod:`traceprof.core.display`; the first, or of per-step rows
    the worst by ``worst``: :func:`~traceprof.core.display.shown_rows`), and the line saying which
    rows those are ("" when every row is shown)."""
    from traceprof.core import display

    shown, more = display.shown_rows(
        df, TABLE_ROWS, worst
    )  # headers and cells from one frame: one unit per column
    cells = [list(r) for r in display.table_rows(shown, units)]
    numeric = [df[c].dtype.is_numeric() for c in df.columns]
    return display.table_columns(shown, units), numeric, cells, more


def _show_table(
    columns: list[str], numeric: list[bool], cells: list[list[str]], more: str, title: str
) -> None:
    """Print :func:`_table_parts`, and on stderr which rows are shown when not all are."""
    _print_table(columns, numeric, cells, title)
    if more:
        say(f"{more}; --format csv or --format json prints every row")


def _print_table(
    columns: list[str],
    numeric: list[bool],
    rows: Iterable[Sequence[object]],
    title: str = "",
    wrap: dict[str, int] | None = None,
) -> None:
    """Print a table of cells; ``wrap``: columns whose cells are wrapped at that many characters
    (whole, on several lines) rather than widening the table (by default each of
    :data:`traceprof.core.display.PROSE_COLUMNS` at :data:`~traceprof.core.display.PROSE_WIDTH`)."""
    from rich.table import Table  # only for a table printed: an ingest never needs it (12 ms of import)

    from traceprof.core.display import PROSE_COLUMNS, PROSE_WIDTH

    wrap = {c: PROSE_WIDTH for c in columns if c in PROSE_COLUMNS} | (wrap or {})

    t = Table(title=term.text(title) if title else None, show_lines=False)
    for c, num in zip(columns, numeric, strict=True):
        t.add_column(
            term.text(c),
            justify="right" if num else "left",
            overflow="fold",
            no_wrap=num,
            max_width=wrap.get(c),
        )  # numbers never wrap
    from traceprof.core.display import long_cell, value_cell  # one cell rule: separators, bytes, p-values

    for row in rows:
        t.add_row(*(term.text(long_cell(value_cell(c, v))) for c, v in zip(columns, row, strict=True)))
    # Numbers never wrap or shrink: a table wider than the console is printed at its natural width
    # (long names are shortened already; the terminal wraps whole lines instead).
    natural = out.measure(t, options=out.options.update_width(100_000)).maximum
    width = out.width
    try:
        out.width = max(width, natural)
        out.print(t, crop=False)
    finally:
        out.width = width


def _interrupted(store: Store, db: Path) -> str:
    """The one-line state after Ctrl-C in ingest: which runs were stored (new state) or none (old)."""
    if store.commits:
        store.close()
        runs = ", ".join(f"run {n!r} (id {i})" for n, i in store.commits)
        return f"interrupted; stored {runs} in {db}; the rest of this ingest was not stored"
    return _nothing_stored(db, store.discard_if_new())


def _nothing_stored(db: Path, gone: bool = False) -> str:
    """The one wording of a Ctrl-C that stored nothing in store ``db`` (``gone``: none was created)."""
    return "interrupted; nothing stored, " + (
        f"no store created ({db})" if gone or not db.exists() else f"{db} is as it was"
    )


def _progress() -> Progress | contextlib.nullcontext[None]:
    """A progress bar on a terminal; nothing when stderr is piped (no stray blank lines)."""
    if not err.is_terminal:
        return contextlib.nullcontext()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]ingest"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
        transient=True,
    )


def _version(value: bool) -> None:
    """``--version``: print ``traceprof VERSION`` (``traceprof.__version__``, the wheel's version) and exit 0."""
    if value:
        from traceprof import __version__

        with _piped_out():  # parsed before any command runs: outside the commands' own
            sys.stdout.write(f"traceprof {__version__}\n")
        raise typer.Exit()


#: The config file in effect (``traceprof.core.config``), read by the root callback before any command.
_config: Any = None


def settings() -> Any:
    """The config in effect (:mod:`traceprof.core.config`): the one the root callback read, else
    the one found from the current directory (a command called from Python)."""
    global _config
    if _config is None:
        from traceprof.core import config

        _config = config.load()
    return _config


def _db_defaults(cmd: Any, db: str) -> dict[str, Any]:
    """click's ``default_map`` giving ``--db`` the value ``db`` in every command below ``cmd`` that
    has it: below the command line and ``TRACEPROF_DB``, above the built-in default."""
    out: dict[str, Any] = {"db": db} if any(p.name == "db" for p in cmd.params) else {}
    for name, sub in getattr(cmd, "commands", {}).items():
        m = _db_defaults(sub, db)
        if m:
            out[name] = m
    return out


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print traceprof's version and exit."
        ),
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="PATH",
            parser=_config_path,
            help="Config file (default: TRACEPROF_CONFIG, else traceprof.toml, or the tool.traceprof table of "
            "pyproject.toml, in this directory or above): default store, -p parameters, diff thresholds.",
        ),
    ] = None,
) -> None:
    """Profile distributed training traces: ingest into DuckDB, analyze, report."""
    global _config
    from traceprof.core import config as config_file

    _config = config_file.load(config)
    if _config.params or _config.thresholds:
        _check_config(_config)
    if _config.db is not None:
        ctx.default_map = {**(ctx.default_map or {}), **_db_defaults(ctx.command, _config.db)}


def _check_config(cfg: Any) -> None:
    """Refuse a config file whose ``[params]`` or ``[diff]`` thresholds no command could use, naming
    the file and the key, before any command runs (a bad value surfaced later blamed ``-p``/``-t``;
    an unknown bare key was silently left out).

    Raises:
        UsageError: An analysis or parameter that does not exist, a value of the wrong type or out
            of range (as the analysis' ``Params`` checks it), or a threshold outside (0, 1] or for no
            metric.
    """
    from traceprof.engine import analysis as registry
    from traceprof.engine.diff import thresholds
    from traceprof.engine.options import check

    where = f"{cfg.path}"
    try:
        check(cfg.params, [a.name for a in registry.specs()])
    except UsageError as e:
        raise UsageError(f"{where}: [params] {e}") from None
    try:
        thresholds(dict(cfg.thresholds))
    except UsageError as e:
        raise UsageError(f"{where}: [diff] thresholds: {e}") from None


@app.command()
def ingest(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Trace files or directories (a directory of rank files is one run).",
            metavar="PATH",
            parser=_trace_path,
        ),
    ],
    db: DbOpt = Path(DEFAULT_DB),
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Run name for all files (default: the folder's name; a lone file's own name).",
            metavar="NAME",
        ),
    ] = None,
    skip_bad_events: Annotated[
        bool, typer.Option(help="Skip malformed events (counted) instead of failing.")
    ] = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs", "-j", help="Parser processes, 1 to 1,024 (default: one per CPU, at most one per file)."
        ),
    ] = None,
    align: Annotated[
        bool, typer.Option("--align/--no-align", help="Align rank clocks from matched collectives.")
    ] = True,
    partial: Annotated[
        bool,
        typer.Option(
            "--partial",
            help="Store the files that parse, list each file (or path holding no trace) that does not "
            "(exit 1 if any).",
        ),
    ] = False,
    force_run: Annotated[
        bool,
        typer.Option(
            "--force-run",
            help="Append to an existing run even if world size, backend, device or time differ.",
        ),
    ] = False,
    max_inflate: Annotated[
        float,
        typer.Option(
            "--max-inflate",
            help="Refuse a .gz that inflates beyond RATIO x its size (at least 64 MiB).",
            metavar="RATIO",
        ),
    ] = 64.0,
    comm_kernel: Annotated[
        list[str] | None,
        typer.Option(
            "--comm-kernel",
            metavar="REGEX",
            help="Kernel names matching REGEX are communication (added to the built-in NCCL/RCCL/DeepEP/... "
            "families; repeatable).",
        ),
    ] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            "--layout",
            metavar="duckdb|parquet",
            help="Layout of a new store: duckdb (one file) or parquet (events as Parquet files beside it). "
            "Default: parquet when the input exceeds 2 GiB uncompressed (estimated), else duckdb; an "
            "existing store keeps its layout.",
        ),
    ] = None,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            metavar="local|dask",
            help="Where files are parsed: local processes, or dask (a Dask cluster, see --scheduler; implies "
            "--layout parquet; files and store on a shared filesystem).",
        ),
    ] = "local",
    scheduler: SchedulerOpt = None,
) -> None:
    """Parse trace files into the store (one transaction per run; same file twice is a no-op)."""
    try:  # a Ctrl-C while the libraries load: the store is not touched yet
        from traceprof.core.procs import counted_sigint, ignored_sigint
        from traceprof.ingest.ingest import check_input
        from traceprof.ingest.ingest import ingest as do_ingest
        from traceprof.storage.layout import choose
        from traceprof.storage.store import interrupted
    except KeyboardInterrupt:
        raise Interrupted(_nothing_stored(db)) from None

    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {_typed('jobs', jobs)}: expected 1 or more parser processes")
    fileio.check_inflate_ratio(max_inflate, _typed("max_inflate", max_inflate))
    for p in paths:  # before the store (and its lock file) is created
        check_input(p)
    if executor == "dask" and layout is None and not db.exists():
        layout = "parquet"
    if executor == "dask" and layout == "duckdb":
        raise UsageError(
            "--executor dask writes the Parquet layout: leave out --layout duckdb (or use --layout parquet)"
        )
    try:  # a Ctrl-C while it waits for the lock or creates the store: Store removes what it created
        # choose() reads the inputs' sizes; a new store is created while the traces are parsed
        store = Store(db, layout=choose(db, paths, layout), background=True)
    except KeyboardInterrupt:
        raise Interrupted(_nothing_stored(db)) from None
    with counted_sigint() as arrived:  # every Ctrl-C is noted: one Python drops still stops the ingest
        try:
            with _progress() as bar:
                show = None
                if bar is not None:
                    task = bar.add_task("", total=None)

                    def show(done: int, total: int, p: str) -> None:
                        bar.update(task, completed=done, total=total, description=term.escape(Path(p).name))

                    def reading(p: Path, done: int, total: int) -> None:  # a file parsed in this process
                        bar.update(
                            task,
                            description=f"{term.escape(p.name)}: {done / 2**20:,.0f} of "
                            f"{total / 2**20:,.0f} MiB read",
                        )

                    fileio.on_read(reading)

                try:
                    res = do_ingest(
                        store,
                        paths,
                        run=run,
                        on_bad_event="skip" if skip_bad_events else "raise",
                        jobs=jobs,
                        align=align,
                        progress=show,
                        partial=partial,
                        force_run=force_run,
                        max_inflate_ratio=max_inflate,
                        comm_kernels=comm_kernel or (),
                        executor=executor,
                        scheduler=scheduler,
                    )
                finally:
                    fileio.on_read(None)
            if (
                arrived()
            ):  # a Ctrl-C whose KeyboardInterrupt Python dropped (raised inside a callback it ignores)
                raise KeyboardInterrupt
            # Every run is committed: a Ctrl-C from here on changes nothing, and the report is printed whole
            # (one that came before is raised on entry, and reported below as an interrupt after the commits).
            with ignored_sigint():
                if res.runs:
                    store.close()
                else:  # nothing stored (e.g. --partial, every file failed): a store this ingest created goes
                    store.discard_if_new()
                _settle(1 if res.failed else 0)
                _report_ingest(res, run, db)
        except BaseException as e:
            # Ctrl-C, or DuckDB's report of it (a RuntimeError or a duckdb.Error, see Store.interrupted):
            # store.commits says exactly what was stored, whichever statement it stopped.
            if isinstance(e, KeyboardInterrupt) or interrupted(e) or arrived():
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
                raise Interrupted(_interrupted(store, db)) from None
            store.discard_if_new()  # a failed first ingest leaves no empty store behind
            raise
    if res.failed:
        raise typer.Exit(1)


#: Set by :func:`main` once the ingest command is over, whatever its outcome: every way out of it
#: (success, an error, ``--partial`` with failures) has closed its store or discarded it, so the
#: process may end without Python's teardown (:func:`leave`).
_finished = False


def leave(code: object = 0) -> None:
    """End the process at once with exit ``code`` (a ``SystemExit``'s: None is 0) after a command
    that set :data:`_finished`, its output flushed. The interpreter's teardown does nothing for
    it: the store is closed and its lock released, spilled text is in unlinked files, and parser
    workers have exited; it costs a successful ingest about 0.03-0.04 s of CPU, and with pyarrow
    and polars both loaded (an NDTimeline Parquet file read) it was seen to abort about 1 process
    in 15 ("terminate called without an active exception": exit 134 for an ingest that said exit 1).
    Anything else (another command, a code that is not an integer, threads or child processes still
    running, output that cannot be flushed, a profiler, debugger or coverage running) returns, and
    Python exits as usual. Called by the console script and ``python -m traceprof.cli``, never by
    :func:`main` (the tests run it in their own process)."""
    code = 0 if code is None else code
    if not _finished or not isinstance(code, int) or threading.active_count() > 1:
        return
    if sys.getprofile() is not None or sys.gettrace() is not None or "coverage" in sys.modules:
        return  # a profiler, debugger or coverage writes its results at exit
    if "multiprocessing" in sys.modules and sys.modules["multiprocessing"].active_children():
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


def _report_ingest(res: IngestResult, run: str | None, db: Path) -> None:
    """Print what an ingest did: warnings, files already stored, runs stored, files that failed."""
    for w in res.warnings:
        say(w, label="warning:", style="yellow")
    for path, where in res.skipped.items():
        elsewhere = run is not None and not where.startswith(f"run {run!r} ")
        say(
            f"already stored: {path} ({where})"
            + (
                f"; not added to run {run!r} (a file belongs to one run: `traceprof runs mv` renames that run, "
                "`traceprof runs rm` removes it so its files can be ingested again)"
                if elsewhere
                else ""
            )
        )
    for name, rid in res.runs.items():
        say(f"run {name!r} (id {rid}): stored in {db}")
    for msg in res.failed.values():
        say(msg, label="failed:", style="red")
    failed = f", {len(res.failed)} failed" if res.failed else ""
    say(f"{len(res.added)} file(s) ingested, {len(res.skipped)} already stored{failed}")


runs_app = typer.Typer(
    help="List the runs in the store; remove (rm) or rename (mv) one.", no_args_is_help=False
)
app.add_typer(runs_app, name="runs")


@runs_app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context, db: DbOpt = Path(DEFAULT_DB), fmt: FormatOpt = Format.table, raw: RawOpt = False
) -> None:
    """List the runs in the store (``ranks``: with a Kineto/nsys trace, ``dump_only_ranks``: with a
    Flight Recorder or NCCL dump only; ``issues``: records rejected or repaired at ingest, by reason,
    whole and wrapped in the table); ``runs rm NAME`` removes a run, ``runs mv OLD NEW`` renames one."""
    if ctx.invoked_subcommand is None:
        with Store(db, read_only=True) as store:
            if fmt is Format.table:  # without polars (0.3 s to import): the rows as DuckDB gives them
                from traceprof.core.display import plain, row_cells

                columns, rows = store.run_rows()
                # every cell but the last shortened as in any table; issues (last) whole, wrapped
                numeric, cells = row_cells(columns[:-1], [r[:-1] for r in rows])
                cells = [[*c, plain(r[-1])] for c, r in zip(cells, rows, strict=True)]
                numeric = (numeric or [False] * (len(columns) - 1)) + [False]
                _print_table(columns, numeric, cells, f"runs in {db}")  # issues: prose, wrapped
            else:
                render(store.runs(), fmt, f"runs in {db}", raw)
            _warn_broken(store)


def _warn_broken(store: Store) -> None:
    """Say which runs of a Parquet-layout store have missing or damaged files (left out of its
    ``events`` view; ``Store.resolve_run`` refuses them)."""
    broken = store.dataset.broken if store.dataset is not None else {}
    if broken:
        names = dict(store.con.execute("SELECT run_id, name FROM runs").fetchall())
        runs = ", ".join(repr(names.get(r, r)) for r in sorted(broken))
        say(
            f"run(s) {runs}: Parquet files missing or damaged, their events are left out of queries; "
            "restore the files, or `traceprof runs rm NAME` and ingest again",
            label="warning:",
            style="yellow",
        )


@runs_app.command("rm")
def runs_rm(
    name: Annotated[str, typer.Argument(help="Run name or id.")], db: DbOpt = Path(DEFAULT_DB)
) -> None:
    """Remove a run and every row of it from the store (its files can then be ingested again)."""
    from traceprof.storage.runs import remove

    with Store(db, create=False) as store:  # runs rm / mv never create one
        r = remove(store, name)
    say(f"removed run {r.name!r} (id {r.run_id}): {r.traces} trace file(s), {r.rows:,} rows")
    if r.sets_changed:
        say(f"removed it from baseline set(s) {', '.join(map(repr, r.sets_changed))}, which hold other runs")
    if r.sets_emptied:
        say(
            f"baseline set(s) {', '.join(map(repr, r.sets_emptied))} held only this run and are gone: "
            "`traceprof baseline add NAME RUN...` to fill one again",
            label="warning:",
            style="yellow",
        )


@runs_app.command("mv")
def runs_mv(
    old: Annotated[str, typer.Argument(help="Run name or id.")],
    new: Annotated[str, typer.Argument(help="New name.")],
    db: DbOpt = Path(DEFAULT_DB),
) -> None:
    """Rename a run."""
    from traceprof.storage.runs import rename

    with Store(db, create=False) as store:  # runs rm / mv never create one
        run_id = rename(store, old, new)
    say(f"run {old!r} (id {run_id}) is now {new!r}")


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL to run; the schema is in docs/schema.md.")],
    db: DbOpt = Path(DEFAULT_DB),
    fmt: FormatOpt = Format.table,
    max_rows: Annotated[
        int, typer.Option("--max-rows", help="Print at most this many rows (0: all; rows are streamed).")
    ] = 1000,
    raw: RawOpt = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            help="Stop a query that runs longer (DuckDB's time, not printing's).",
        ),
    ] = SQL_TIMEOUT_S,
) -> None:
    """Run a read-only query on the store (queries only: no writes, no settings, no other files); prints every DuckDB type."""
    from traceprof.storage.sqlstream import stream

    if not query.strip():
        raise UsageError('empty query; e.g. traceprof sql "SELECT * FROM runs"')
    if max_rows < 0:
        raise UsageError(f"--max-rows {_typed('max_rows', max_rows)}: expected 0 (all) or more")
    if not 0 < timeout <= MAX_SQL_TIMEOUT_S:  # nan and inf too
        raise UsageError(
            f"--timeout {_typed('timeout', timeout)}: expected seconds above 0, at most "
            f"{MAX_SQL_TIMEOUT_S:,} (a week)"
        )
    try:
        with Store(db, user_sql=True) as store:
            _warn_broken(store)
            res = stream(store, query, max_rows or None, timeout_s=timeout, as_json=fmt is Format.json)
            with _piped_out():
                if fmt is Format.table:
                    _print_table(res.columns, res.numeric, res.rows)
                elif fmt is Format.json:
                    _stream_json(res.columns, res.rows)
                else:
                    _stream_csv(res.columns, res.rows, raw, res.text)
    except KeyboardInterrupt:
        raise Interrupted(_nothing_stored(db) + " (sql is read-only)") from None
    if res.statements > 1:
        say(
            f"{res.statements} statements ran; the rows shown are the last one's",
            label="note:",
            style="yellow",
        )
    if res.capped:
        say(f"first {max_rows:,} rows shown; --max-rows 0 prints all", label="note:", style="yellow")


def _stream_json(columns: list[str], rows: Iterable[Sequence[object]]) -> None:
    """Write rows as a JSON list of objects, one row at a time (duplicate column names get _2, _3;
    bidi and C1 control characters as ``\\uXXXX``, :func:`traceprof.core.term.json_text`)."""
    keys: list[str] = []
    for c in columns:
        keys.append(c if c not in keys else f"{c}_{sum(k == c or k.startswith(c + '_') for k in keys) + 1}")
    sep = "[\n"
    for row in rows:
        sys.stdout.write(
            sep + "  " + term.json_text(orjson.dumps(dict(zip(keys, row, strict=True))).decode())
        )
        sep = ",\n"
    sys.stdout.write("[]\n" if sep == "[\n" else "\n]\n")


def _stream_csv(
    columns: list[str], rows: Iterable[Sequence[object]], raw: bool, text: Sequence[bool]
) -> None:
    """Write rows as CSV; the cells of text columns (``text``: per column, ``SqlStream.text``) go
    through :func:`traceprof.core.term.csv_cell` unless ``raw``: a negative DECIMAL or INTERVAL,
    printed as text too, keeps its ``-`` bare."""
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(columns if raw else [term.csv_cell(c) for c in columns])
    for row in rows:
        w.writerow(
            [
                "" if v is None else term.csv_cell(v) if t and not raw and isinstance(v, str) else v
                for v, t in zip(row, text, strict=True)
            ]
        )


def _complete_analysis(incomplete: str) -> list[str]:
    """Shell completion of ``analyze NAME``: the registered analyses starting with what is typed."""
    return [n for n in ["list", *registry.names()] if n.startswith(incomplete)]


@app.command()
def analyze(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(
            help="Analysis name; `traceprof analyze list` lists them.", autocompletion=_complete_analysis
        ),
    ] = None,
    db: DbOpt = Path(DEFAULT_DB),
    run: RunOpt = None,
    fmt: FormatOpt = Format.table,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param", "-p", help="Analysis parameter KEY=VALUE (or NAME.KEY=VALUE).", metavar="KEY=VALUE"
        ),
    ] = None,
    table: Annotated[
        str | None, typer.Option("--table", help="Which table of the result to print.", metavar="NAME")
    ] = None,
    save: Annotated[
        bool, typer.Option("--save", help="Also store the result tables as result_<name>_<table>.")
    ] = False,
    raw: RawOpt = False,
    units: UnitsOpt = "human",
    with_notes: Annotated[
        bool,
        typer.Option(
            "--with-notes",
            help="With -f json: one object with the analysis, run, table, its columns (type, unit, doc), "
            "rows and notes, instead of the rows alone.",
        ),
    ] = False,
    executor: ExecutorOpt = "local",
    scheduler: SchedulerOpt = None,
    no_cache: NoCacheOpt = False,
    show_help: Annotated[
        bool,
        typer.Option(
            "--help",
            "-h",
            is_eager=True,
            help="Show this message; with NAME: the analysis' parameters and tables.",
        ),
    ] = False,
) -> None:
    """Run one analysis on a run and print its table (`analyze NAME --help`: its parameters and tables)."""
    quick = name not in (None, "list") and not (show_help or save or with_notes or no_cache)
    if quick and executor == "local" and scheduler is None:
        # a result kept beside the store, printed as kept (no analysis, nor polars, loaded)
        if _print_view(db, str(name), run, param, fmt, table, raw, units):
            return
    from traceprof.api import open as open_session
    from traceprof.core.display import describe

    if show_help and name is not None:  # the analysis' own help (``list``: the listing's), and --db's
        lines = LIST_HELP.splitlines()  # the listing reads no store
        if name != "list":
            lines = describe(registry.get(name)).splitlines()
            lines[1:1] = ["", _db_help(ctx)]
        for line in lines:  # say() shows a newline as \n: one line at a time
            say(line, out)
        return
    if name == "list":
        # the summary without its leading "NAME: " (the name column says it), as docs/analyses.md
        rows = [{"name": a.name, "summary": a.summary.removeprefix(f"{a.name}: ")} for a in registry.specs()]
        if fmt is Format.table:
            wide = max(len(r["name"]) for r in rows)  # critical_path ran into its summary at 12
            for r in rows:
                say(f"{r['name']:{wide}}  {r['summary']}", out)
        else:
            render(pl.DataFrame(rows), fmt, "analyses", raw)
        return
    if name is None:
        if show_help:
            out.print(ctx.get_help(), markup=True, highlight=False)
            return
        raise UsageError("analyze: missing the analysis NAME; `traceprof analyze list` lists them")
    an = registry.get(name)
    options = _params(param, [name], implied=name).get(name, {})
    # Dask workers open the store read-only: this process must not hold it for writing meanwhile.
    apart = save and executor == "dask"
    # one analysis (many=False): the helpers it calls twice (activity, items) still run once
    with open_session(
        db,
        read_only=not save or apart,
        cache=not no_cache,
        executor=executor,
        scheduler=scheduler,
        many=False,
    ) as s:
        result = s.analyze(name, run, **options)
        run_title = _run_title(s.store, run)
        run_ref = _run_ref(s.store, run)
        if save and not apart:
            _save(s.store, run, name, result)
        from traceprof.engine import resultcache

        # an add-on analysis (entry point) keeps no view: the view's key holds traceprof's code, not its
        view = (
            resultcache.view_path(s.store, name, run, options)
            if s.cache and not save and resultcache.ours(type(result))
            else None
        )
    if apart:
        with Store(db) as store:
            _save(store, run, name, result)
    frames = result.frames()
    if table is not None and table not in frames:
        raise UsageError(f"{name} has tables {', '.join(frames)}; not {table!r}")
    if with_notes:
        if fmt is not Format.json:
            raise UsageError("--with-notes goes with --format json (tables print their notes below them)")
        from traceprof.engine.analysis import envelope

        doc = envelope(an, result, table or "frame", *run_ref)
        sys.stdout.write(
            term.json_text(orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str).decode()) + "\n"
        )
        return
    df = frames[table or "frame"]
    shown = _shown(df, fmt, raw, units, an.worst(table or "frame"))
    _emit(shown, f"{result.title or name}{f' ({table})' if table else ''}: {run_title}")
    if fmt is Format.table:
        for n in result.notes:
            say(n, out)
    if view is not None and (fmt is Format.table or df.height <= VIEW_ROWS):
        _keep_view(view, result, name, table or "frame", _variant(fmt, raw, units), shown)


#: ``analyze list --help``: usage and what it prints (``list`` is a NAME, with no spec to describe it).
LIST_HELP = """traceprof analyze list [-f table|json|csv] [--raw]

List the analyses: each name and what it answers in one line (`traceprof analyze NAME --help`: one
analysis' algorithm, parameters and tables)."""


def _db_help(ctx: typer.Context) -> str:
    """``--db``'s line in ``analyze NAME --help`` (its own help, as the options panel shows it: the
    environment variable and the default in effect, a config file's included)."""
    db: Any = next(p for p in ctx.command.params if p.name == "db")  # an Option: it has help
    default = ctx.lookup_default("db") or db.default
    return f"--db PATH  {db.help} [env var: {db.envvar}] [default: {default}]; every option: traceprof analyze --help"


#: Frames of at most this many rows keep their JSON and CSV text in an analysis' view (a table keeps
#: its first TABLE_ROWS rows whatever the frame's size).
VIEW_ROWS = 20_000


def _variant(fmt: Format, raw: bool, units: str) -> str:
    """The name of one printed form of a table in a view: ``table:human``, ``json``, ``csv_raw``..."""
    if fmt is Format.table:
        return f"table:{units}"
    return "json" if fmt is Format.json else "csv_raw" if raw else "csv"


def _keep_view(path: Path, result: Any, name: str, table: str, variant: str, shown: Shown) -> None:
    """Add what ``analyze NAME`` printed of ``result``'s ``table`` in form ``variant`` (``shown``:
    :func:`_shown`'s own text or table parts) to the result's view at ``path``
    (``traceprof.engine.resultcache.view_path``), for :func:`_print_view`: the printed bytes are
    kept, never computed apart. Nothing when the store's results are not kept."""
    from traceprof.engine import resultcache

    view = resultcache.read_view(path)
    if view is None or not isinstance(view.get("frames"), dict):
        view = {"title": result.title or name, "notes": [str(n) for n in result.notes], "frames": {}}
    view["frames"].setdefault(table, {})[variant] = shown
    resultcache.write_view(path, view)


def _print_view(
    db: Path,
    name: str,
    run: str | None,
    param: list[str] | None,
    fmt: Format,
    table: str | None,
    raw: bool,
    units: str,
) -> bool:
    """Print analysis ``name``'s result as an earlier ``analyze`` printed it (:func:`_keep_view`),
    byte for byte; False (nothing printed) when no view holds that table in that form (the result
    not kept, a frame too large for its JSON or CSV to be kept, an unknown ``--table`` or
    ``--units``, whose message the computing path gives)."""
    from traceprof.engine import resultcache

    try:
        options = _params(param, [name], implied=name).get(name, {})
        with Store(db, read_only=True) as store:
            path = resultcache.view_path(store, name, run, options)
            view = resultcache.read_view(path) if path is not None else None
            if view is None:
                return False
            shown = view.get("frames", {}).get(table or "frame", {}).get(_variant(fmt, raw, units))
            if shown is None:
                return False
            run_title = _run_title(store, run)
    except TraceprofError:  # the computing path says it, as it always has
        return False
    _emit(shown, f"{view['title']}{f' ({table})' if table else ''}: {run_title}")
    if fmt is Format.table:
        for n in view["notes"]:
            say(n, out)
    return True


def _save(store: Store, run: str | None, name: str, result: Any) -> None:
    """Store ``result``'s tables as result_<name>_<table> and say which."""
    try:
        saved = store.save_frames(store.resolve_run(run), f"result_{name}", result.frames())
    except KeyboardInterrupt:
        done = "saved" if store.commits else "not saved; the store is unchanged"
        raise Interrupted(f"interrupted; the result tables result_{name}_* were {done}") from None
    say(f"saved tables: {', '.join(saved)}")


def _run_title(store: Store, run: str | None) -> str:
    """``run 'name' (id N)`` of a run, for table titles."""
    name, run_id = _run_ref(store, run)
    return f"run {name!r} (id {run_id})"


def _run_ref(store: Store, run: str | None) -> tuple[str, int]:
    """(name, id) of a run (default: the latest)."""
    from traceprof.storage.runs import run_name

    run_id = store.resolve_run(run)
    return run_name(store, run_id), run_id


def _params(
    param: list[str] | None, scope: list[str], implied: str | None = None
) -> dict[str, dict[str, str]]:
    """``-p`` options (``ANALYSIS.KEY=VALUE`` or ``KEY=VALUE``) over the config file's, as
    {analysis: {key: value}} (:func:`traceprof.engine.options.parse`)."""
    from traceprof.engine.options import parse

    return parse(param or [], scope, implied, settings().params)


def _analysis_params(param: list[str] | None) -> dict[str, dict[str, str]]:
    """``-p`` of the commands that run the report's analyses (summary, report): a bare KEY goes to
    every one of them that takes it."""
    from traceprof.engine.findings import report_analyses

    return _params(param, [a.name for a in report_analyses()])


def _mfu_options(param: list[str] | None) -> dict[str, str]:
    """``-p`` of the commands whose one analysis parameter set is mfu's (diff, history)."""
    from traceprof.engine.timing import MFU

    return _params(param, [MFU], implied=MFU).get(MFU, {})


@app.command()
def summary(
    db: DbOpt = Path(DEFAULT_DB),
    run: RunOpt = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="RUNS",
            help="Also compare the run with these baseline runs: a "
            "run, runs separated by commas, or a baseline set (the regression verdict, as diff gives it).",
        ),
    ] = None,
    param: AnalysisParamOpt = None,
    fmt: CommentFormatOpt = CommentFormat.table,
    force: BaselineForceOpt = False,
    no_cache: NoCacheOpt = False,
) -> None:
    """The findings of a run, ranked by the time they could recover (the step account), and one verdict
    per topic. JSON: run, baseline, coverage (the untraced ranks), findings (each with its topic, ranks,
    metric, value and unit, recoverable_ns, cause and evidence: the analysis table and the command
    that show it), verdicts and unavailable_analyses (the analyses that do not apply to the run's
    sources); markdown: a pull-request comment."""
    from traceprof.api import open as open_session

    params = _analysis_params(param)  # a bad -p before the store is opened
    with open_session(db, cache=not no_cache) as s:
        f = s.summary(run, params, baseline, force)
    if fmt is CommentFormat.json:
        sys.stdout.write(
            term.json_text(orjson.dumps(f.to_dict(), option=orjson.OPT_INDENT_2).decode()) + "\n"
        )
        return
    if fmt is CommentFormat.markdown:
        from traceprof.render.markdown import findings_markdown

        sys.stdout.write(findings_markdown(f))
        return
    if fmt is CommentFormat.csv:
        render(f.to_frame(), Format.csv)
        return
    if f.coverage:
        say(f"Ranks: {f.coverage}", out)
    say(f"Findings for run {f.run!r}. {f.ranking} (-: none measured); each with its topic's verdict:", out)
    for i, x in enumerate(f.findings, 1):
        say(f"{i:2}. {'-' if x.rank_by is None else f'{x.rank_by:.0f}%':>5}  {x.status:8} {x.text}", out)
    if not f.findings:
        say(f"    {f.empty_text}", out)
    say("Verdicts:", out)
    for v in f.verdicts:
        say(f"    {v.topic:14} {v.status:8} {v.text}", out)
    if f.unavailable:
        say(
            "Not available from this run's sources: "
            + "; ".join(f"{m.analysis} ({m.needs or m.reason})" for m in f.unavailable),
            out,
        )


def _kv(s: str) -> tuple[str, str]:
    if "=" not in s:
        raise UsageError(f"--param {s!r}: expected KEY=VALUE")
    k, v = s.split("=", 1)
    return k.strip(), v.strip()


@app.command()
def report(
    db: DbOpt = Path(DEFAULT_DB),
    run: RunOpt = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="HTML file to write.", parser=_file_path, metavar="FILE")
    ] = Path("report.html"),
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="RUNS",
            help="Also diff the run against these baseline runs: a "
            "run, runs separated by commas, or a baseline set.",
        ),
    ] = None,
    param: AnalysisParamOpt = None,
    force: BaselineForceOpt = False,
    executor: ExecutorOpt = "local",
    scheduler: SchedulerOpt = None,
    no_cache: NoCacheOpt = False,
    units: UnitsOpt = "human",
) -> None:
    """Write a self-contained HTML report (works offline) of one run."""
    from traceprof.api import open as open_session

    params = _analysis_params(param)
    fileio.check_not_store(output, db)
    with open_session(db, cache=not no_cache, executor=executor, scheduler=scheduler) as s:
        s.report(output, run, baseline=baseline, params=params, force=force, units=units)
    say(f"report written to {fileio.output_name(output)}")


BaselineArg = Annotated[
    str,
    typer.Argument(
        help="Baseline: a run (name or id), runs separated by commas (a,b,c: the noise test needs 2+, 3+ is "
        "better; a baseline set's name among them stands for its runs), or a baseline set (traceprof baseline add)."
    ),
]
DIFF_TABLES = ("metrics", "structure", "items", "ranks", "top")


@app.command()
def diff(
    base: BaselineArg,
    cand: Annotated[str, typer.Argument(help="Candidate run (name or id).")],
    db: DbOpt = Path(DEFAULT_DB),
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            "-t",
            metavar="[METRIC=]FRACTION",
            help="Relative regression threshold: 0.05 (every timing metric) or METRIC=0.05 "
            "(also flops, launches, collectives, comm_bytes).",
        ),
    ] = None,
    param: MfuParamOpt = None,
    out_fmt: CommentFormatOpt = CommentFormat.table,
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            metavar="NAME",
            help="Print only this table: metrics, structure (changed op/kernel/collective counts), items "
            "(all), ranks (compute per rank) or top (15 largest changes).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Compare runs that are not comparable (GPU vs CPU, other world size) by per-rank medians.",
        ),
    ] = False,
    no_cache: NoCacheOpt = False,
    units: UnitsOpt = "human",
) -> None:
    """Compare a run with baseline runs: exit 3 on a regression (structural or timing), 4 when the
    noise does not allow a verdict (inconclusive), 0 when it is within the thresholds (CI gate).

    Default output: table: metrics, structural changes, the 20 largest item changes, notes and
    summary; json: verdict, exit_code, summary, notes, metrics, structure, items and ranks; csv: the
    metrics (one table per CSV; ``--table items`` for the items); markdown: a pull-request comment
    (verdict, gated metrics, structural and largest item changes, notes). Notes and, except in table
    format, the summary go to stderr.
    """
    from traceprof.api import open as open_session

    limits = _thresholds(threshold)
    if table is not None and table not in (*DIFF_TABLES, "frame"):
        raise UsageError(f"diff has tables {', '.join(DIFF_TABLES)}; not {table!r}")
    mfu_options = _mfu_options(param)  # a bad -p before the store is opened
    with open_session(db, cache=not no_cache, memo=False) as s:  # many runs: nothing kept in memory
        res = s.diff(base, cand, limits, mfu_options=mfu_options, force=force)
    _settle(res.exit_code)  # kept when the output's reader leaves early (`| head -50` in CI)
    title = f"{term.label(res.baseline)} -> {term.label(cand)}"
    if out_fmt is CommentFormat.markdown:
        from traceprof.render.markdown import diff_markdown
        from traceprof.render.markdown import table as md_table

        if table is None:
            sys.stdout.write(diff_markdown(res, cand))
        else:
            frame = res.frames()["frame" if table == "metrics" else table]
            sys.stdout.write("\n".join(md_table(frame)) + "\n")
        raise typer.Exit(res.exit_code)
    fmt = Format(out_fmt.value)
    if fmt is Format.json and table is None:
        sys.stdout.write(
            term.json_text(orjson.dumps(res.to_dict(), option=orjson.OPT_INDENT_2).decode()) + "\n"
        )
    else:
        frames = res.frames()
        render(
            frames["frame" if table in (None, "metrics") else table],
            fmt,
            f"{table or 'metrics'}: {title}",
            units=units,
        )
        if fmt is Format.table and table is None:
            if res.structure.height:
                render(
                    res.structure.drop("sig").head(20),
                    fmt,
                    f"structure: changed counts per step, largest FLOPs change first: {title}",
                    units=units,
                )
            render(
                res.items.head(20),
                fmt,
                f"items: typical time per step, largest changes first: {title}",
                units=units,
            )
        if table is None and fmt is not Format.json and res.items.height > (20 if fmt is Format.table else 0):
            shown = "the first 20" if fmt is Format.table else "none"
            say(f"{res.items.height} items, {shown} shown: --table items for all")
        for note in res.notes[1:]:
            say(note)
        say(res.summary, out if fmt is Format.table else err)
    if res.exit_code:
        raise typer.Exit(res.exit_code)


baseline_app = typer.Typer(
    help="Named sets of baseline runs for diff, report and summary (kept in the store): list them; add, rm.",
    no_args_is_help=False,
)
app.add_typer(baseline_app, name="baseline")


@baseline_app.callback(invoke_without_command=True)
def baseline(ctx: typer.Context, db: DbOpt = Path(DEFAULT_DB), fmt: FormatOpt = Format.table) -> None:
    """List the baseline sets (``baseline list``); ``baseline add NAME RUN...`` makes or extends one,
    ``baseline rm NAME [RUN...]`` removes runs from one, or the whole set."""
    if ctx.invoked_subcommand is None:
        baseline_list(db, fmt)


@baseline_app.command("list")
def baseline_list(db: DbOpt = Path(DEFAULT_DB), fmt: FormatOpt = Format.table) -> None:
    """List the baseline sets: name, runs, run names."""
    from traceprof.storage.baselines import sets

    with Store(db, read_only=True) as store:
        render(sets(store), fmt, f"baseline sets in {db}")


@baseline_app.command("add")
def baseline_add(
    name: Annotated[str, typer.Argument(help="Name of the set (not a run's name).")],
    runs: Annotated[list[str], typer.Argument(help="Runs (names or ids) to add.", metavar="RUN")],
    db: DbOpt = Path(DEFAULT_DB),
) -> None:
    """Add runs to a baseline set, creating it: `traceprof diff NAME CAND` then compares with all of them."""
    from traceprof.storage.baselines import add

    with Store(db, create=False) as store:
        added, already = add(store, name, runs)
    say(
        f"baseline set {name!r}: added {', '.join(added) or 'nothing'}"
        + (f"; already in it: {', '.join(already)}" if already else "")
    )


@baseline_app.command("rm")
def baseline_rm(
    name: Annotated[str, typer.Argument(help="Name of the set.")],
    runs: Annotated[
        list[str] | None, typer.Argument(help="Runs to remove (default: the whole set).", metavar="RUN")
    ] = None,
    db: DbOpt = Path(DEFAULT_DB),
) -> None:
    """Remove runs from a baseline set, or the whole set (the runs stay in the store)."""
    from traceprof.storage.baselines import remove

    with Store(db, create=False) as store:
        n = remove(store, name, runs or [])
    say(f"baseline set {name!r}: removed {n} run(s)" + ("" if runs else " (the set is gone)"))


@app.command()
def history(
    job: Annotated[
        str,
        typer.Argument(
            help="The job's runs: a baseline set, runs separated by commas, or the start of their names (nightly_)."
        ),
    ],
    db: DbOpt = Path(DEFAULT_DB),
    metric: Annotated[
        list[str] | None,
        typer.Option("--metric", "-m", help="Show only this metric (repeatable).", metavar="METRIC"),
    ] = None,
    window: Annotated[
        int, typer.Option("--window", help="Most earlier runs a run's noise band is computed from.")
    ] = 10,
    param: MfuParamOpt = None,
    fmt: FormatOpt = Format.table,
    raw: RawOpt = False,
    no_cache: NoCacheOpt = False,
) -> None:
    """Each gate metric of a job's runs in recording order, with its noise band and change points (drift
    before it crosses the diff gate)."""
    from traceprof.api import open as open_session

    if window < 2:  # here, before the store opens, to echo it as typed (the library checks it too)
        raise UsageError(
            f"--window {_typed('window', window)}: must be at least 2 (a noise band needs 2+ earlier runs)"
        )
    mfu_options = _mfu_options(param)  # a bad -p before the store is opened
    with open_session(db, cache=not no_cache, memo=False) as s:  # many runs: nothing kept in memory
        res = s.history(job, window=window, mfu_options=mfu_options, metrics=metric or ())
    frame = res.frame
    if fmt is Format.json:
        sys.stdout.write(
            orjson.dumps({**res.to_dict(), "rows": frame.to_dicts()}, option=orjson.OPT_INDENT_2).decode()
            + "\n"
        )
        return
    render(frame, fmt, f"history of {job}", raw)
    for note in res.notes:
        say(note, out if fmt is Format.table else err)


def _thresholds(threshold: list[str] | None) -> dict[str, float]:
    """``-t`` options over the config file's ``[diff]`` thresholds: a metric given on the command
    line replaces the config's; ``-t FRACTION`` (every timing metric) replaces its timing ones."""
    from traceprof.engine.diff import MEMORY_METRIC, METRICS

    given = {k: _fraction(k, v, t) for t in threshold or [] for k, v in [_kv(t) if "=" in t else ("*", t)]}
    config = dict(settings().thresholds)
    if "*" in given:  # the metrics -t FRACTION sets (diff.thresholds: the timing ones but memory)
        config = {k: v for k, v in config.items() if k not in METRICS or k == MEMORY_METRIC}
    return {**config, **given}


def _fraction(key: str, raw: str, typed: str) -> float:
    """``-t``'s value for metric ``key`` (``*``: every timing metric) as a float (``typed``: the
    whole value as typed, ``step_time_ns=0.1``).

    Raises:
        UsageError: Not a number, or not in (0, 1], naming the option and the value as typed
            (``--threshold step_time_ns=abc``, ``-t 1e400``).
    """
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"--threshold {typed!r}: expected a fraction such as 0.1 (10%)") from None
    if not 0 < value <= 1:  # nan too; 1e400 reads as inf: the message says what was typed
        raise UsageError(f"{_option_typed(typed)} {typed}: thresholds are fractions in (0, 1] (0.05 = 5%)")
    return value


@app.command()
def collect(
    script: Annotated[
        list[str], typer.Argument(help="Training script and its arguments (after --).", metavar="COMMAND")
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Folder for the rank traces (one run).", metavar="DIR", parser=_out_dir
        ),
    ],
    nproc: Annotated[int, typer.Option("--nproc", "-n", help="Ranks on this machine, 1 to 1,024.")] = 1,
    db: DbOpt = Path(DEFAULT_DB),
    then_ingest: Annotated[
        bool, typer.Option("--ingest/--no-ingest", help="Ingest the traces afterwards.")
    ] = True,
    nsys: Annotated[
        bool,
        typer.Option(
            "--nsys",
            help="Run each rank under nsys profile (cuda, nvtx, osrt; "
            "rank%q{RANK} reports with SQLite exports) instead of torch.profiler.",
        ),
    ] = False,
) -> None:
    """Run a training script on N ranks (torchrun) that profiles itself with profile_ranks(), or under nsys."""
    if nsys:
        from traceprof.collectors.nsys.export import launch_nsys as launch
    else:
        from traceprof.collectors.kineto.launch import launch

    if nproc < 1:  # here, to echo it as typed (the launchers check it too)
        raise UsageError(f"--nproc {_typed('nproc', nproc)}: expected 1 or more ranks")
    fileio.check_not_store(out, db)
    code = launch(script, out, nproc=nproc)
    if code != 0:
        written = 0 if nsys else sum((out / f"rank{r}.meta.json").is_file() for r in range(nproc))
        if written == nproc:
            # profile_ranks writes a rank's sidecar after its trace: all there, the traces are whole
            # (torch 2.13's CPU profiler with gloo can abort a process at exit after writing them).
            say(
                f"the training job exited with status {code} after every rank wrote its trace and "
                f"sidecar to {out}; nothing was ingested: {term.command('traceprof', 'ingest', out, '--db', db)} "
                "reads them",
                label="error:",
                style="red",
            )
        else:
            say(
                f"the training job exited with status {code}; traces in {out} may be partial",
                label="error:",
                style="red",
            )
        raise typer.Exit(1)
    if then_ingest:
        ingest([out], db=db, run=None, skip_bad_events=False, jobs=None, align=True)


#: Environment variables that change what a command does, shown by ``traceprof config`` when set.
_ENV_SWITCHES = {
    "TRACEPROF_NO_CACHE": "--no-cache on every command",
    "TRACEPROF_THREADS": "threads of report and summary",
    "TRACEPROF_FRESH_EVENTS": "fewest events of a run whose heavy analyses run in a fresh process",
}


@app.command("config")
def config_show(ctx: typer.Context, db: DbOpt = Path(DEFAULT_DB), fmt: FormatOpt = Format.table) -> None:
    """Print the settings in effect (config file, store, -p defaults, diff thresholds) and where each
    came from: command line > environment > config file > default."""
    from traceprof.engine.diff import thresholds

    cfg = settings()
    where = cfg.where if cfg.path else "default"
    given = getattr(ctx.get_parameter_source("db"), "name", "")  # typer's own click: compared by name
    source = {
        "COMMANDLINE": "command line (--db)",
        "ENVIRONMENT": "environment (TRACEPROF_DB)",
        "DEFAULT_MAP": where,
    }.get(given, "default")
    how = {
        "--config": "command line (--config)",
        "TRACEPROF_CONFIG": "environment (TRACEPROF_CONFIG)",
        "found": "found from the current directory",
    }
    rows = [("config", str(cfg.path or "none"), how.get(cfg.how, "")), ("db", str(db), source)]
    rows += [(f"-p {p.split('=', 1)[0]}", p.split("=", 1)[1], where) for p in cfg.params]
    default = thresholds({})
    for k, v in thresholds(cfg.thresholds).items():
        mine = k in cfg.thresholds or v != default[k]
        rows.append((f"diff -t {k}", f"{v:g}", where if mine else "default"))
    rows += [
        (k, os.environ[k], f"environment ({what})") for k, what in _ENV_SWITCHES.items() if k in os.environ
    ]
    render(pl.DataFrame(rows, schema=["setting", "value", "source"], orient="row"), fmt, "traceprof settings")


export_app = typer.Typer(help="Export a run to other tools' formats.", no_args_is_help=True)
app.add_typer(export_app, name="export")


@export_app.command("perfetto")
def export_perfetto(
    db: DbOpt = Path(DEFAULT_DB),
    run: RunOpt = None,
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="Chrome trace JSON (.json or .json.gz).", parser=_file_path, metavar="FILE"
        ),
    ] = Path("trace.json.gz"),
    no_findings: Annotated[
        bool,
        typer.Option(
            "--no-findings",
            help="Leave out the findings tracks (exposed communication, idle with its cause, straggler "
            "waits, critical path), which run those analyses.",
        ),
    ] = False,
) -> None:
    """One merged, clock-aligned Chrome/Perfetto trace of all ranks with launch->kernel flows and findings tracks (open in ui.perfetto.dev)."""
    from traceprof.render.export import export_perfetto as do_export

    fileio.check_not_store(output, db)
    with Store(db, read_only=True) as store:
        n = do_export(store, run, output, findings=not no_findings)
    say(f"{n:,} events written to {fileio.output_name(output)} (metadata events included)")


def _say_interrupted() -> None:
    """Say that Ctrl-C stopped a command that stores nothing, once the results folders it created
    are removed (:func:`traceprof.engine.resultcache.remove_created`): nothing was changed."""
    kept = sys.modules.get("traceprof.engine.resultcache")  # not imported: none created
    if kept is not None:
        kept.remove_created()
    say("interrupted; nothing was changed")


#: The exit status a command settled on before writing its output (:func:`_settle`): what a broken
#: pipe ends it with. Reset by :func:`_main` for each command line.
_verdict = 0


def _settle(code: int) -> int:
    """Record ``code`` as the command's exit status before it writes its output, and return it: a
    reader that leaves early (``traceprof diff ... | head -1`` in a CI step) ends the command with
    it, not 0 (diff's 3 on a regression, 4 inconclusive; an ingest's 1 with failed files)."""
    global _verdict
    _verdict = code
    return code


def _exit(code: int) -> NoReturn:
    """Exit with ``code`` once the output is written out (:func:`_flushed`); after Ctrl-C (130) at
    once, without waiting for killed parser workers' bookkeeping threads (the store is closed and
    the message printed by then)."""
    code = _flushed(code)
    if code != 130:
        sys.exit(code)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(130)


def _flushed(code: int) -> int:
    """Flush stdout and give the exit code that follows: ``code``, or 1 with one line saying why
    when the output could not be written (``> /dev/full``, a full disk); on a broken pipe
    (``| head``, as in :func:`main`) ``code``, or the verdict (:func:`_settle`) when it is 0. Python's own flush at exit drops that error when the CLI runs
    as a script (a truncated file and exit 0); after Ctrl-C (130) the code stays."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _reader_gone()
        return code or _verdict
    except OSError as e:
        _drop_stdout()
        if code == 130:
            return code
        say(_os_error_text(e), label="error:", style="red")
        return 1
    return code


def _reader_gone() -> None:
    """Stdout's reader left (``| head -1``: a BrokenPipeError): drop what stdout holds and close
    stderr, so that nothing more is said (the command's verdict follows, :func:`_settle`: exit 0
    unless it had one, as for any filter cut short)."""
    _drop_stdout()
    sys.stderr.close()


@contextlib.contextmanager
def _piped_out() -> Iterator[None]:
    """Where a command streams to stdout: a reader that leaves early ends it quietly with the
    command's verdict (:func:`_settle`, 0 unless it had one; :func:`_reader_gone`), as :func:`_main`
    does, not with typer's silent exit 1 (it takes a BrokenPipeError raised inside a command for its
    own and exits 1)."""
    try:
        yield
    except BrokenPipeError:
        _reader_gone()
        raise typer.Exit(_verdict) from None


def _drop_stdout() -> None:
    """Send what stdout still holds nowhere (its fd to /dev/null), so that Python's flush at exit
    neither fails again nor prints "Exception ignored" once the error has been reported."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _os_error_text(e: OSError) -> str:
    """An OSError as the CLI's one line: the system's words and the file, if any."""
    where = f": {e.filename}" if e.filename else ""
    return f"{e.strerror or e}{where}"


def _whole_writes() -> None:
    """Make every write to stdout all or an error. With ``PYTHONUNBUFFERED=1`` (set in many CI
    jobs and containers) stdout is a text layer straight over the file, which drops the rest of a
    short write (a disk with 4 KiB left took 4,096 of 76,590 bytes, and no error came); a buffered
    layer in between writes the rest or raises. Lines still go out as they are written."""
    if type(getattr(sys.stdout, "buffer", None)) is not io.FileIO:
        return
    stdout = sys.stdout  # left open as it is (sys.__stdout__): the new layers have their own file object
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(stdout.fileno(), "w", closefd=False)),
        encoding=stdout.encoding,
        errors=stdout.errors,
        line_buffering=True,
    )


class _NoPandas:
    """A module finder standing in for one of ``sys.meta_path`` (see :func:`_parse_without_pandas`):
    it answers as that finder does, except that it finds no pandas module.

    With every finder wrapped, the import system sees pandas as not installed: ``import pandas``
    raises ModuleNotFoundError and ``importlib.util.find_spec("pandas")`` is None, as for a missing
    module (a finder that raised from ``find_spec`` made that probe raise; one that returned None
    alone would leave pandas to the finders after it). The wrapper compares equal to the finder it
    wraps, so code that looks a finder up in ``sys.meta_path`` or removes it still finds it.
    """

    def __init__(self, finder: Any) -> None:
        self.finder = finder

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "pandas" or name.startswith("pandas."):
            return None
        find = getattr(self.finder, "find_spec", None)
        return None if find is None else find(name, path, target)

    def __getattr__(self, attr: str) -> Any:  # invalidate_caches, find_distributions, ...
        if attr == "finder":  # not set yet (a copy being made): no recursion
            raise AttributeError(attr)
        return getattr(self.finder, attr)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.finder

    def __hash__(self) -> int:
        return hash(self.finder)


def _parse_without_pandas() -> None:
    """Keep pandas out of a process that parses traces.

    pyarrow looks for pandas on its first ``pa.array()`` and on every ``Array.to_numpy()`` until
    pandas has loaded (its C++ side retries a failed import), and imports it when installed (bokeh
    installs it): 0.6 s and about 35 MB in the ingest process and each parser worker, for nothing,
    since traceprof never hands pyarrow a pandas object. Only the CLI's parsing commands refuse the
    import, for the whole process (every finder of ``sys.meta_path`` wrapped in :class:`_NoPandas`;
    finders added later are not); the library used from Python is unchanged.
    """
    if "pandas" not in sys.modules:
        sys.meta_path[:] = [f if isinstance(f, _NoPandas) else _NoPandas(f) for f in sys.meta_path]


#: ``-j 4``, ``--max-rows 0``: the integers converted here (others, ``1_000``, ``0x10``, go to typer).
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
#: ``--max-inflate 64``, ``--timeout 2.5``: the floats converted here (exponents, ``nan``: typer's).
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,15})?")
_DEFER = object()
#: Whole-number options with a range: name -> (lowest, highest, what it counts), for the message;
#: below the lowest, the command's own check speaks (``--jobs 0: expected 1 or more``). The others
#: are unbounded above on purpose: ``--max-rows 10**30`` is every row, ``--window`` every run.
_INT_LIMITS = {
    "jobs": (1, 1024, " parser processes"),
    "nproc": (1, 1024, " ranks on this machine"),
}
#: Keys of click's ``ctx.meta`` (one dict for a command line's contexts): the running command's
#: arguments as typed, and option name -> its value as typed (or in its environment variable). For
#: messages: ``--max-inflate 0`` says ``0``, not the ``0.0`` it converts to; ``-t 1e400`` says ``-t``.
_ARGS, _VALUES = "traceprof.args", "traceprof.values"


def _as_typed() -> dict[str, Any]:
    """The ``ctx.meta`` of the command line being run (:data:`_ARGS`, :data:`_VALUES`), by
    ``main()``, ``app()`` or click's test runner alike; empty outside one (a library call)."""
    try:
        from typer._click.globals import get_current_context  # typer vendors click
    except ImportError:  # another typer: messages say the long name and the converted value
        return {}
    ctx = get_current_context(silent=True)
    return {} if ctx is None else ctx.meta


def _typed(name: str, value: object) -> str:
    """Option ``name``'s value as the user typed it, else ``value`` written plainly (a whole
    float without its ``.0``)."""
    typed = _as_typed().get(_VALUES, {})
    if name in typed:
        return str(typed[name])
    text = repr(value) if isinstance(value, float) else str(value)
    return text[:-2] if text.endswith(".0") else text


def _option_typed(value: str, names: tuple[str, str] = ("-t", "--threshold")) -> str:
    """Which of the option's ``names`` the command line gave ``value`` with (``-t 0.1``,
    ``--threshold=0.1``, ``-t0.1``); the long name where it cannot tell (a config file's value)."""
    args = _as_typed().get(_ARGS, ())
    for i, a in enumerate(args):
        if (a in names and i + 1 < len(args) and args[i + 1] == value) or a == f"{names[0]}{value}":
            return a if a in names else names[0]
    return names[1]


class _PlainParam:
    """Converts an option's value without pydantic where it is one of this CLI's plain types, else
    hands it to typer's own conversion (see :func:`_plain_coercion`)."""

    def __init__(self, param: Any, typer_param: Callable[[], Any]) -> None:
        self.param, self.typer_param = param, typer_param

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        if isinstance(value, str) and param.name and ctx is not None:
            ctx.meta.setdefault(_VALUES, {})[param.name] = value  # for messages (:func:`_typed`)
        if value is None:
            return () if multi else None
        if not (multi and isinstance(value, str)):
            desc = param.type_descriptor
            info = desc.parameter_info
            if info.parser is not None and not multi and isinstance(value, str | Path):
                return info.parser(value)  # typer hands a parser the value as it is (--db's)
            if (
                info.parser is not None
                and desc.is_list
                and isinstance(value, list | tuple)
                and all(isinstance(v, str | Path) for v in value)
            ):
                return [info.parser(v) for v in value]  # ingest's PATHs: typer's list, an item at a time
            plain = info.parser is None and info.min is None and info.max is None
            got: Any = _DEFER
            if plain and desc.is_list and isinstance(value, list | tuple):
                items = [self._leaf(v, desc.annotation.__args__[0], info, ctx) for v in value]
                got = _DEFER if any(v is _DEFER for v in items) else items
            elif plain and not desc.is_list and not desc.is_tuple:
                got = self._leaf(value, desc.annotation, info, ctx)
            if got is not _DEFER:
                return got
        return self.typer_param().coerce(value, param=param, ctx=ctx)  # typer's: its messages

    def _named(self, typed: str) -> str:
        """``--jobs abc``: the option's long name and its value as typed, for messages."""
        opts = getattr(self.param, "opts", None) or [str(getattr(self.param, "name", ""))]
        name = next((o for o in opts if o.startswith("--")), opts[0])
        plain = typed and not any(c.isspace() for c in typed)  # else quoted: where it starts and ends
        return f"{name} {typed}" if plain else f"{name} {typed!r}"

    def _bounded(self, n: int, typed: str | int) -> int:
        """``n``, refused above :data:`_INT_LIMITS`' bound for this option (below its lowest, the
        command's own check speaks: every whole-number option has one).

        Raises:
            UsageError: Naming the option and the value as typed, and the range.
        """
        limits = _INT_LIMITS.get(str(getattr(self.param, "name", "")))
        if limits is not None and n > limits[1]:
            low, high, what = limits
            raise UsageError(f"{self._named(str(typed))}: expected {low:,} to {high:,}{what}")
        return n

    def _leaf(self, v: Any, kind: Any, info: Any, ctx: Any) -> Any:
        from typer import _param_types as types

        if kind is str and isinstance(v, str):
            return v
        if kind is int and (type(v) is int or (isinstance(v, str) and _INT.fullmatch(v))):
            return self._bounded(int(v), v)
        if kind is float and (type(v) in (int, float) or (isinstance(v, str) and _FLOAT.fullmatch(v))):
            return float(v)
        if kind in (int, float) and isinstance(v, str):  # Python's reading (1_000, 1e3), else one line
            try:
                return float(v) if kind is float else self._bounded(int(v), v)
            except ValueError:
                what = "a whole number" if kind is int else "a number"
                raise UsageError(f"{self._named(v)}: expected {what}") from None
        if isinstance(kind, type) and issubclass(kind, Enum):
            try:
                return types.coerce_cli_choice(
                    v, choices=list(kind), case_sensitive=info.case_sensitive, ctx=ctx
                )
            except ValueError:
                if not isinstance(v, str):
                    return _DEFER
                *first, last = [str(c.value) for c in kind]
                raise UsageError(f"{self._named(v)}: expected {', '.join(first)} or {last}") from None
        if isinstance(kind, type) and issubclass(kind, Path) and info.path_type is None:
            if isinstance(v, str) and v:
                v = kind(v)
            if isinstance(v, kind):  # exists, dir_okay, ... checked as typer checks them
                return types.coerce_cli_path(v, info, path_type=kind, param=self.param, ctx=ctx)
        return _DEFER


def _plain_coercion() -> None:
    """Keep pydantic out of the commands' start-up.

    typer (0.29) converts every option's value through a pydantic ``TypeAdapter``: importing
    pydantic and building the adapters took 0.06-0.08 s of CPU in each command, a quarter of
    ``traceprof runs``. The options of this CLI are strings, whole numbers, decimals, paths
    without typer's checks, choices of an Enum and lists of those: a string converts to them as
    Python converts it (``int("12")``, ``Path("x")``), the same value pydantic gives. Those are
    converted here, and a value that is not a number or not a choice (``-j x``, ``-f yaml``) is
    refused here in one line naming the option and the value as typed (pydantic's words named
    neither); ``--jobs`` and ``--nproc`` are bounded (:data:`_INT_LIMITS`). Any other value goes to typer's own
    conversion. A typer without this hook (another version) is left as it is.
    """
    try:
        from typer import _param_types  # noqa: F401 - the helpers _PlainParam calls
        from typer.core import _TyperParameter
    except ImportError:
        return

    def ours(typer_param: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return lambda self: _PlainParam(self, lambda: typer_param(self))

    _patch(_TyperParameter, "get_runtime_param", ours)


def _record_args() -> None:
    """Keep each command's arguments as typed in click's ``ctx.meta`` (:data:`_ARGS`), for
    :func:`_option_typed`: click keeps the values, not which of an option's names gave them."""
    from typer.core import TyperCommand

    def ours(theirs: Callable[..., list[str]]) -> Callable[..., list[str]]:
        def parse_args(self: Any, ctx: Any, args: list[str]) -> list[str]:
            ctx.meta[_ARGS] = tuple(args)
            return theirs(self, ctx, args)

        return parse_args

    _patch(TyperCommand, "parse_args", ours)


def _patch(cls: type, name: str, ours: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace typer's method ``cls.name`` by ``ours(typer's)``, once; a typer without it (another
    version) is left as it is."""
    theirs = getattr(cls, name, None)
    if theirs is None or getattr(theirs, "plain", False):
        return
    method = ours(theirs)
    method.plain = True  # type: ignore[attr-defined]
    setattr(cls, name, method)


#: The value word ``--help`` shows for an option of each plain type without a metavar of its own
#: (typer 0.29 showed ``<int>``, ``<str>``, ``<list[str]>``).
_METAVARS: dict[Any, str] = {int: "N", float: "NUMBER", str: "TEXT", Path: "PATH"}


def _metavar(param: Any) -> str:
    """The word ``--help`` shows for ``param``'s value: its own metavar, else its choices
    (``table|json|csv``), else :data:`_METAVARS`' word for its type (a list's: its items')."""
    if param.metavar is not None:
        return str(param.metavar)
    desc = param.type_descriptor
    if desc.is_choice:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices or ())
    kind = desc.annotation
    if desc.is_list:
        kind = kind.__args__[0]
    return _METAVARS.get(kind, getattr(kind, "__name__", str(kind)).upper())


def _help_metavars() -> None:
    """Show field-standard value words in ``--help`` (``PATH``, ``N``, ``KEY=VALUE``): typer (0.29)
    printed ``<str>``, ``<int>``, ``<list[str]>`` beside options, ``<bool>`` beside flags (which
    take no value: nothing now), and required arguments as ``{paths}...`` in the usage line
    (``PATHS...`` now, an optional one ``[NAME]``). A typer without these hooks is left as it is."""
    try:
        from typer.core import TyperArgument, TyperOption
    except ImportError:
        return

    def option(shown: Callable[[Any, Any], str | None]) -> Callable[[Any, Any], str | None]:
        return lambda self, ctx: None if self.is_flag or self.count else _metavar(self)

    def argument(shown: Callable[[Any, Any], str | None]) -> Callable[[Any, Any], str | None]:
        return lambda self, ctx: None  # the name column shows it already

    def usage(shown: Callable[[Any], str]) -> Callable[[Any], str]:
        return argument_word

    _patch(TyperOption, "display_type_rich", option)
    _patch(TyperArgument, "display_type_rich", argument)
    _patch(TyperArgument, "_usage_display_name", usage)
    # the arguments panel and click's messages name it as the usage line does (typer: lower case)
    TyperArgument.display_name_raw = property(  # type: ignore[assignment,method-assign]
        lambda self: argument_word(self, panel=True)
    )


def argument_word(arg: Any, panel: bool = False) -> str:
    """The word for a command's argument (a click ``Argument``), the one way the usage line, the
    arguments panel, click's messages and the README's command table write it: its metavar (else its
    name) in capitals, ``...`` after one that takes several values, ``[...]`` around an optional one
    (``PATH...``, ``[NAME]``, ``RUN...``).

    Args:
        arg: The argument.
        panel: The word of the arguments panel and of click's messages: no brackets, and ``...``
            only where a metavar is set (typer's panel adds it itself to a name).
    """
    many = arg.nargs != 1
    word = (arg.metavar or arg.name or "").upper() + ("..." if many and (arg.metavar or not panel) else "")
    return word if panel or arg.required else f"[{word}]"


#: Python's cyclic garbage collector's thresholds while ``ingest`` runs (``gc.set_threshold``;
#: Python's default is (700, 10, 10)). An ingest makes few cycles but many long-lived objects (the
#: modules it imports, the parse's columns), which the default settings traverse again and again:
#: 127 collections, 0.04-0.07 s of the 1.07 s CPU of ``hta/df_index_resolver``, none of them
#: collecting more than 750 objects. Young objects are still collected (every 10,000 allocations);
#: same peak memory (226 MiB).
INGEST_GC_THRESHOLD = (10_000, 20, 1000)


def _one_line_helps(group: typer.Typer) -> None:
    """Each command's line in ``group``'s command list (and its subgroups'): the first sentence of the
    first paragraph of its help, on one line (typer's rich help prints that paragraph with the
    docstring's own line breaks, and click's plain help cuts it at 45 characters)."""
    infos: list[typer.models.CommandInfo | typer.models.TyperInfo] = [
        *group.registered_commands,
        *group.registered_groups,
    ]
    for info in infos:
        sub = info.typer_instance if isinstance(info, typer.models.TyperInfo) else None
        doc = info.help or (sub.info.help if sub is not None else getattr(info.callback, "__doc__", None))
        if isinstance(doc, str) and not info.short_help:
            first = " ".join(doc.strip().split("\n\n")[0].split())
            info.short_help = re.split(r"(?<=\.)\s+(?=[A-Z`])", first)[0]
        if sub is not None:
            _one_line_helps(sub)


_one_line_helps(app)

#: Where a command's line may be cut to fit (the end of a clause): "run: exit 3", "store (queries",
#: "step account; ...", "runs, ...".
_CLAUSE_END = re.compile(r"[;:,](?=\s)|\s(?=\()")


def fit_line(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: whole where it fits, else its longest beginning that
    ends a clause (before ``;``, ``:``, ``,`` or `` (``, outside parentheses) and is at least half
    ``width``, else cut at a word with ``…``."""
    if len(text) <= width:
        return text
    ends = [
        m.start()
        for m in _CLAUSE_END.finditer(text, 0, width + 1)
        if text.count("(", 0, m.start()) == text.count(")", 0, m.start()) and m.start() <= width
    ]
    if ends and 2 * ends[-1] >= width:
        return text[: ends[-1]]
    cut = text.rfind(" ", 0, width)  # the ellipsis takes the space's place
    return (text[:cut] if cut > 0 else text[: width - 1]).rstrip(" ,;:(") + "…"


def _fitted_command_lines() -> None:
    """Each command's line in the rich command list on one line of the terminal (80 columns: the
    first sentence of ``ingest``'s help wrapped to 2-3 lines): :func:`fit_line` to the width its
    description column has there; ``traceprof CMD --help`` keeps the whole help, and click's plain
    help (below :data:`NARROW_COLUMNS`) the whole sentence. Installed when a group's help is first
    printed (typer's rich help module loads then: not on every start). A typer without these hooks
    is left as it is."""
    try:
        from typer.core import TyperGroup
    except ImportError:
        return

    def panel(theirs: Callable[..., None]) -> Callable[..., None]:
        def fitted(*, commands: list[Any], console: Any, cmd_len: int, **kw: Any) -> None:
            # the panel's border and padding (4) and the 2 spaces between the table's columns
            width = max(console.width - cmd_len - 6, 20)
            lines = []
            for c in commands:
                text = c.short_help or c.help or ""
                if len(text) > width:
                    c = copy.copy(c)
                    c.short_help = fit_line(" ".join(text.split()), width)
                lines.append(c)
            theirs(commands=lines, console=console, cmd_len=cmd_len, **kw)

        return fitted

    def group_help(theirs: Callable[..., None]) -> Callable[..., None]:
        def help_(self: Any, ctx: Any, formatter: Any) -> None:
            if typer.core.HAS_RICH and self.rich_markup_mode is not None:
                from typer import rich_utils

                _patch(rich_utils, "_print_commands_panel", panel)  # type: ignore[arg-type]
            _piped_help()
            theirs(self, ctx, formatter)

        return help_

    _patch(TyperGroup, "format_help", group_help)


_fitted_command_lines()


def _verdicts_through_pipes() -> None:
    """A reader of stdout that leaves early (``| head -1``) ends every command with its verdict
    (:func:`_settle`), and ``--help`` with 0: typer exits 1 on a BrokenPipeError raised while a
    command writes (``diff -f csv`` into a closed pipe: 1 where the verdict was 3), and rich's help
    console exits 1 (``traceprof analyze --help | head -1``). Each command runs inside
    :func:`_piped_out`, and typer's help console raises the BrokenPipeError that :func:`_main`
    ends quietly (:class:`_PipedConsole`). A typer without these hooks is left as it is."""
    try:
        from typer.core import TyperCommand, TyperGroup
    except ImportError:
        return

    def invoke(theirs: Callable[..., Any]) -> Callable[..., Any]:
        def piped(self: Any, ctx: Any) -> Any:
            with _piped_out():
                return theirs(self, ctx)

        return piped

    def help_(theirs: Callable[..., Any]) -> Callable[..., Any]:
        def piped_help(self: Any, ctx: Any, formatter: Any) -> None:
            _piped_help()
            theirs(self, ctx, formatter)

        return piped_help

    for cls in (TyperCommand, TyperGroup):  # a command with a callback of its own is a group
        _patch(cls, "invoke", invoke)
    _patch(TyperCommand, "format_help", help_)  # a group's: in _fitted_command_lines


def _piped_help() -> None:
    """typer's rich help console for stdout ends a broken pipe as :class:`_PipedConsole` does
    (installed when help is first printed: typer's rich help module loads then)."""
    if not typer.core.HAS_RICH:
        return
    from typer import rich_utils

    def piped_console(theirs: Callable[..., Any]) -> Callable[..., Any]:
        def console(*args: Any, **kw: Any) -> Any:
            c = theirs(*args, **kw)
            if not c.stderr:
                c.on_broken_pipe = _PipedConsole.on_broken_pipe.__get__(c)
            return c

        return console

    _patch(rich_utils, "_get_rich_console", piped_console)  # type: ignore[arg-type]


_verdicts_through_pipes()


def main() -> None:
    """Entry point: run the app, turning TraceprofError into a one-line message and exit 1."""
    global _finished
    one_blas_thread()  # before numpy loads: its thread pool only spins here (traceprof.core.blas)
    if len(sys.argv) > 1 and sys.argv[1] in ("ingest", "collect"):  # the commands that parse traces
        _parse_without_pandas()
    if len(sys.argv) > 1 and sys.argv[1] == "ingest":
        import gc

        before = gc.get_threshold()
        gc.set_threshold(*INGEST_GC_THRESHOLD)
        try:
            _main()
            _finished = True
        except SystemExit:  # its exit code: an error said, or --partial with failures
            _finished = True
            raise
        finally:  # as it was for what runs next in this process (main() from Python, tests)
            gc.set_threshold(*before)
    else:
        _main()


#: Below this many columns typer's rich help cuts option names and their notes in its table cells
#: (``[env var: TRACEPRO…``, ``--skip-b…``): there help is click's plain text, which wraps each line
#: whole. typer's own switch, read when help or a usage error is printed.
NARROW_COLUMNS = 60
_RICH_HELP = typer.core.HAS_RICH


def _main() -> None:
    """:func:`main`'s command, run."""
    _settle(0)  # a verdict of a command run before in this process (tests) is not this one's
    _whole_writes()
    typer.core.HAS_RICH = _RICH_HELP and shutil.get_terminal_size().columns >= NARROW_COLUMNS
    if (kept := sys.modules.get("traceprof.engine.resultcache")) is not None:  # run in-process again
        kept.forget_created()
    try:
        code = app(standalone_mode=False)  # a command's typer.Exit(n) comes back as n here
    except TraceprofError as e:
        # One line, escaped; an error that lists several files keeps one line per file (any other
        # line break came from a value, e.g. a --db path holding one: written out as \n).
        text = str(e)
        several = isinstance(e, TraceFormatError) and not e.path
        lines = text.split("\n") if several else [text.replace("\r", "\\r").replace("\n", "\\n")]
        say(lines[0], label="" if isinstance(e, Interrupted) else "error:", style="red")
        for line in lines[1:]:
            say(line)
        _exit(e.exit_code)
    except typer.Exit as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # typer's way of passing on Ctrl-C
            _say_interrupted()
        _exit(e.exit_code)
    except typer.Abort:
        _exit(1)
    except KeyboardInterrupt:  # commands that write say what was stored (Interrupted, above)
        _say_interrupted()
        _exit(130)
    except RuntimeError as e:  # DuckDB's way of saying that Ctrl-C stopped a query
        if "interrupted" not in str(e).lower():
            raise
        _say_interrupted()
        _exit(130)
    except ImportError as e:  # a library the command imports late (bokeh for report, dask)
        from traceprof.core.errors import missing_module

        say(missing_module(e), label="error:", style="red")
        _exit(1)
    except (
        BrokenPipeError
    ):  # e.g. `traceprof analyze list | head -1`: the command's verdict, 0 unless it had one
        _reader_gone()
        sys.exit(_verdict)
    except OSError as e:  # the output not written (`> /dev/full`: a full disk), a file unreadable
        _drop_stdout()
        say(_os_error_text(e), label="error:", style="red")
        sys.exit(1)
    except Exception as e:  # click's usage errors (typer vendors click): one line, exit 1
        if type(e).__module__.startswith(("duckdb", "_duckdb")):  # a store file cut short, say
            from traceprof.storage.store import damaged

            if (bad := damaged(e)) is not None:
                say(bad, label="error:", style="red")
                _exit(1)
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            ctx = getattr(e, "ctx", None)
            where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            say(e.format_message() + where, label="error:", style="red")
            _exit(1)
        raise
    if code == 130:  # typer turns Ctrl-C in a command into exit code 130, silently
        _say_interrupted()
    code = _flushed(code if isinstance(code, int) else 0)  # a failed write is exit 1, not a short file
    if code:
        _exit(code)


# typer's conversion, help words and the arguments as typed, as this CLI has them: installed on
# import, so that main(), app() from Python and click's test runner run the same command line
_plain_coercion()
_help_metavars()
_record_args()

if __name__ == "__main__":
    try:
        main()
    except SystemExit as e:
        leave(e.code)  # an ingest ends here, its exit code kept
        raise
    leave()
