"""``python -m beam_pipeline convert|verify|inspect ...``

The import stays inside the guard: the shard writer's helper processes
re-import this module (multiprocessing's spawn does so for ``__main__``) and
must not pay for loading Beam, nor run the command again.
"""

import sys

if __name__ == "__main__":
    from beam_pipeline.cli import main

    sys.exit(main())
