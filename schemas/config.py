"""The options of a conversion, checked once, before any pipeline is built."""

from __future__ import annotations

import dataclasses

from schemas.images import VALIDATE_MODES
from schemas.layouts import LAYOUTS
from schemas.sharding import ShardBand
from schemas.tfrecord import COMPRESSIONS

__all__ = ["ConvertConfig"]


@dataclasses.dataclass(frozen=True)
class ConvertConfig:
    """What to convert, where to, and how.

    Every check names the command-line flag to change, since that is where the
    values usually come from.
    """

    input: str
    output: str
    layout: str = "auto"
    labels: str | None = None
    compression: str = "none"
    validate: str = "structure"
    shard_min_mb: float = 100.0
    shard_max_mb: float = 200.0
    max_bad_fraction: float = 0.01
    overwrite: bool = False
    read_threads: int = 4
    # Helper processes per shard writer; -1: all cores when the pipeline runs on the
    # DirectRunner in one process, none elsewhere (Dataflow runs a process per core).
    encode_processes: int = -1

    def __post_init__(self):
        if not self.input:
            raise ValueError("--input is required: a folder, a glob or a CSV manifest")
        if not self.output:
            raise ValueError("--output is required: the folder to write shards and manifest.json to")
        for flag, value, allowed in (
            ("--layout", self.layout, LAYOUTS),
            ("--compression", self.compression, COMPRESSIONS),
            ("--validate", self.validate, VALIDATE_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"{flag} must be one of {', '.join(allowed)}; got {value!r}")
        if self.shard_min_mb <= 0:
            raise ValueError(f"--shard_min_mb must be positive; got {self.shard_min_mb}")
        if self.shard_max_mb < self.shard_min_mb:
            raise ValueError(
                f"--shard_max_mb ({self.shard_max_mb}) must be at least --shard_min_mb "
                f"({self.shard_min_mb})"
            )
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"--max_bad_fraction must be within [0, 1]; got {self.max_bad_fraction}")
        if not 1 <= self.read_threads <= 64:
            raise ValueError(f"--read_threads must be within 1..64; got {self.read_threads}")
        if not -1 <= self.encode_processes <= 64:
            raise ValueError(
                f"--encode_processes must be within 0..64, or -1 for automatic; "
                f"got {self.encode_processes}"
            )

    @property
    def band(self) -> ShardBand:
        """The shard size band in bytes."""
        return ShardBand.from_mb(self.shard_min_mb, self.shard_max_mb)

    def to_json(self) -> dict:
        """The options as the manifest records them."""
        return dataclasses.asdict(self)
