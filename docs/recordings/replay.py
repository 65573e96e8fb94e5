"""Renders a terminal recording (util-linux ``script`` output) as plain text.

    python docs/recordings/replay.py RECORDING [--frames N]

Prints the successive states of the line redrawn in place (``\\r`` ... ``ESC[K``),
N of them spread over the run (default 12; 0: every one), then the screen as it
was left: each line's last state, as a reader of the terminal saw it at the end.
"""

from __future__ import annotations

import argparse
import re

_CLEAR = "\x1b[K"
_HEADER = re.compile(r"^Script (started|done) on .*$", re.M)


def screen(text: str) -> tuple[list[str], list[str]]:
    """``(frames, lines)``: every state the current line was drawn in, and the
    final text of every line."""
    text = _HEADER.sub("", text).replace("\r\n", "\n").strip("\n")
    frames, lines = [], []
    for raw in text.split("\n"):
        line = ""
        for piece in raw.split("\r"):
            cleared = piece.endswith(_CLEAR) or _CLEAR in piece
            piece = piece.replace(_CLEAR, "")
            # A carriage return goes back to column 0; ESC[K clears what is left.
            line = piece if cleared or len(piece) >= len(line) else piece + line[len(piece):]
            if piece.startswith("converting:"):
                frames.append(piece)
        lines.append(line)
    return frames, lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("recording")
    parser.add_argument("--frames", type=int, default=12)
    args = parser.parse_args(argv)
    with open(args.recording, encoding="utf-8", errors="replace", newline="") as f:
        frames, lines = screen(f.read())
    shown = frames
    if args.frames and len(frames) > args.frames:
        step = (len(frames) - 1) / (args.frames - 1)
        shown = [frames[round(i * step)] for i in range(args.frames)]
    print(f"--- the live line: {len(shown)} of its {len(frames)} states, in order ---")
    print("\n".join(shown))
    print("--- the terminal at the end ---")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
