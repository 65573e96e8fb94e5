"""Dataflow job construction, offline: the real DataflowRunner in dry-run mode.

``--dry_run=True`` makes ``DataflowRunner.run_pipeline`` do everything but submit:
it translates the pipeline for Runner v2, stages nothing remotely but builds every
artifact locally (``--setup_file`` is turned into an sdist by ``python -m build``
or, when ``build`` is not installed, ``python setup.py sdist``), builds the
``apiclient.Job`` and returns it as ``result.job``. In Beam 2.77 every Python job
is a portable (Runner v2) job: ``job.proto.steps`` stays empty and the steps are
the transforms of ``job.proto_pipeline`` (a Beam Runner API ``Pipeline``), with
the user's labels as ``unique_name``. The Dataflow ``Environment`` (worker pool,
container image, ``sdk_pipeline_options``) is built only at submission, from the
job, by ``apiclient.Environment``; ``_submitted_environment`` below builds it the
same way, without the uploads.

Every test runs with outbound network refused (loopback only) and with no usable
credentials: building a Dataflow job must need neither (a dry run does not probe
the output's bucket). Inputs are samples on the storage emulator (loopback), since
Dataflow refuses local inputs and outputs (the workers cannot see the launcher's
disk); the preflight lists an image folder there (the listing step takes that
listing on a worker), and for tables reads only the CSV header and the first rows
(schema inference) in the driver. A local ``--schema`` is read by the driver only.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import socket
import tarfile
import tempfile
import time

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.dataflow.internal import apiclient
from apache_beam.version import __version__ as BEAM_VERSION
from google.cloud import dataflow_v1beta3

from beam_tfrecords.cli import _convert_parser, _unknown_beam_flags
from beam_tfrecords.pipeline import build_pipeline
from beam_tfrecords.preflight import resolve_config
from beam_tfrecords.samples import (
    make_cifar_sample,
    make_class_folder_sample,
    make_csv_manifest_sample,
)
from beam_tfrecords.schemas.config import ConvertConfig
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_FILE = os.path.join(REPO, "setup.py")
SENSORS_SCHEMA = os.path.join(REPO, "schemas", "examples", "sensors.yaml")

PROJECT, REGION, BUCKET = "example-project", "us-central1", "gs://example-bucket"
CUSTOM_IMAGE = f"{REGION}-docker.pkg.dev/{PROJECT}/beam/beam-tfrecords:test"
DEFAULT_IMAGE = f"gcr.io/cloud-dataflow/v1beta3/beam_python3.11_sdk:{BEAM_VERSION}"

# The DataflowRunner dry-run recipe (shared/NOTES.md), plus a staging location.
DRY_RUN_FLAGS = [
    "--runner", "DataflowRunner", "--dry_run=True", "--no_auth",
    "--project", PROJECT, "--region", REGION,
    f"--temp_location={BUCKET}/tmp", f"--staging_location={BUCKET}/staging",
]

IMAGE_STEPS = ["ListImages", "PlanShards", "WriteShards", "VerifyShards", "WriteManifest"]
TABLE_STEPS = ["EncodeTables", "PlanTableShards", "WriteShards", "VerifyShards", "WriteManifest"]
SEQUENCE_STEPS = ["EncodeTables", "BuildSequences", "PlanSequenceShards", "WriteShards",
                  "VerifyShards", "WriteManifest"]


# --- offline, credential-free environment ------------------------------------------


def _is_loopback(host) -> bool:
    if host in (None, "", "localhost", b"localhost"):
        return True
    try:
        return ipaddress.ip_address(host.decode() if isinstance(host, bytes) else host).is_loopback
    except ValueError:
        return False


@pytest.fixture
def _one_sdist_build_at_a_time():
    """Beam's stager builds the sdist from this tree, writing its egg-info there:
    two test processes (pytest -n) building at once can break each other's build."""
    with open(os.path.join(tempfile.gettempdir(), "beam-tfrecords-test-sdist.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def offline(monkeypatch, tmp_path, _one_sdist_build_at_a_time):
    """Refuses (and records) every non-loopback connection or name lookup, hides any
    credentials, and keeps Beam's local staging files under ``tmp_path``."""
    attempts: list = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def allowed(address) -> bool:
        return not isinstance(address, tuple) or _is_loopback(address[0])

    def connect(self, address):
        if not allowed(address):
            attempts.append(("connect", address))
            raise OSError(f"network is disabled in this test: connect to {address!r}")
        return real_connect(self, address)

    def connect_ex(self, address):
        if not allowed(address):
            attempts.append(("connect_ex", address))
            raise OSError(f"network is disabled in this test: connect to {address!r}")
        return real_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_loopback(host):
            attempts.append(("getaddrinfo", host))
            raise socket.gaierror(f"network is disabled in this test: lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    # Application-default credentials would fail to load if anything looked for them.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-credentials.json"))
    (tmp_path / "gcloud").mkdir()
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    # Beam's stager builds the sdist and writes its artifacts in tempfile.mkdtemp().
    (tmp_path / "staging").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "staging"))
    yield attempts
    assert attempts == [], f"building the Dataflow job tried to reach the network: {attempts}"


# --- building and reading the job ----------------------------------------------------


def on_gcs(gcs, local: str, name: str) -> str:
    """Uploads the folder ``local`` to ``BUCKET/in/name`` on the emulator; returns that path."""
    path = f"{BUCKET}/in/{name}"
    gcs.upload_tree(local, path)
    return path


def _dry_run(config: ConvertConfig, *extra: str, setup_file: bool = True):
    """Builds ``config`` with the real DataflowRunner in dry-run mode; returns the job."""
    flags = [*DRY_RUN_FLAGS, *(["--setup_file", SETUP_FILE] if setup_file else []), *extra]
    started = time.monotonic()
    result = build_pipeline(config, PipelineOptions(flags)).run()
    result.wait_until_finish()
    seconds = time.monotonic() - started
    # A hang guard, not a speed check (a dry run takes a few seconds; shared machines are noisy).
    assert seconds < 300, f"a dry run took {seconds:.1f} s"
    job = result.job
    assert isinstance(job, apiclient.Job)
    assert job.proto.name.startswith("beamapp-")
    assert job.proto.type_ == dataflow_v1beta3.JobType.JOB_TYPE_BATCH
    return job


def _top_level_steps(job) -> dict[str, beam_runner_api_pb2.PTransform]:
    """The pipeline's top-level steps by user label (what the Dataflow UI shows).

    Here the proto wraps them in one synthetic root transform
    (``ref_AppliedPTransform_...``); a transform whose label has no '/' and that
    holds no other such transform is a user step.
    """
    transforms = job.proto_pipeline.components.transforms
    top = {tid: t for tid, t in transforms.items() if "/" not in t.unique_name}
    wrappers = {tid for tid, t in top.items() if any(s in top for s in t.subtransforms)}
    return {t.unique_name: t for tid, t in top.items() if tid not in wrappers}


def _assert_chain(job, names: list[str]) -> None:
    """The steps exist, and each feeds the next (an output of one is an input of the next)."""
    steps = _top_level_steps(job)
    missing = [n for n in names if n not in steps]
    assert not missing, f"steps {missing} missing from the job; it has {sorted(steps)}"
    for a, b in itertools.pairwise(names):
        outputs = set(steps[a].outputs.values())
        inputs = set(steps[b].inputs.values())
        assert outputs & inputs, f"{a} does not feed {b}"


def _environments(job) -> list[beam_runner_api_pb2.Environment]:
    envs = list(job.proto_pipeline.components.environments.values())
    assert envs, "the job has no SDK environment"
    return envs


def _container_images(job) -> set[str]:
    images = set()
    for env in _environments(job):
        assert env.urn == common_urns.environments.DOCKER.urn  # Dataflow runs Docker only.
        images.add(beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image)
    return images


def _staged_artifacts(job) -> dict[str, str]:
    """What Dataflow would stage for the workers: staged name -> local file."""
    staged = {}
    for env in _environments(job):
        for dep in env.dependencies:
            assert dep.type_urn == common_urns.artifact_types.FILE.urn
            path = beam_runner_api_pb2.ArtifactFilePayload.FromString(dep.type_payload).path
            assert dep.role_urn == common_urns.artifact_roles.STAGING_TO.urn
            name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(
                dep.role_payload).staged_name
            staged[name] = path
    return staged


def _submitted_environment(job) -> dataflow_v1beta3.Environment:
    """The Dataflow Environment that submission would attach to the job: built by the
    same Beam call as ``DataflowApplicationClient.create_job_description``, with
    the staged packages named but not uploaded."""
    staging = job.google_cloud_options.staging_location
    return apiclient.Environment(
        packages=sorted(_staged_artifacts(job)),
        options=job.options,
        environment_version=getattr(apiclient, "_FNAPI_ENVIRONMENT_MAJOR_VERSION", "8"),
        proto_pipeline_staged_url=f"{staging}/pipeline.pb",
        proto_pipeline=job.proto_pipeline,
    ).proto


def _assert_ships_our_package(job) -> None:
    """``--setup_file`` became an sdist staged as ``workflow.tar.gz`` that holds every
    package, the generated protobuf code and the example schemas; the SDK itself is
    not staged (``--sdk_location`` default: the worker image already has Beam)."""
    options = job.options.get_all_options()
    assert options["setup_file"] == SETUP_FILE
    assert options["sdk_location"] == "default"
    staged = _staged_artifacts(job)
    assert "workflow.tar.gz" in staged, f"the setup file was not staged: {sorted(staged)}"
    assert not [n for n in staged if "apache_beam" in n or n.startswith("dataflow_python_sdk")]
    with tarfile.open(staged["workflow.tar.gz"]) as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    for path in ("setup.py", "beam_pipeline/__init__.py", "beam_pipeline/cli.py",
                 "transforms/__init__.py", "transforms/io/helper_main.py", "schemas/__init__.py",
                 "schemas/proto/__init__.py", "schemas/proto/example_pb2.py",
                 "schemas/proto/tensor_pb2.py", "schemas/examples/sensors.yaml"):
        assert path in members, f"{path} is not in the staged sdist"
    environment = _submitted_environment(job)
    sdk_options = dataflow_v1beta3.Environment.to_dict(environment)["sdk_pipeline_options"]["options"]
    assert sdk_options["setup_file"] == SETUP_FILE
    assert sdk_options["sdk_location"] == "default"
    (pool,) = environment.worker_pools
    assert pool.worker_harness_container_image == DEFAULT_IMAGE
    assert "use_runner_v2" in environment.experiments


# --- one job per input kind ----------------------------------------------------------


@pytest.mark.emulator
def test_image_class_folders_job(tmp_path, gcs, offline):
    make_class_folder_sample(str(tmp_path / "in"), per_class=1)
    config = ConvertConfig(input=on_gcs(gcs, str(tmp_path / "in"), "folders"),
                           output=f"{BUCKET}/out/folders")
    job = _dry_run(config)
    _assert_chain(job, IMAGE_STEPS)
    _assert_ships_our_package(job)
    assert _container_images(job) == {DEFAULT_IMAGE}


@pytest.mark.emulator
def test_image_job_hashing_on_the_workers(tmp_path, gcs, offline):
    """--drop_duplicates and --split_by content: the images are hashed by a step of
    the job (HashImages, between the listing and the plan), not by the launcher."""
    make_class_folder_sample(str(tmp_path / "in"), per_class=1, splits=None)
    config = ConvertConfig(input=on_gcs(gcs, str(tmp_path / "in"), "hashed"), output=f"{BUCKET}/out/hashed",
                           drop_duplicates=True, splits=(("train", 0.8), ("test", 0.2)), split_by="content")
    job = _dry_run(config)
    _assert_chain(job, ["ListImages", "HashImages", "PlanShards", "WriteShards", "VerifyShards", "WriteManifest"])
    assert gcs.list(f"{BUCKET}/out/") == []  # Built, not run: nothing written.


@pytest.mark.emulator
def test_image_cifar_job(tmp_path, gcs, offline):
    make_cifar_sample(str(tmp_path / "in"), counts={"train": 4, "test": 2})
    config = ConvertConfig(input=on_gcs(gcs, str(tmp_path / "in"), "cifar"), output=f"{BUCKET}/out/cifar",
                           compression="gzip")
    job = _dry_run(config)
    _assert_chain(job, IMAGE_STEPS)
    _assert_ships_our_package(job)


@pytest.mark.emulator
def test_image_csv_manifest_job(tmp_path, gcs, offline):
    make_csv_manifest_sample(str(tmp_path / "in"), n=4)
    config = ConvertConfig(input=on_gcs(gcs, str(tmp_path / "in"), "manifest") + "/manifest.csv",
                           output=f"{BUCKET}/out/manifest")
    # A CSV with an 'image' column is an image manifest, not a table.
    assert resolve_config(config, PipelineOptions(DRY_RUN_FLAGS)).layout == "auto"
    job = _dry_run(config)
    _assert_chain(job, IMAGE_STEPS)
    assert "EncodeTables" not in _top_level_steps(job)
    _assert_ships_our_package(job)


@pytest.mark.emulator
def test_csv_table_job(tmp_path, gcs, offline):
    src = tmp_path / "in" / "table.csv"
    src.parent.mkdir()
    src.write_text('id,flag,count,score,name\n1,true,3,0.5,a\n2,false,4,1.5,"b, c"\n3,yes,5,,d\n')
    config = ConvertConfig(input=on_gcs(gcs, str(src.parent), "table") + "/table.csv",
                           output=f"{BUCKET}/out/table",
                           splits=(("train", 0.8), ("test", 0.2)), key_column="id")
    resolved = resolve_config(config, PipelineOptions(DRY_RUN_FLAGS))
    assert resolved.layout == "table"
    assert resolved.encode_processes == 0  # -1 (automatic) means none off the DirectRunner.
    job = _dry_run(config)
    _assert_chain(job, TABLE_STEPS)
    assert "ListImages" not in _top_level_steps(job)
    _assert_ships_our_package(job)


@pytest.mark.emulator
def test_csv_table_sequence_job(tmp_path, gcs, offline):
    src = tmp_path / "in" / "sensors.csv"
    src.parent.mkdir()
    src.write_text("device,t,site,reading,status\n"
                   "a,2,north,1.5,ok\na,1,north,2.5,bad\nb,1,south,0.5,ok\n")
    config = ConvertConfig(input=on_gcs(gcs, str(src.parent), "sensors") + "/sensors.csv",
                           output=f"{BUCKET}/out/sequences",
                           schema=SENSORS_SCHEMA, sequence_key="device", sequence_order="t")
    job = _dry_run(config)
    _assert_chain(job, SEQUENCE_STEPS)
    steps = _top_level_steps(job)
    assert "PlanTableShards" not in steps
    assert {"CollectFiles", "Summarize"} <= set(steps)
    _assert_ships_our_package(job)


# --- the custom container and the documented worker flags ----------------------------

# The worker flags docs/running_on_dataflow.md recommends for image jobs.
IMAGE_JOB_FLAGS = [
    f"--sdk_container_image={CUSTOM_IMAGE}", "--experiments=use_runner_v2",
    "--machine_type=n2-highmem-4", "--disk_size_gb=50", "--max_num_workers=20",
    "--number_of_worker_harness_threads=4",
    "--service_account_email=beam-tfrecords@example-project.iam.gserviceaccount.com",
]


@pytest.mark.emulator
def test_custom_container_job_carries_worker_settings(tmp_path, gcs, offline):
    """With ``--sdk_container_image`` (our Dockerfile's image, package preinstalled)
    and no ``--setup_file``, nothing of ours is staged and every step runs in the
    custom image; the sizing flags reach the worker pool."""
    make_class_folder_sample(str(tmp_path / "in"), per_class=1, splits=None)
    config = ConvertConfig(input=on_gcs(gcs, str(tmp_path / "in"), "custom"), output=f"{BUCKET}/out/custom")
    parser = _convert_parser("beam-tfrecords convert")
    ours = [a for action in parser._actions for a in action.option_strings]  # pylint: disable=protected-access
    assert _unknown_beam_flags(IMAGE_JOB_FLAGS, ours) == []  # The CLI passes them all to Beam.
    job = _dry_run(config, *IMAGE_JOB_FLAGS, setup_file=False)
    _assert_chain(job, IMAGE_STEPS)
    assert _container_images(job) == {CUSTOM_IMAGE}
    assert "workflow.tar.gz" not in _staged_artifacts(job)
    environment = _submitted_environment(job)
    (pool,) = environment.worker_pools
    assert pool.worker_harness_container_image == CUSTOM_IMAGE
    assert pool.machine_type == "n2-highmem-4"
    assert pool.disk_size_gb == 50
    assert pool.autoscaling_settings.max_num_workers == 20
    assert pool.num_threads_per_worker == 4
    assert environment.service_account_email.startswith("beam-tfrecords@")


@pytest.mark.unit
def test_documented_convert_commands_use_only_known_flags():
    """Every flag of a ``beam-tfrecords convert`` command in docs/running_on_dataflow.md
    is ours or Beam's (the CLI refuses any other before it starts)."""
    with open(os.path.join(REPO, "docs", "running_on_dataflow.md"), encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    commands = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("beam-tfrecords convert")]
    assert len(commands) >= 2
    parser = _convert_parser("beam-tfrecords convert")
    ours = [a for action in parser._actions for a in action.option_strings]  # pylint: disable=protected-access
    for command in commands:
        words = command.split()[2:]
        assert {"--runner", "--project", "--region", "--temp_location"} <= set(words)
        _, beam_args = parser.parse_known_args(words)  # As the CLI does: ours first, ...
        assert _unknown_beam_flags(beam_args, ours) == [], command  # ... the rest is Beam's.


# --- the CLI ------------------------------------------------------------------------


@pytest.mark.emulator
def test_cli_dry_run_builds_the_job_and_says_so(tmp_path, gcs, offline, capsys):
    from beam_tfrecords.cli import main  # pylint: disable=import-outside-toplevel

    make_class_folder_sample(str(tmp_path / "in"), per_class=2, splits=None)
    out = f"{BUCKET}/out/cli"
    code = main(["convert", "--input", on_gcs(gcs, str(tmp_path / "in"), "cli"), "--output", out,
                 *DRY_RUN_FLAGS, f"--sdk_container_image={CUSTOM_IMAGE}"])
    assert code == 0
    assert "dry run: the job was built and checked, not run" in capsys.readouterr().out
    assert gcs.list(out + "/") == []  # Nothing written, not even the lock.
