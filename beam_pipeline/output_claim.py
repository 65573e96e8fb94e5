"""Taking the output folder for a run: check what it holds, take its lock, clear
what this product left there.

``check_output`` refuses, reading only, an output holding a dataset (unless
overwriting or adding a part) or files this product cannot prove it wrote;
``take_output`` takes the lock, looks again under it, removes what killed runs and
the last run left, and writes the run's ``inputs.jsonl`` to its temporary folder.
"""

from __future__ import annotations

import os

from beam_tfrecords.run_plan import ConvertError, OutputBusy, OutputExistsError, OutputNotOursError, RunPlan
from beam_tfrecords.schemas.inputs import INPUTS_NAME, encode_inputs
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR, MANIFEST_NAME, REPORT_NAME
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.commit import (
    OutputBusyError,
    acquire_lock,
    release_lock,
    remove_folder,
    remove_stale_temporaries,
)
from beam_tfrecords.transforms.io.dataflow_jobs import DataflowApi, DataflowJob
from beam_tfrecords.transforms.io.fingerprint import published_entry, write_inputs
from beam_tfrecords.transforms.io.ownership import OutputClaims, claim_output, prune_journal, record_folder
from beam_tfrecords.transforms.plan.layouts import resolve_input
from beam_tfrecords.updates import manifest_digest

__all__ = ["check_output", "take_output"]


def check_output(plan: RunPlan, claims: OutputClaims | None = None) -> None:
    """Refuses an output folder that holds files this product cannot prove it wrote
    where a run would replace them or read them as the dataset's, or a folder of its
    own that is a link (with or without ``overwrite``), and one that holds a
    finished dataset, unless overwriting (or adding a part to it); reads only.

    Args:
      plan: the run.
      claims: the output as found now (default: as the plan found it).

    Raises:
      OutputNotOursError: naming the files (the first few, and a count).
      OutputExistsError: when ``manifest.json`` exists and ``overwrite`` is off.
    """
    config = plan.config
    is_part = plan.update is not None and plan.update.action == "part"
    # A dataset there is named first (the usual case: pass --overwrite); what the output
    # holds besides, that this product cannot prove it wrote, refuses the run either way.
    if not is_part and files.exists(files.join(config.output, MANIFEST_NAME)) and not config.overwrite:
        why = f" ({plan.update.reason})" if plan.update is not None else ""
        raise OutputExistsError(
            f"--output {config.output} already holds a dataset ({MANIFEST_NAME}){why}; "
            "pass --overwrite to replace it, or choose another folder"
        )
    claims = claims or plan.output_claims or claim_output(plan.dataset_output or config.output)
    if claims.refusal():
        raise OutputNotOursError(claims.refusal())


def take_output(plan: RunPlan, job: DataflowJob | None = None, api: DataflowApi | None = None) -> None:
    """Takes the output folder for this run: its lock, then a clean slate.

    Refuses a finished dataset unless overwriting (the old manifest stays until
    the new one replaces it, see ``transforms.io.commit``), removes what killed
    runs left behind, and clears the last run's report and the dead letters no
    manifest lists (a failed run's). ``job`` and ``api``: see ``acquire_lock`` (a run
    on Dataflow; a lock naming a job).

    Raises:
      OutputExistsError: when ``manifest.json`` exists and ``overwrite`` is off.
      OutputBusy: when another run holds the output's lock.
    """
    config, target = plan.config, plan.target
    lock_output = plan.dataset_output or config.output
    is_part = plan.update is not None and plan.update.action == "part"
    check_output(plan)
    try:
        acquire_lock(lock_output, target.run_id, job, api)
    except OutputBusyError as err:
        raise OutputBusy(str(err)) from None
    except OSError as err:
        raise ConvertError(f"--output {lock_output}: cannot write there "
                           f"({err.strerror or err}); choose another folder") from None
    try:
        if plan.update is not None:
            now = manifest_digest(files.read_bytes_if_exists(files.join(lock_output, MANIFEST_NAME)))
            if now != plan.update.seen_manifest:
                raise OutputBusy(f"--output {lock_output}: another run changed the dataset while "
                                 "this one was planning; run again to compare with what it wrote")
        # Looked at again under the lock: only what this product can prove it wrote
        # is removed (the report and dead letters of the last run, what killed runs
        # left); anything else a run would touch refuses the run. The dead letters the
        # published manifest lists stay: its commit replaces or removes them.
        claims = claim_output(lock_output)
        check_output(plan, claims)
        remove_stale_temporaries(lock_output, target.run_id)
        part = config.output[len(files.join(lock_output, "")):] + "/" if is_part else ""
        if part and claims.owns(part):
            # A part folder the root manifest does not list is what a killed run left.
            remove_folder(config.output)
        stale = [REPORT_NAME] + [name for name in claims.leftovers if name.startswith(DEAD_LETTER_DIR + "/")
                                 and not is_part]
        files.delete_files([files.join(lock_output, name) for name in stale if claims.owns(name)])
        if files.is_local(lock_output) and not is_part:
            try:  # Emptied: it goes too (a user's file in it keeps it).
                os.rmdir(files.join(lock_output, DEAD_LETTER_DIR))
            except OSError:
                pass
        prune_journal(lock_output)  # What it recorded of the files just removed.
        if part:  # Recorded before anything creates it, so that the next run may remove it.
            record_folder(lock_output, part)
        # Role files (labels, schema, CSV manifest) are published relative to the input root.
        _, root, _ = resolve_input(config.input, config.layout)
        roles = [published_entry(entry, root) for entry in plan.role_files]
        if plan.input_table is not None:
            # A listing's columns: streamed, in the bytes encode_inputs makes.
            write_inputs(files.join(target.temp_dir, INPUTS_NAME), roles,
                         plan.input_table, plan.input_rows)
        elif plan.input_files or roles:
            # The commit step completes the entries (content hashes it computed) and
            # publishes them beside the manifest.
            files.write_bytes(files.join(target.temp_dir, INPUTS_NAME),
                              encode_inputs((*roles, *plan.input_files)))
    except BaseException:
        release_lock(lock_output, target.run_id)
        raise
