"""What the preflight reads of an input to check it: a table's files, header,
schema and every file's columns; a CSV image manifest's rows outside its folder.

The checks raise ``ConvertError`` naming the flag or file to change; they read
only what a check needs (a sample of rows, each file's header).
"""

from __future__ import annotations

import concurrent.futures
import csv
import io
import itertools
import os
import re

from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.run_plan import ConvertError
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.table_schema import TableSchema, load_schema
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.table_readers import csv_sample_lines, table_format, typed_sample
from beam_tfrecords.transforms.plan.layouts import IMAGE_COLUMNS, image_path_column, rows_outside
from beam_tfrecords.transforms.plan.table_inference import infer_schema, infer_typed_schema
from beam_tfrecords.transforms.tables import table_files, table_header

__all__ = [
    "INFER_SAMPLE_ROWS",
    "check_manifest_rows",
    "check_table_headers",
    "infer_table_schema",
    "is_folder",
    "printable_root",
    "refuse_image_paths",
    "row_resolver",
    "sample_rows",
    "table_inputs",
    "table_schema",
]

INFER_SAMPLE_ROWS = 10_000
# Rows read to tell whether a CSV without an image column names images anyway.
_PATH_SAMPLE_ROWS = 20
_GLOB = re.compile(r"[*?\[]")


def is_folder(path: str) -> bool:
    """Whether ``path`` (not a glob) is a folder holding files."""
    if _GLOB.search(path):
        return False
    if files.is_local(path) and os.path.isdir(path):
        return True
    return bool(files.list_files(path.rstrip("/") + "/**", limit=1))



def table_inputs(path: str) -> tuple[tuple[str, int], ...]:
    """The table files (CSV, Parquet, JSON Lines) of a table's ``--input`` (a file or a
    glob), sorted, with sizes.

    Raises:
      ConvertError: for a folder, or when nothing matches.
    """
    if is_folder(path):
        raise ConvertError(f"--input must be a table file or glob (CSV, Parquet or JSON Lines, "
                           f"e.g. '{path.rstrip('/')}/*.csv'), not a folder: {path}")
    found = tuple(table_files(path))
    if not found:
        raise ConvertError(f"--input: no files match {path}")
    return found


def sample_rows(config: ConvertConfig, path: str, header: list[str],
                limit: int, lines: list[int] | None = None) -> list[list[str]]:
    """Up to ``limit`` rows of a CSV file that have as many cells as ``header`` (rows
    longer than ``SAMPLE_ROW_BYTES`` left out, unread: see ``csv_sample_lines``);
    ``lines``, if given, is appended with each row's first line number."""
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # The converter has no cap either.
    with files.open_read(path) as stream:
        # Bytes that do not decode cost their row when converting; here they must not
        # stop the sample.
        text = io.TextIOWrapper(stream, encoding=config.encoding, errors="replace", newline="")
        sampled = csv_sample_lines(text, config.csv_quote, config.csv_delimiter, len(header))
        reader = csv.reader(sampled, delimiter=config.csv_delimiter, quotechar=config.csv_quote)
        if not config.no_header:
            next(reader, None)
        rows, line = [], reader.line_num + 1
        for row in itertools.islice(reader, limit):
            if len(row) == len(header):
                rows.append(row)
                if lines is not None:
                    lines.append(line)
            line = reader.line_num + 1
        return rows


def infer_table_schema(config: ConvertConfig, path: str, header: list[str],
                       limit: int, notes: list[str] | None = None) -> tuple[TableSchema, int]:
    """A schema inferred from the first ``limit`` rows of a table file (from the cell
    text of a CSV, from the column types of a Parquet or JSON Lines file), and the
    number of rows it was inferred from; ``notes``, if given, gets what the sample
    decided beyond the types (see ``plan.table_inference``).

    Raises:
      ValueError: if the file cannot be read.
    """
    if table_format(path) == "csv":
        rows = sample_rows(config, path, header, limit)
        return infer_schema(header, rows, notes), len(rows)
    tables = typed_sample(path, limit)
    return infer_typed_schema(header, tables, notes), sum(t.num_rows for t in tables)


def table_schema(config: ConvertConfig, first: str, header: list[str],
                  notes: list[str] | None = None) -> TableSchema:
    """``--schema``, or a schema inferred from the first rows; checked against the header.

    Raises:
      ConvertError: when the schema file is missing or invalid, or names columns
        the CSV does not have.
    """
    if config.schema:
        if not files.exists(config.schema):
            raise ConvertError(f"--schema: {config.schema} does not exist")
        try:
            schema = load_schema(files.read_text(config.schema), config.schema)
        except ValueError as err:
            raise ConvertError(f"--schema {err}") from None
    else:
        try:
            schema, _ = infer_table_schema(config, first, header, INFER_SAMPLE_ROWS, notes)
        except ValueError as err:
            raise ConvertError(f"--input {err}") from None
    missing = [c.name for c in schema.kept if c.name not in header]
    if missing:
        raise ConvertError(f"--schema names columns {missing} that {first} does not have "
                           f"(its columns: {header})")
    if config.sequence_key:
        shaped = [c.name for c in schema.kept if c.shape is not None]
        if shaped:
            raise ConvertError(f"--sequence_key: shaped columns {shaped} are not supported in "
                               "sequences; give them no 'shape', or convert without --sequence_key")
        if not any(c.sequence for c in schema.kept):
            raise ConvertError("--sequence_key: mark the per-row columns 'sequence: true' in the "
                               "schema; the others become context features")
    for flag, column in (("--split_column", config.split_column), ("--key_column", config.key_column),
                         ("--sequence_key", config.sequence_key),
                         ("--sequence_order", config.sequence_order)):
        if column and column not in header:
            raise ConvertError(f"{flag}: column {column!r} is not in the CSV header {header}")
    return schema


def row_resolver():
    """Where a CSV manifest's image path really is, for ``layouts.rows_outside``: a
    local path absolute with its links followed (its folder's resolved once),
    ``None`` for a scheme no file system of this run reads (that row is
    dead-lettered, not read), any other URI as it is."""
    folders: dict[str, str] = {}

    def resolve(path: str) -> str | None:
        if not files.is_local(path):
            try:
                FileSystems.get_filesystem(path)
            except ValueError:
                return None
            return path
        try:
            folder, name = os.path.split(os.path.abspath(path))
            if folder not in folders:
                folders[folder] = os.path.realpath(folder)
            real = os.path.join(folders[folder], name)
            return os.path.realpath(real) if name and os.path.islink(real) else real
        except (OSError, ValueError):  # A NUL in the name: judged by name.
            return os.path.abspath(path)

    return resolve


def check_manifest_rows(config: ConvertConfig) -> None:
    """Refuses a CSV manifest whose rows name images outside its folder (absolute
    paths, ``..``, links out, other buckets or schemes) that ``--allowed_roots``
    does not cover, before any of them is looked up; ``--allow_paths_outside``
    reads them all.

    Raises:
      ConvertError: naming each root, its rows and the flag to add.
    """
    if config.allow_paths_outside:
        return
    resolve = row_resolver()
    allowed = [resolve(root) or root for root in config.allowed_roots]
    try:
        outside = rows_outside(config.input, files.read_text(config.input), config.image_column,
                               config.label_column, allowed, resolve)
    except (UnicodeDecodeError, ValueError) as err:
        raise ConvertError(f"--input {config.input}: {err}") from None
    if not outside:
        return
    roots = [printable_root(root) for root in outside]
    shown = ", ".join(f"{root} ({rows:,} row{'s' if rows > 1 else ''})"
                      for root, rows in zip(roots[:5], list(outside.values())[:5]))
    more = f" and {len(roots) - 5} more" if len(roots) > 5 else ""
    total = sum(outside.values())
    raise ConvertError(
        f"--input {config.input}: {total:,} row{'s' if total > 1 else ''} of the CSV manifest "
        f"name{'' if total > 1 else 's'} images outside its folder, under {shown}{more}; they are "
        f"read only when allowed: add --allowed_roots {','.join(roots)} (or "
        "--allow_paths_outside to read rows wherever they point)")


def printable_root(root: str) -> str:
    """A root from a CSV cell as printed: control and non-printing characters escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in root)


def refuse_image_paths(config: ConvertConfig, first: str, header: list[str]) -> None:
    """Refuses a CSV detected as a table whose column holds image paths."""
    lines: list[int] = []
    rows = sample_rows(config, first, header, _PATH_SAMPLE_ROWS, lines)
    found = image_path_column(header, rows)
    if found:
        column, cell = found
        at = header.index(column)
        line = next(n for row, n in zip(rows, lines) if row[at] == cell)
        raise ConvertError(
            f"--input {config.input}: column {column!r} holds image paths (e.g. on line {line}) but no "
            f"column is named {', '.join(IMAGE_COLUMNS)}, so the CSV would be read as a table of "
            f"strings; pass --image_column {column} to convert the images it names, or "
            "--layout table to keep it a table")


def check_table_headers(config: ConvertConfig, schema: TableSchema, found, header: list[str]) -> tuple[str, ...]:
    """The columns no file's rows will be written from (in order of first appearance).

    Every file's header is read (a CSV's first record, a Parquet schema, the keys
    of a JSON Lines file's first objects), not only the first file's: a column
    that only later files have would otherwise be dropped unseen, and a later
    file without a schema column would fail the run half way.

    Raises:
      ConvertError: a CSV or Parquet file lacks a column the run needs, or (with
        ``--strict_schema``) a file has a column the schema does not name.
    """
    headers = [(found[0][0], header)]
    if len(found) > 1:
        def read(path):
            try:
                return path, table_header(config.dialect, path)
            except ValueError as err:
                if table_format(path) == "jsonl" and "no columns" in str(err):
                    return path, []  # Empty, or no object early: its lines are read one by one.
                raise ConvertError(f"--input {err}") from None
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(found) - 1)) as pool:
            headers += list(pool.map(read, [path for path, _ in found[1:]]))
    named = {c.name for c in schema.columns}
    needed = [c.name for c in schema.kept] + [c for c in (
        config.split_column, config.key_column, config.sequence_key, config.sequence_order) if c]
    first_seen: dict[str, str] = {}
    for path, names in headers:
        if table_format(path) != "jsonl":  # A JSON object may leave a key out: its cell is empty.
            missing = [name for name in dict.fromkeys(needed) if name not in names]
            if missing:
                raise ConvertError(
                    f"--input {path} has no column {', '.join(map(repr, missing))}, which "
                    f"{'the schema' if config.schema else 'the schema inferred from ' + found[0][0]} "
                    f"needs (its columns: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}); "
                    "give files of one layout, or convert them separately")
        for name in names:
            if name not in named:
                first_seen.setdefault(name, path)
    dropped = tuple(first_seen)
    if dropped and config.strict_schema:
        by_file: dict[str, list[str]] = {}
        for name, path in first_seen.items():
            by_file.setdefault(path, []).append(name)
        listed = "; ".join(f"{path} has columns the schema does not name: {names}"
                           for path, names in list(by_file.items())[:5])
        raise ConvertError(f"--strict_schema: {listed}; add them to the schema (with 'skip: true' "
                           "to drop them on purpose), or run without --strict_schema")
    return dropped
