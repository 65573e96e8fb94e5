"""Dataflow Flex Template entry point (``FLEX_TEMPLATE_PYTHON_PY_FILE``).

Builds the conversion exactly as ``beam-tfrecords convert`` does, from the same
flags, and submits it without waiting: a template launcher only submits. The
run's outcome is ``OUTPUT/run_report.json``, and ``OUTPUT/manifest.json`` when it
succeeded (see docs/running_on_dataflow.md).
"""

import logging
import sys

from beam_tfrecords.cli import config_from_args, convert_parser
from beam_tfrecords.pipeline import submit


def run(argv):
    """Parses ``convert`` flags (the rest go to Beam) and submits the job."""
    args, beam_args = convert_parser("flex_main").parse_known_args(argv)
    return submit(config_from_args(args), beam_args)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    run(sys.argv[1:])
