"""The CLI run as the ``beam-tfrecords`` script runs it, in a Python of its own, with
one product function wrapped to note, at each call, one of its arguments (or an
attribute of it) or what it returned: how a test sees that a path was taken inside
the CLI's own process (its helpers forked, its input hashed early, ...)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

__all__ = ["run_noted"]

_PROBE = textwrap.dedent("""
    import importlib, json, sys
    from beam_tfrecords import __main__ as entry

    module, name, note = sys.argv[1:4]
    target = importlib.import_module(module)
    real, noted = getattr(target, name), []

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        if note == "result":
            noted.append(result)
        else:
            index, _, attribute = note.partition(".")
            value = args[int(index)]
            noted.append(getattr(value, attribute) if attribute else value)
        return result

    setattr(target, name, wrapped)
    sys.argv = ["beam-tfrecords", *sys.argv[4:]]
    try:
        code = entry.run()
    finally:
        print("NOTED " + json.dumps([str(v) for v in noted]))
    sys.exit(code)
""")


def run_noted(module: str, function: str, note: str, *argv: str, timeout: int = 600
              ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Runs ``beam-tfrecords ARGV`` with ``module.function`` wrapped; ``note`` is
    ``"result"`` or ``"I"`` / ``"I.attr"`` (the I-th positional argument, or its
    attribute). Returns the finished process and the notes, as strings, in call order."""
    import json  # pylint: disable=import-outside-toplevel

    done = subprocess.run([sys.executable, "-c", _PROBE, module, function, note, *argv], capture_output=True,
                          text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("NOTED ")]
    return done, json.loads(lines[-1][len("NOTED "):]) if lines else []
