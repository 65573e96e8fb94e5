"""``python -m beam_pipeline convert|verify|inspect ...``"""

import sys

from beam_pipeline.cli import main

sys.exit(main())
