"""What a storage call raises when the store, not the data, is at fault.

The shard engine (``transforms.shard_engine``) retries a shard's write or re-read on these;
the commit step (``transforms.commit_step``) reports them as a failed publish. One tuple
both use, so neither imports the other for it.
"""

from __future__ import annotations

from apache_beam.io.filesystem import BeamIOError

__all__ = ["STORAGE_ERRORS"]


def _storage_errors() -> tuple[type[BaseException], ...]:
    """What a storage call raises when the store, not the data, is at fault."""
    errors: tuple[type[BaseException], ...] = (OSError, BeamIOError)
    try:
        from google.api_core.exceptions import GoogleAPIError  # pylint: disable=import-outside-toplevel
    except ImportError:  # pragma: no cover - a GCP extra of Beam.
        return errors
    errors = (*errors, GoogleAPIError)
    # A resumable upload (Beam's GCS writer) or a download that gets an unexpected
    # status or bad bytes raises these, which are not GoogleAPIErrors.
    try:
        from google.resumable_media import (  # pylint: disable=import-outside-toplevel
            DataCorruption,
            InvalidResponse,
        )
    except ImportError:  # pragma: no cover - google-cloud-storage without it.
        from google.cloud.storage.exceptions import (  # pylint: disable=import-outside-toplevel
            DataCorruption,
            InvalidResponse,
        )
    return (*errors, InvalidResponse, DataCorruption)


STORAGE_ERRORS = _storage_errors()
