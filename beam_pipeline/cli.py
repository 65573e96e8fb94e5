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
import gc
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
from beam_tfrecords.pipeline import ConvertError, JobInterrupted, convert, interrupt_job, record_interruption
from beam_tfrecords.preflight import infer_table_schema, resolve_config, table_inputs
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.features import canonical_features
from beam_tfrecords.schemas.inputs import SKIPPED_EXIT_STATUS
from beam_tfrecords.schemas.manifest import MANIFEST_NAME, shown_value
from beam_tfrecords.schemas.options import (
    CONVERT_OPTIONS,
    DRIFT_EXIT_STATUS,
    GROUP_TITLES,
    Option,
    option_values,
)
from beam_tfrecords.schemas.report import Status
from beam_tfrecords.schemas.table_schema import dump_schema
from beam_tfrecords.schemas.version import __version__
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.quality.drift import drift_manifest_path
from beam_tfrecords.transforms.tables import table_header

# ``verify`` and ``inspect`` (and the dataset card) are imported by their commands:
# a conversion does not load the card's charts and drawing code.

__all__ = ["config_from_args", "convert_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# The run worked but its statistics moved past the drift gate's limits (status
# drift_found): nothing published. Apart from 1 so a scheduler can tell "the data
# changed, look at it" from "the run broke".
EXIT_DRIFT = DRIFT_EXIT_STATUS
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


def _convert_parser(prog: str, options: Sequence[Option] = CONVERT_OPTIONS) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Convert images to verified, size-banded TFRecord shards. "
        "Any Beam flag (--runner, --direct_num_workers, --project, ...) is passed to Beam.",
        allow_abbrev=False,
    )
    _add_options(p, options)
    return p


def _add_options(p: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """One flag per declared option (``schemas.options``), in its ``--help`` section."""
    groups: dict[str, argparse._ArgumentGroup] = {}  # pylint: disable=protected-access
    for option in options:
        title = GROUP_TITLES[option.group]
        if title is not None and title not in groups:
            groups[title] = p.add_argument_group(title)
        where = groups[title] if title is not None else p
        kwargs: dict = {"help": option.help}
        if option.switch:
            kwargs["action"] = "store_true"
        elif option.required:
            kwargs["required"] = True
        else:
            kwargs["default"] = option.default
        if option.parse is not None:
            kwargs["type"] = option.parse if option.parse in (int, float) else _flag_value(option.parse)
        if option.choices:
            kwargs["choices"] = option.choices
        where.add_argument(option.flag, **kwargs)


_DIALECT = tuple(o for o in CONVERT_OPTIONS if o.group == "dialect")


def _add_table_flags(p: argparse.ArgumentParser) -> None:
    """The CSV dialect flags, shared by ``convert`` and ``infer-schema``."""
    _add_options(p, _DIALECT)


def config_from_args(args: argparse.Namespace) -> ConvertConfig:
    """The ``ConvertConfig`` that parsed ``convert`` flags describe.

    Raises:
      ValueError: naming the flag to change.
    """
    return ConvertConfig(**option_values(vars(args)))


def convert_parser(prog: str = "beam-tfrecords convert",
                   options: Sequence[Option] = CONVERT_OPTIONS) -> argparse.ArgumentParser:
    """The ``convert`` flags (without Beam's), for entry points other than the CLI: one
    per option of ``options`` (default: every declared one, ``schemas.options``)."""
    return _convert_parser(prog, options)


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
    told = []  # Ctrl-C after the run published its dataset: the first one is told so.

    def handler(signum, frame):  # pylint: disable=unused-argument
        console.clear_line()
        sys.stdout.flush()
        job = interrupt_job(keep_job, signum)  # A Dataflow job this run submitted.
        # Else its run_report.json: failed, interrupted (unless it published).
        published = record_interruption(signum) if job is None else ""
        if published and not told:  # Only its cleanup and summary are left: they run.
            told.append(signum)
            print(f"{prog}: interrupted after the run published its dataset at {published}; "
                  "finishing its cleanup (Ctrl-C again to stop now)", file=sys.stderr, flush=True)
            return
        if published:
            print(f"{prog}: stopped after the run published its dataset at {published} (its "
                  "manifest.json; the next run removes what this one left in OUT/.beam-tfrecords)",
                  file=sys.stderr, flush=True)
        else:
            print(f"{prog}: {job.line if job else _INTERRUPTED}", file=sys.stderr, flush=True)
        if job is not None and not job.exit_now:
            return  # Still submitting: convert handles the job once it exists.
        scratch.cleanup()
        os._exit(EXIT_OK if published else EXIT_INTERRUPTED)  # pylint: disable=protected-access
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
        else:
            record_interruption(signum)  # Its run_report.json: failed, interrupted.
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
    result = None
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
            signal.signal(signal.SIGTERM, previous_term)
            if result is None:
                signal.signal(signal.SIGINT, previous)
    try:  # Ctrl-C while the summary is printed: the handler knows whether it published.
        return _summarized(result, args, reporter)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)


def _summarized(result, args: argparse.Namespace, reporter: console.Reporter) -> int:
    """The end of ``convert``: the summary (or the skip, the dry run), the
    ``--report_json`` file, the exit status."""
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
    from beam_tfrecords.verify import verify_dataset  # pylint: disable=import-outside-toplevel

    try:
        report = verify_dataset(args.location, full=args.full, scan_only=args.scan_only)
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(report.lines()))
    return EXIT_OK if report.ok else EXIT_FAILED


def _inspect_parser(prog: str, max_record_bytes: int) -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Summarise a dataset, show records, "
                                "and draw a contact sheet of its images.")
    p.add_argument("location", help="dataset folder (with manifest.json)")
    p.add_argument("--records", type=int, default=1, help="records to print per split (default 1)")
    p.add_argument("--contact_sheet", default=None,
                   help="draw one PNG contact sheet per split, named after this path "
                   "(sheet.png -> sheet-train.png, sheet-test.png, ...)")
    p.add_argument("--per_split", type=_flag_value(_positive), default=16,
                   help="images per split on a sheet (default 16)")
    p.add_argument("--max_record_mb", type=_flag_value(_positive), default=max_record_bytes >> 20,
                   help="the largest record to read, MiB (default "
                   f"{max_record_bytes >> 20}); a record claiming more fails before it is read")
    p.add_argument("--html", default=None, help="write the dataset card, one self-contained HTML "
                   "page, to this file (outside the dataset folder; replaces only a card)")
    p.add_argument("--compare_to", default=None, help="with --html: show drift against this "
                   "dataset (a folder or its manifest.json)")
    return p


def _run_inspect(argv: Sequence[str], prog: str) -> int:
    # pylint: disable-next=import-outside-toplevel
    from beam_tfrecords.inspect import (
        MAX_RECORD_BYTES,
        UnreadableShard,
        contact_sheets,
        describe_record,
        read_manifest,
        sample_records,
    )

    p = _inspect_parser(prog, MAX_RECORD_BYTES)
    args = p.parse_args(argv)
    if _card_refused(p, args, prog):
        return EXIT_USAGE
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
    if manifest.get("feature_names"):
        print("  feature names (--feature_names): " + ", ".join(
            f"{console.printable(c, keep='')} -> {console.printable(o, keep='')}"  # As convert shows them.
            for c, o in manifest["feature_names"].items()))
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
                # Renamed features (--feature_names) drawn by their roles.
                chosen.append((split, canonical_features(manifest.get("feature_names"), features)))
                counts[split] = counts.get(split, 0) + 1
        try:
            made = contact_sheets(chosen, args.contact_sheet)
        except ValueError as err:
            print(f"{prog}: error: {err}", file=sys.stderr)
            return EXIT_USAGE
        for split, path, drawn in made:
            print(f"contact sheet of {split}: {path} ({drawn} images)")
    return _write_card(args, prog) if args.html else EXIT_OK


def _card_refused(p: argparse.ArgumentParser, args: argparse.Namespace, prog: str) -> bool:
    """Whether ``--html`` names a file the card may not go to, or ``--compare_to``
    no dataset (one line said), before anything is read."""
    if args.html is not None and not args.html.strip():  # An unset shell variable.
        p.error("--html is empty: name the card's file (--html card.html)")
    if args.compare_to and args.html is None:
        p.error("--compare_to needs --html (the card shows the drift)")
    from beam_tfrecords.dataset_card import card_refusal  # pylint: disable=import-outside-toplevel

    why = card_refusal(args.html, args.location) if args.html else ""
    compared = drift_manifest_path(args.compare_to, args.location) if args.compare_to else ""
    if not why and compared and not files.exists(compared):
        why = f"--compare_to: {compared} does not exist"
    if why:
        print(f"{prog}: error: {why}", file=sys.stderr)
    return bool(why)


def _write_card(args: argparse.Namespace, prog: str) -> int:
    """``inspect --html``: the dataset card (exit 2 when ``--compare_to`` cannot be
    read, 1 when a shard cannot be read)."""
    # pylint: disable-next=import-outside-toplevel
    from beam_tfrecords.dataset_card import gather_facts, write_card
    from beam_tfrecords.inspect import UnreadableShard  # pylint: disable=import-outside-toplevel

    try:
        facts = gather_facts(args.location, compare_to=args.compare_to,
                             per_split=args.per_split, max_record=args.max_record_mb << 20)
    except UnreadableShard as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    size = write_card(facts, args.html)
    drift = f"; drift {facts.drift['status']}" if facts.drift else ""
    print(f"dataset card: {args.html} ({size / 1e3:.0f} KB{drift})")
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
        config = ConvertConfig(input=args.input, output="-", layout="table", **option_values(vars(args), _DIALECT))
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
    """Entry point of ``python -m beam_tfrecords`` and the ``beam-tfrecords`` script (both through
    ``__main__.run``)."""
    whole_process = argv is None  # The command line's: the process ends when it returns.
    if whole_process:
        # What is alive now is what the imports made (Beam's and ours, ~1M objects,
        # module state that lives as long as the process): out of the collector's
        # sight, its passes during the run and at exit skip them (~0.45 s of CPU of a
        # 9-image run, most of it at exit).
        gc.freeze()
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
        code = _COMMANDS[argv[0]][0](argv[1:], prog)
    except SystemExit as exit_:  # argparse: --help, or a bad flag.
        code = int(exit_.code or 0) if not isinstance(exit_.code, str) else EXIT_USAGE
    except KeyboardInterrupt:  # A convert that published has ended but for its summary.
        published = record_interruption(signal.SIGINT) if argv[0] == "convert" else ""
        print(f"{prog}: " + (f"stopped after the run published its dataset at {published}" if published
                             else _INTERRUPTED), file=sys.stderr)
        code = EXIT_OK if published else EXIT_INTERRUPTED
    except Exception as err:  # pylint: disable=broad-except
        code = EXIT_FAILED
        if debug:  # The traceback, escaped like everything else printed (exit 1, as uncaught).
            traceback.print_exc(file=sys.stderr)
        else:
            print(f"{prog}: error: {type(err).__name__}: {err} (run with --debug for the traceback)",
                  file=sys.stderr)
    finally:
        sys.stdout, sys.stderr = streams
    if whole_process and threading.current_thread() is threading.main_thread():
        # The command ended with its status: a Ctrl-C while the interpreter shuts down
        # (joining Beam's and the encoders' threads and processes) has nothing left to
        # stop. Ignored (Python resets a handler of its own to the default, which would
        # end the process by the signal, exit 130, with no line).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code
