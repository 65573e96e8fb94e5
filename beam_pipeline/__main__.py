"""``python -m beam_pipeline convert|verify|inspect ...``"""

import sys

if __name__ == "__main__":
    from beam_pipeline.cli import main

    sys.exit(main())
