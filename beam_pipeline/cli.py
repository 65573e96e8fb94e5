"""The command line: ``convert``, ``verify``, ``inspect`` and ``infer-schema``.

``python -m beam_tfrecords convert --input PATH --output DIR [flags] [Beam flags]``:
our flags are parsed here; every other flag is handed to Beam untouched, after
checking that Beam knows it (a misspelt flag fails fast instead of being
silently dropped). Exit status: 0 when the dataset is complete and within the
error budget, 1 when the run failed, 2 for bad flags or inputs (or an output
another run holds), 3 when the drift gate (``--compare_to``) found the data moved
(nothing published), 99 when ``--skip_unchanged``/``--incremental`` found nothing
to do (nothing written), 130 when interrupted (Ctrl-C). Every failure ends in one
line; ``--debug`` (before the command) adds the traceback.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from beam_tfrecords import console, scratch
from beam_tfrecords.inspect import (
    MAX_RECORD_BYTES,
    UnreadableShard,
    contact_sheets,
    describe_record,
    read_manifest,
    sample_records,
)
from beam_tfrecords.pipeline import ConvertError, JobInterrupted, convert, interrupt_job
from beam_tfrecords.preflight import infer_table_schema, resolve_config, table_inputs
from beam_tfrecords.schemas.config import (
    COLOR_MODES,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_PIXELS,
    DRIFT_MAX_CLASS_SHARE_CHANGE,
    DRIFT_MAX_MEAN_SHIFT,
    DRIFT_MAX_MISSING_CHANGE,
    FINGERPRINTS,
    FITS,
    IMAGE_BYTES_MODES,
    IMAGE_FORMATS,
    LAYOUTS,
    SPLIT_BY,
    VALIDATE_MODES,
    ConvertConfig,
    parse_roots,
    parse_size,
    parse_splits,
)
from beam_tfrecords.schemas.inputs import SKIPPED_EXIT_STATUS
from beam_tfrecords.schemas.manifest import MANIFEST_NAME, shown_value
from beam_tfrecords.schemas.report import Status
from beam_tfrecords.schemas.shards import COMPRESSIONS
from beam_tfrecords.schemas.table_schema import dump_schema
from beam_tfrecords.schemas.version import __version__
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.tables import table_header
from beam_tfrecords.verify import verify_dataset

__all__ = ["config_from_args", "convert_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# The run worked but its statistics moved past the drift gate's limits (status
# drift_found): nothing published. Apart from 1 so a scheduler can tell "the data
# changed, look at it" from "the run broke".
EXIT_DRIFT = 3
_PROG = "beam-tfrecords"


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line (no usage block): what to change, and
    where to read more."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        """As argparse, and a flag that takes no value also takes ``=true`` or
        ``=false`` (a Dataflow Flex Template passes every parameter as
        ``--name=value``); the last one given counts."""
        return super().parse_known_args(self._switches_set(args), namespace)

    def _switches_set(self, args):
        """``args`` with every ``--flag=true|false`` of a store-true flag made bare
        (true) or left out (false)."""
        args = list(sys.argv[1:] if args is None else args)
        switches = {s for a in self._actions if isinstance(a, argparse._StoreTrueAction)  # pylint: disable=protected-access
                    for s in a.option_strings}
        last: dict[str, bool] = {}
        for arg in args:
            name, eq, value = arg.partition("=")
            if name in switches:
                if eq and value.lower() not in ("true", "false"):
                    self.error(f"argument {name}: expected true or false, got {value!r}")
                last[name] = not eq or value.lower() == "true"
        kept = [arg for arg in args if arg.partition("=")[0] not in last]
        return kept + [name for name, on in last.items() if on]


def _flag_value(parse):
    """``parse`` for argparse: its ValueError's message (which names the flag and
    an example) becomes the error argparse prints."""

    def parse_flag(text: str):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).split(": ", 1)[-1]) from None

    parse_flag.__name__ = parse.__name__
    return parse_flag


def _positive(text: str) -> int:
    value = int(text) if text.strip().lstrip("-").isdigit() else None
    if value is None or value < 1:
        raise ValueError(f"--per_split: {text!r} is not a whole number of at least 1")
    return value


def _convert_parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Convert images to verified, size-banded TFRecord shards. "
        "Any Beam flag (--runner, --direct_num_workers, --project, ...) is passed to Beam.",
        allow_abbrev=False,
    )
    p.add_argument("--input", required=True,
                   help="folder, glob or CSV manifest (local path or gs://; gs:// on Dataflow)")
    p.add_argument("--output", required=True,
                   help="folder for shards and manifest.json (local path or gs://; gs:// on Dataflow)")
    p.add_argument("--layout", default="auto", choices=LAYOUTS,
                   help="input layout (default: auto-detect)")
    p.add_argument("--labels", default=None,
                   help="file of class names, one per line; line index = label")
    p.add_argument("--compression", default="none", choices=COMPRESSIONS,
                   help="gzip writes .tfrecord.gz (default: none)")
    p.add_argument("--validate", default="structure", choices=VALIDATE_MODES,
                   help="headers: container checks only, no decoding (fastest); structure "
                   "(default): also checks the compressed data (JPEG decoded at 1/8 size, PNG "
                   "inflated, other formats decoded), refusing what a full decode would; "
                   "decode: full decode")
    p.add_argument("--max_pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="refuse images whose header declares more pixels (width x height), "
                   f"before any decode (default {DEFAULT_MAX_PIXELS:,} = 2**27, about 11585 x 11585)")
    p.add_argument("--max_file_bytes", type=int, default=DEFAULT_MAX_FILE_BYTES,
                   help="dead-letter (file_too_large), without reading it, an image file larger "
                   f"than this (default {DEFAULT_MAX_FILE_BYTES:,} = 256 MiB)")
    p.add_argument("--follow_links_outside", action="store_true",
                   help="follow symbolic links inside --input that lead outside it (default: "
                   "passed over, listed in the plan and dead_letter/skipped.jsonl)")
    p.add_argument("--shard_min_mb", type=float, default=100.0, help="shard size floor, MB (default 100)")
    p.add_argument("--shard_max_mb", type=float, default=200.0, help="shard size cap, MB (default 200)")
    p.add_argument("--max_bad_fraction", type=float, default=0.01,
                   help="fail the run when more than this fraction of inputs is bad (default 0.01)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset already in --output (its old shards are removed)")
    p.add_argument("--read_threads", type=int, default=4,
                   help="threads reading and checking images inside each shard writer (default 4)")
    p.add_argument("--encode_processes", type=int, default=-1,
                   help="helper processes per shard writer; -1 (default): all cores on the "
                   "DirectRunner, none on distributed runners")
    p.add_argument("--reread", action="store_true",
                   help="gs:// output: verify every shard by downloading and re-reading it too "
                   "(default: the CRC-32C and size GCS reports for it must equal the writer's); "
                   "local shards are always re-read")
    p.add_argument("--image_bytes", default="readable", choices=IMAGE_BYTES_MODES,
                   help="readable (default): an image tf.io.decode_image cannot read as stored "
                   "(TIFF, WebP, CMYK or 12-bit JPEG, BMP other than 24-bit) is stored as a "
                   "lossless PNG, counted in the manifest; original: every file's own bytes")
    p.add_argument("--list_on_workers", action="store_true",
                   help="gs:// image folders only: list the bucket on the workers, folder by "
                   "folder, and cut the shards there (for millions of objects; see "
                   "docs/scaling.md); the launcher lists folders only. Not with --skip_unchanged, "
                   "--incremental, --drop_duplicates, --split_by content or resizing flags")
    r = p.add_argument_group("resize and re-encode images (default: keep them as they are)")
    r.add_argument("--max_side", type=int, default=0,
                   help="shrink the longest side to N pixels (aspect kept, never enlarged)")
    r.add_argument("--min_side", type=int, default=0,
                   help="shrink the shortest side to N pixels (aspect kept, never enlarged)")
    r.add_argument("--size", type=_flag_value(parse_size), default=(),
                   help="make every image WIDTHxHEIGHT (e.g. 224x224), by --fit")
    r.add_argument("--fit", default="stretch", choices=FITS,
                   help="with --size: stretch (aspect not kept), crop (cover, centre cut) or pad "
                   "(fit, centred on black)")
    r.add_argument("--image_format", default="keep", choices=IMAGE_FORMATS,
                   help="format of changed images: keep (JPEG stays JPEG, PNG stays PNG, others "
                   "become PNG), jpeg or png")
    r.add_argument("--jpeg_quality", type=int, default=90, help="JPEG quality, 1-95 (default 90)")
    r.add_argument("--color_mode", default="keep", choices=COLOR_MODES,
                   help="keep, rgb or l (grey)")
    p.add_argument("--drop_duplicates", action="store_true",
                   help="leave out images whose bytes equal another's (keeping the first by "
                   "ordering key; listed in the manifest); reads every file once more")
    p.add_argument("--fail_on_leakage", action="store_true",
                   help="publish nothing (exit 1) when an image's content sits in more than one "
                   "split; without it such copies are listed in the manifest")
    p.add_argument("--progress", default="auto", choices=console.PROGRESS_MODES,
                   help="auto (default): one line updated in place on a terminal, else a log line "
                   "every --progress_seconds; bar, log, or off")
    p.add_argument("--progress_seconds", type=float, default=30.0,
                   help="seconds between progress log lines (default 30; 0: no progress)")
    p.add_argument("--report_json", default=None,
                   help="also write the run report to this local file")
    p.add_argument("--on_interrupt", default="cancel", choices=("cancel", "keep"),
                   help="on Dataflow, what Ctrl-C or SIGTERM does to the job convert waits for: "
                   "cancel (default): cancel it, and release the output's lock once it ended; keep: "
                   "leave it running, and its lock until it ends")
    u = p.add_argument_group("scheduled runs (see 'Scheduled runs' in the README)")
    u.add_argument("--skip_unchanged", action="store_true",
                   help="when the input files and the options that shape the records match the "
                   f"dataset at --output, do nothing and exit {SKIPPED_EXIT_STATUS}; otherwise "
                   "a full run (which needs --overwrite to replace the dataset)")
    u.add_argument("--incremental", action="store_true",
                   help="convert only inputs the dataset at --output does not hold (new files, "
                   "and changed ones, reported) into a new part OUT/part-NNNNN/, listed in the "
                   f"dataset's manifest; nothing new: exit {SKIPPED_EXIT_STATUS}. A first run "
                   "(no dataset yet) is a full run")
    u.add_argument("--fingerprint", default="stat", choices=FINGERPRINTS,
                   help="how a local file counts as unchanged: stat (default): the same size and "
                   "modification time, or, if the time moved, the same content hash; content: "
                   "the same content hash, every file read")
    u.add_argument("--date", default="",
                   help="YYYY-MM-DD filling {date}, {yyyy}, {mm}, {dd}, {yyyymmdd} in --input "
                   "and --output (default: today, UTC)")
    m = p.add_argument_group("CSV image manifests (default: the usual column names)")
    m.add_argument("--image_column", default=None,
                   help="the column of image paths (default: the first of image, image_uri, "
                   "image_path, path, filename, file, uri)")
    m.add_argument("--label_column", default=None,
                   help="the column of labels (default: the first of label, class, category)")
    m.add_argument("--allowed_roots", type=_flag_value(parse_roots), default=(),
                   help="folders or buckets outside the CSV's folder whose images the rows may "
                   "name, comma-separated (gs://photos,/data/imgs); rows naming others refuse the run")
    m.add_argument("--allow_paths_outside", action="store_true",
                   help="read the images the rows name wherever they are (default: only inside "
                   "the CSV's folder and --allowed_roots)")
    _add_table_flags(p)
    t = p.add_argument_group("tables (--layout table, or a CSV without an image column)")
    t.add_argument("--schema", default=None,
                   help="YAML or JSON table schema (default: inferred from the first rows)")
    t.add_argument("--strict_schema", action="store_true",
                   help="refuse a CSV with columns that --schema does not name (default: they "
                   "are dropped and listed; name them with 'skip: true' to drop them on purpose)")
    t.add_argument("--split_column", default=None, help="column naming each row's split")
    t.add_argument("--splits", default=None, type=_flag_value(parse_splits),
                   help="hash splits by ratio, e.g. train=0.8,validation=0.1,test=0.1 (tables, "
                   "and images without split folders or a split column)")
    t.add_argument("--split_by", default="path", choices=SPLIT_BY,
                   help="images with --splits: hash the path relative to --input (default), or "
                   "the file's content (copies of an image land in one split; reads every "
                   "file once more)")
    t.add_argument("--key_column", default=None,
                   help="with --splits: the column hashed to pick a row's split (default: the row)")
    t.add_argument("--sequence_key", default=None,
                   help="group the rows of each key into one SequenceExample")
    t.add_argument("--sequence_order", default=None,
                   help="with --sequence_key: the column that orders rows within a sequence")
    g = p.add_argument_group("drift gate (see 'Statistics and drift gate' in the README)")
    g.add_argument("--compare_to", default=None,
                   help="compare the run's statistics with this dataset's (a manifest.json, a "
                   "dataset folder, local or gs://, or 'previous': the one at --output, if any) "
                   f"and publish nothing (exit {EXIT_DRIFT}) when they moved past the limits")
    g.add_argument("--drift_max_mean_shift", type=float, default=DRIFT_MAX_MEAN_SHIFT,
                   help="standard deviations (of the old values) a numeric feature's mean may "
                   f"move (default {DRIFT_MAX_MEAN_SHIFT:g})")
    g.add_argument("--drift_max_missing_change", type=float, default=DRIFT_MAX_MISSING_CHANGE,
                   help="how much a feature's missing rate, or a numeric feature's share of "
                   "NaN and infinite values, may change, absolute (default "
                   f"{DRIFT_MAX_MISSING_CHANGE:g})")
    g.add_argument("--drift_max_class_share_change", type=float,
                   default=DRIFT_MAX_CLASS_SHARE_CHANGE,
                   help="how much an image class's share of the records, or a string feature's "
                   f"top value's share, may change, absolute (default {DRIFT_MAX_CLASS_SHARE_CHANGE:g})")
    return p


def _add_table_flags(p: argparse.ArgumentParser) -> None:
    """The CSV dialect flags, shared by ``convert`` and ``infer-schema``."""
    d = p.add_argument_group("CSV dialect (not for Parquet or JSON Lines)")
    d.add_argument("--csv_delimiter", default=",", help="cell delimiter (default ','; '\\t' for TSV)")
    d.add_argument("--csv_quote", default='"', help="quote character (default '\"')")
    d.add_argument("--no_header", action="store_true", help="the files have no header row")
    d.add_argument("--columns", default=None,
                   help="with --no_header: column names in file order, comma-separated")
    d.add_argument("--encoding", default="utf-8", help="text encoding (default utf-8)")
    d.add_argument("--no_quoted_newlines", action="store_true",
                   help="a row whose quoted cell holds a newline is dead-lettered (for data known "
                   "to have none, so that rows a stray quote pair merges are not written)")


def _dialect(args: argparse.Namespace) -> dict:
    delimiter = "\t" if args.csv_delimiter in ("\\t", "tab") else args.csv_delimiter
    columns = tuple(c.strip() for c in args.columns.split(",")) if args.columns else ()
    return dict(csv_delimiter=delimiter, csv_quote=args.csv_quote, no_header=args.no_header,
                columns=columns, encoding=args.encoding,
                quoted_newlines=not args.no_quoted_newlines)


def config_from_args(args: argparse.Namespace) -> ConvertConfig:
    """The ``ConvertConfig`` that parsed ``convert`` flags describe.

    Raises:
      ValueError: naming the flag to change.
    """
    return ConvertConfig(
        input=args.input, output=args.output, layout=args.layout, labels=args.labels,
        compression=args.compression, validate=args.validate, max_pixels=args.max_pixels,
        image_bytes=args.image_bytes,
        shard_min_mb=args.shard_min_mb, shard_max_mb=args.shard_max_mb,
        max_bad_fraction=args.max_bad_fraction, overwrite=args.overwrite,
        read_threads=args.read_threads, encode_processes=args.encode_processes,
        schema=args.schema, strict_schema=args.strict_schema, split_column=args.split_column, splits=args.splits or (),
        key_column=args.key_column, split_by=args.split_by, sequence_key=args.sequence_key,
        drop_duplicates=args.drop_duplicates, fail_on_leakage=args.fail_on_leakage,
        max_side=args.max_side, min_side=args.min_side, size=tuple(args.size), fit=args.fit,
        image_format=args.image_format, jpeg_quality=args.jpeg_quality, color_mode=args.color_mode,
        sequence_order=args.sequence_order, image_column=args.image_column,
        label_column=args.label_column, allowed_roots=tuple(args.allowed_roots),
        allow_paths_outside=args.allow_paths_outside, skip_unchanged=args.skip_unchanged,
        incremental=args.incremental, fingerprint=args.fingerprint, date=args.date,
        list_on_workers=args.list_on_workers,
        follow_links_outside=args.follow_links_outside, max_file_bytes=args.max_file_bytes,
        reread=args.reread,
        compare_to=args.compare_to, drift_max_mean_shift=args.drift_max_mean_shift,
        drift_max_missing_change=args.drift_max_missing_change,
        drift_max_class_share_change=args.drift_max_class_share_change,
        **_dialect(args),
    )


def convert_parser(prog: str = "beam-tfrecords convert") -> argparse.ArgumentParser:
    """The ``convert`` flags (without Beam's), for entry points other than the CLI."""
    return _convert_parser(prog)


def _stray_arguments(beam_args: Sequence[str]) -> list[str]:
    """Words left over that no flag takes: a value follows a ``--flag`` without ``=``;
    anything else (``--input a.csv b.csv``, a shell-expanded glob) is a mistake."""
    stray = []
    for number, arg in enumerate(beam_args):
        before = beam_args[number - 1] if number else ""
        if not arg.startswith("-") and not (before.startswith("-") and "=" not in before):
            stray.append(arg)
    return stray


def _unknown_beam_flags(beam_args: Sequence[str], ours: Sequence[str]) -> list[str]:
    """Flags that neither we (``ours``) nor any Beam options class know, with suggestions."""
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # pylint: disable=protected-access
    _, unknown = parser.parse_known_args(list(beam_args))
    known = [*ours, *(a for action in parser._actions for a in action.option_strings)]  # pylint: disable=protected-access
    messages = []
    for arg in unknown:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        hint = difflib.get_close_matches(name, known, n=1)
        messages.append(f"{name}" + (f" (did you mean {hint[0]}?)" if hint else ""))
    return messages


def _print_plan(plan) -> None:
    print("\n".join(plan.describe()), flush=True)


def _writable(path: str) -> bool:
    """Whether a local file can be written at ``path`` (checked before a run)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return False
    if os.path.exists(path):
        return os.access(path, os.W_OK)
    return os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)


def _interrupted(prog: str, keep_job: bool = False):
    def handler(signum, frame):  # pylint: disable=unused-argument
        console.clear_line()
        sys.stdout.flush()
        job = interrupt_job(keep_job, signum)  # A Dataflow job this run submitted.
        print(f"{prog}: {job.line if job else _INTERRUPTED}", file=sys.stderr, flush=True)
        if job is not None and not job.exit_now:
            return  # Still submitting: convert handles the job once it exists.
        scratch.cleanup()
        os._exit(EXIT_INTERRUPTED)  # pylint: disable=protected-access
    return handler


def _terminated_by(prog: str, keep_job: bool = False):
    def handler(signum, frame):  # pylint: disable=unused-argument
        """SIGTERM: the run's temporary folder goes, then the process ends by the signal,
        as it would without this handler (nothing published; the next run cleans up);
        first, a Dataflow job this run submitted is handled as on Ctrl-C."""
        console.clear_line()
        job = interrupt_job(keep_job, signum)
        if job is not None:
            print(f"{prog}: {job.line}", file=sys.stderr, flush=True)
            if not job.exit_now:
                return
        _die_by_sigterm()
    return handler


def _die_by_sigterm() -> None:
    scratch.cleanup()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


_INTERRUPTED = ("interrupted; nothing was published (a rerun cleans up what this run "
                "left in OUT/.beam-tfrecords)")


def _run_convert(argv: Sequence[str], prog: str) -> int:
    parser = _convert_parser(prog)
    args, beam_args = parser.parse_known_args(argv)
    ours = [a for action in parser._actions for a in action.option_strings]  # pylint: disable=protected-access
    stray = _stray_arguments(beam_args)
    if stray:
        print(f"{prog}: error: unexpected arguments: {' '.join(stray[:3])}"
              f"{' ...' if len(stray) > 3 else ''} (a glob the shell expanded? quote it: "
              "--input 'data/*.csv')", file=sys.stderr)
        return EXIT_USAGE
    unknown = _unknown_beam_flags(beam_args, ours)
    if unknown:
        print(f"{prog}: error: unknown flags: {', '.join(unknown)}", file=sys.stderr)
        return EXIT_USAGE
    if args.report_json and not _writable(args.report_json):
        print(f"{prog}: error: --report_json: cannot write {args.report_json} (its folder is "
              "missing or not writable); choose another path", file=sys.stderr)
        return EXIT_USAGE
    try:
        reporter = console.Reporter(args.progress, args.progress_seconds,
                                    console.runs_in_process(beam_args))
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    # Ctrl-C: Beam turns it into an error inside whatever step is running (with a
    # logged traceback); stop at once instead. Nothing is published before the commit,
    # and the next run removes this run's temporaries and takes over its lock.
    # On Dataflow the job it submitted is cancelled or kept first (pipeline.interrupt_job).
    in_main_thread = threading.current_thread() is threading.main_thread()
    keep_job = args.on_interrupt == "keep"
    previous = signal.signal(signal.SIGINT, _interrupted(prog, keep_job)) if in_main_thread else None
    previous_term = signal.signal(signal.SIGTERM, _terminated_by(prog, keep_job)) if in_main_thread else None
    try:
        beam_args = scratch.keep_requirements_cache(beam_args)
        with scratch.RunScratch():  # Beam's temporary folders, and ours, go with the run.
            result = convert(config_from_args(args), beam_args, on_plan=reporter.on_plan(_print_plan))
    except (ConvertError, ValueError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except JobInterrupted as err:  # While submitting to Dataflow: the job is now handled.
        print(f"{prog}: {err}", file=sys.stderr, flush=True)
        if err.signum == signal.SIGTERM:
            _die_by_sigterm()
        return EXIT_INTERRUPTED
    finally:
        reporter.stop()
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGTERM, previous_term)
    if result.report.status == Status.SKIPPED:
        print(f"SKIPPED: {result.report.reason}; nothing was written "
              f"(exit {SKIPPED_EXIT_STATUS})")
        if args.report_json:
            with open(args.report_json, "w", encoding="utf-8") as f:
                json.dump(result.report.to_dict(), f, indent=2)
        return SKIPPED_EXIT_STATUS
    if result.report.status == Status.DRY_RUN:
        print(f"dry run: the job was built and checked, not run; nothing was written to "
              f"{result.report.output}")
        return EXIT_OK
    console.print_summary(result.report, reporter.elapsed, EXIT_DRIFT)
    if args.report_json:
        with open(args.report_json, "w", encoding="utf-8") as f:
            json.dump(result.report.to_dict(), f, indent=2)
    if result.report.status == Status.DRIFT_FOUND:
        return EXIT_DRIFT
    return EXIT_OK if result.ok else EXIT_FAILED


def _run_verify(argv: Sequence[str], prog: str) -> int:
    p = _Parser(prog=prog, description="Re-check a dataset against its manifest "
                                "(a folder without one fails), or CRC-scan TFRecord files.")
    p.add_argument("location", help="dataset folder, or a glob/file of TFRecords")
    p.add_argument("--full", action="store_true",
                   help="on gs://, also download and re-read every shard (default: compare the "
                   "crc32c and size GCS keeps for each object with the manifest)")
    p.add_argument("--scan_only", action="store_true",
                   help="for a folder without manifest.json: CRC-scan its TFRecord files "
                   "instead of failing it")
    args = p.parse_args(argv)
    try:
        report = verify_dataset(args.location, full=args.full, scan_only=args.scan_only)
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(report.lines()))
    return EXIT_OK if report.ok else EXIT_FAILED


def _run_inspect(argv: Sequence[str], prog: str) -> int:
    p = _Parser(prog=prog, description="Summarise a dataset, show records, "
                                "and draw a contact sheet of its images.")
    p.add_argument("location", help="dataset folder (with manifest.json)")
    p.add_argument("--records", type=int, default=1, help="records to print per split (default 1)")
    p.add_argument("--contact_sheet", default=None,
                   help="draw one PNG contact sheet per split, named after this path "
                   "(sheet.png -> sheet-train.png, sheet-test.png, ...)")
    p.add_argument("--per_split", type=_flag_value(_positive), default=16,
                   help="images per split on a sheet (default 16)")
    p.add_argument("--max_record_mb", type=_flag_value(_positive), default=MAX_RECORD_BYTES >> 20,
                   help="the largest record to read, MiB (default "
                   f"{MAX_RECORD_BYTES >> 20}); a record claiming more fails before it is read")
    args = p.parse_args(argv)
    manifest_path = files.join(args.location, MANIFEST_NAME)
    if not files.exists(manifest_path):
        what = (f"{args.location} does not exist" if not files.exists(args.location) and not
                files.list_files(files.join(args.location, "**"), limit=1)
                else f"{manifest_path} does not exist: not a finished dataset (verify --scan_only "
                "CRC-scans its TFRecord files)")
        print(f"{prog}: error: {what}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        _, manifest = read_manifest(args.location)
    except ValueError as err:  # The manifest is malformed or names a path outside its folder.
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"dataset: {args.location} (created {shown_value(manifest['created']).strip(chr(34))})")
    for split, info in manifest["splits"].items():
        print(f"  {split}: {info['records']} records in {info['num_shards']} shards, "
              f"{info['bytes'] / 1e6:.1f} MB" + (" (the first run's)" if manifest.get("parts") else ""))
    if manifest.get("parts"):
        whole = manifest.get("dataset", {})
        print(f"  with {len(manifest['parts'])} incremental parts: " + ", ".join(
            f"{split} {info['records']} records in {info['num_shards']} shards"
            for split, info in whole.get("splits", {}).items()) + " in all")
    print(f"  classes: {len(manifest['labels']['vocabulary'])}; "
          f"bad inputs: {manifest['bad_records']['total']}")
    try:
        samples = sample_records(args.location, max(args.records, args.per_split),
                                 args.max_record_mb << 20)
    except UnreadableShard as err:  # The data is damaged, as verify would fail it.
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as err:  # A shard's path leads outside (a link), or the manifest changed.
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    shown: dict[str, int] = {}
    for split, features in samples:
        if shown.get(split, 0) < args.records:
            print(f"  first record of {split}:" if not shown.get(split) else f"  record of {split}:")
            print(describe_record(features))
            shown[split] = shown.get(split, 0) + 1
    if args.contact_sheet:
        counts: dict[str, int] = {}
        chosen = []
        for split, features in samples:
            if counts.get(split, 0) < args.per_split:
                chosen.append((split, features))
                counts[split] = counts.get(split, 0) + 1
        try:
            made = contact_sheets(chosen, args.contact_sheet)
        except ValueError as err:
            print(f"{prog}: error: {err}", file=sys.stderr)
            return EXIT_USAGE
        for split, path, drawn in made:
            print(f"contact sheet of {split}: {path} ({drawn} images)")
    return EXIT_OK


def _run_infer_schema(argv: Sequence[str], prog: str) -> int:
    p = _Parser(prog=prog, description="Infer a table schema from the first rows of a "
                "CSV (cell text: numbers, bools, number lists like 3;17;42) or of a Parquet or "
                "JSON Lines file (its column types); convert --schema accepts it unchanged.")
    p.add_argument("--input", required=True, help="CSV, Parquet (.parquet) or JSON Lines "
                   "(.jsonl, .ndjson, .gz) file or glob (the first file is sampled)")
    p.add_argument("--sample_rows", type=int, default=10_000, help="rows to read (default 10000)")
    p.add_argument("--output", default=None, help="write the schema here (default: stdout)")
    _add_table_flags(p)
    args = p.parse_args(argv)
    try:
        config = ConvertConfig(input=args.input, output="-", layout="table", **_dialect(args))
        config = resolve_config(config, PipelineOptions([]))
        found = table_inputs(config.input)
        header = table_header(config.dialect, found[0][0])
        notes: list[str] = []
        schema, rows = infer_table_schema(config, found[0][0], header, args.sample_rows, notes)
        # What the sample decided beyond the types, as comments the schema keeps.
        text = "".join(f"# note: {note}\n" for note in notes) + dump_schema(schema)
    except (ConvertError, ValueError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.output:
        files.write_bytes(args.output, text.encode("utf-8"))
        print(f"schema of {len(header)} columns from {rows} rows: {args.output}")
        for note in notes:
            print(f"note: {note}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


_COMMANDS = {
    "convert": (_run_convert, "images or CSV tables to verified, size-banded TFRecord shards"),
    "verify": (_run_verify, "re-check a dataset against its manifest, shard by shard"),
    "inspect": (_run_inspect, "summarize a dataset, print records, draw a contact sheet"),
    "infer-schema": (_run_infer_schema, "write a table schema inferred from a table's first rows"),
}


class _OneLineFormatter(logging.Formatter):
    """Log records as one line each: no tracebacks (Beam logs one for every failed
    step, and its retries log the credential lookup's); ``--debug`` shows them."""

    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)
        message = record.getMessage()
        first = message.strip().splitlines()[0] if message.strip() else ""
        record.msg, record.args = first + (" [...]" if first != message.strip() else ""), None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return console.printable(super().format(record))


def _usage() -> str:
    lines = [f"usage: {_PROG} [--debug] COMMAND [flags]   ({_PROG} COMMAND --help for its flags)",
             "", "commands:"]
    lines += [f"  {name:<13} {summary}" for name, (_, summary) in _COMMANDS.items()]
    lines += ["", "  --version     print the version", "  --debug       show tracebacks of errors"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m beam_tfrecords`` and the ``beam-tfrecords`` script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv[:1]
    argv = argv[1:] if debug else argv
    if argv[:1] in (["--help"], ["-h"]):
        print(_usage())
        return EXIT_OK
    if argv[:1] == ["--version"]:
        print(f"{_PROG} {__version__}")
        return EXIT_OK
    if not argv or argv[0] not in _COMMANDS:
        hint = difflib.get_close_matches(argv[0], list(_COMMANDS), n=1) if argv else []
        what = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(f"{_PROG}: error: {what}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
              + f"; commands: {', '.join(_COMMANDS)} ({_PROG} --help)", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        fmt = handler.formatter._fmt if handler.formatter else None  # pylint: disable=protected-access
        handler.setFormatter(console.EscapingFormatter(fmt) if debug else _OneLineFormatter(fmt))
    console.quiet_logs()
    for noisy in ("apache_beam", "google", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    prog = f"{_PROG} {argv[0]}"
    streams = sys.stdout, sys.stderr  # Names and values are printed escaped (console.printable).
    sys.stdout, sys.stderr = console.EscapingStream(sys.stdout), console.EscapingStream(sys.stderr)
    try:
        return _COMMANDS[argv[0]][0](argv[1:], prog)
    except SystemExit as exit_:  # argparse: --help, or a bad flag.
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: {_INTERRUPTED}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # pylint: disable=broad-except
        if debug:  # The traceback, escaped like everything else printed (exit 1, as uncaught).
            traceback.print_exc(file=sys.stderr)
            return EXIT_FAILED
        print(f"{prog}: error: {type(err).__name__}: {err} (run with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_FAILED
    finally:
        sys.stdout, sys.stderr = streams
