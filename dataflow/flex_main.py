"""Dataflow Flex Template entry point (``FLEX_TEMPLATE_PYTHON_PY_FILE``).

Builds the conversion exactly as ``beam-tfrecords convert`` does, from the same
flags, and submits it without waiting: a template launcher only submits. The
launcher passes every parameter as ``--name=value``; a flag without a value takes
``=true`` or ``=false``. The run's outcome is ``OUTPUT/run_report.json``, and
``OUTPUT/manifest.json`` when it succeeded (see docs/running_on_dataflow.md).

Exit status, as ``convert``'s: 0 submitted (or, with ``--dry_run=True``, built),
2 bad flags or inputs (one line saying what to change; nothing submitted), 99 a
scheduled run found nothing to do (nothing submitted).
"""

from __future__ import annotations

import logging
import sys

from apache_beam.options.pipeline_options import PipelineOptions, TestOptions

from beam_tfrecords.cli import config_from_args, convert_parser
from beam_tfrecords.pipeline import ConvertError, submit
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.inputs import SKIPPED_EXIT_STATUS
from beam_tfrecords.transforms.io import progress

__all__ = ["TEMPLATE_REFUSES", "main", "parse", "run"]

_PROG = "flex_main"
EXIT_OK, EXIT_USAGE = 0, 2

# ``convert`` flags a template cannot use, and why (make_metadata.py leaves them out
# of metadata.json).
TEMPLATE_REFUSES = {
    "report_json": "a file on the launcher, which only submits the job and does not wait "
                   "for its report: the run's report is OUTPUT/run_report.json",
    "on_interrupt": "what `convert` does with the job it waits on when interrupted; the "
                    "launcher only submits the job (cancel it with gcloud dataflow jobs cancel)",
}


def parse(argv: list[str]) -> tuple[ConvertConfig, list[str]]:
    """The conversion the launcher's flags describe, and the flags left for Beam;
    sets the progress interval, which the job carries to its workers (as
    ``convert`` does).

    Raises:
      ValueError: naming the flag to change.
    """
    parser = convert_parser(_PROG)
    args, beam_args = parser.parse_known_args(argv)
    for name, why in TEMPLATE_REFUSES.items():
        if getattr(args, name) != parser.get_default(name):
            raise ConvertError(f"--{name} cannot be used in a Flex Template: {why}")
    if args.progress_seconds < 0:
        raise ConvertError(f"--progress_seconds must be 0 (no progress) or more; got "
                           f"{args.progress_seconds:g}")
    config = config_from_args(args)
    progress.set_interval(0 if args.progress == "off" else args.progress_seconds)
    return config, beam_args


def run(argv: list[str]):
    """Parses the flags and submits the job; returns Beam's ``PipelineResult``
    (``None`` when a scheduled run found nothing to do)."""
    config, beam_args = parse(argv)
    return submit(config, beam_args)


def main(argv: list[str]) -> int:
    """``run``, ending in one line and ``convert``'s exit status when nothing is submitted."""
    try:
        config, beam_args = parse(argv)
        result = submit(config, beam_args)
    except ValueError as err:  # ConvertError among them: nothing was submitted.
        print(f"{_PROG}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if result is None and not PipelineOptions(beam_args).view_as(TestOptions).dry_run:
        print("SKIPPED: --skip_unchanged or --incremental found nothing to do; nothing was "
              f"submitted (exit {SKIPPED_EXIT_STATUS})")
        return SKIPPED_EXIT_STATUS
    return EXIT_OK


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main(sys.argv[1:]))
