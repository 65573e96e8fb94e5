"""``python -m beam_tfrecords convert|verify|inspect ...`` and the ``beam-tfrecords`` script."""

import gc
import sys


def run() -> int:
    """``cli.main``, imported with the collector off.

    Importing Beam and this package makes ~1M objects and no garbage: the
    collector's passes over them while they load cost ~0.25 s of CPU. Frozen
    before it runs again (as ``main()`` does, see there), its first pass does not
    walk them all either; it collects what the run makes.
    """
    gc.disable()
    from beam_tfrecords.cli import main  # pylint: disable=import-outside-toplevel

    gc.freeze()
    gc.enable()
    return main()


if __name__ == "__main__":
    sys.exit(run())
