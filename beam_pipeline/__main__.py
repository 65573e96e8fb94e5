"""``python -m beam_tfrecords convert|verify|inspect ...``"""

import gc
import sys

if __name__ == "__main__":
    # Importing Beam and this package makes ~1M objects and no garbage: the
    # collector's passes over them while they load cost ~0.25 s of CPU. Frozen
    # before it runs again (as main() does, see there), its first pass does not
    # walk them all either; it collects what the run makes.
    gc.disable()
    from beam_tfrecords.cli import main

    gc.freeze()
    gc.enable()
    sys.exit(main())
