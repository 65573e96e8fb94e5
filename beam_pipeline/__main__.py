"""``python -m beam_tfrecords convert|verify|inspect ...``"""

import sys

if __name__ == "__main__":
    from beam_tfrecords.cli import main

    sys.exit(main())
