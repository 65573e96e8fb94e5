"""Frozen behaviour: nine kinds of run, each made from inputs written here with fixed
seeds, publish files whose SHA-256 is pinned below: every shard, ``inputs.jsonl``,
the dead letters and ``manifest.json`` with what differs from run to run taken out
(times, run ids, durations, the folder's own path). A change that moves one byte of
what a user reads fails here, by name; a restructuring must leave this file
passing unchanged (a deliberate change of output updates the pins in the same
commit, and says why in its message).

To see the digests of a changed tree: ``GOLDEN_PRINT=1 pytest -s tests/test_golden_outputs.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import pytest

from beam_tfrecords.pipeline import convert
from beam_tfrecords.samples import make_cifar_sample, make_class_folder_sample, make_csv_manifest_sample
from beam_tfrecords.schemas.config import ConvertConfig

pytestmark = pytest.mark.beam

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENSORS_SCHEMA = os.path.join(REPO, "schemas", "examples", "sensors.yaml")
BAND = {"shard_min_mb": 0.03, "shard_max_mb": 0.06}
# Inputs carry these modification times (inputs.jsonl records them).
MTIME = 1_700_000_000
# Keys whose values differ between two runs of the same inputs (``root_id`` and
# ``options_fingerprint`` name the folders, which are new for each test; a part's
# ``manifest_sha256`` is of its manifest as written, which holds them; the part's
# manifest itself is checked, made stable).
_VOLATILE = re.compile(r"(^|_)(time|times|created|started|finished|seconds|duration|run_id|date|"
                       r"host|pid|elapsed|at|root_id|options_fingerprint|manifest_sha256)$|_at$")


def _stable(value, root: str, skip: tuple[str, ...] = ()):
    """``value`` without the keys that differ from run to run, and with the run's
    own folders written as ``<in>``/``<out>``."""
    if isinstance(value, dict):
        return {k: _stable(v, root, skip) for k, v in value.items()
                if not _VOLATILE.search(k) and k not in skip}
    if isinstance(value, list):
        return [_stable(v, root, skip) for v in value]
    if isinstance(value, str):
        return value.replace(root, "<root>")
    return value


def _digests(out: str, root: str, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """SHA-256 of every published file of ``out`` (the manifest made stable; the work
    folder and the report are not part of the dataset)."""
    found = {}
    for folder, dirs, names in os.walk(out):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, out)
            if name == "run_report.json" or name.endswith(".png"):
                continue  # The report and the contact sheet are about the run, not the dataset.
            with open(path, "rb") as f:
                data = f.read()
            if name == "manifest.json":
                data = json.dumps(_stable(json.loads(data), root, skip), sort_keys=True).encode()
            elif rel.startswith("dead_letter"):
                data = b"".join(json.dumps(_stable(json.loads(line), root), sort_keys=True).encode() + b"\n"
                                for line in data.splitlines())
            found[rel] = hashlib.sha256(data).hexdigest()
    return dict(sorted(found.items()))


def _images_with_bad_files(root: str) -> None:
    make_class_folder_sample(root, per_class=4, splits=("train", "test"), seed=1)
    with open(os.path.join(root, "train", "circles", "truncated.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0" + b"\x00" * 40)
    with open(os.path.join(root, "test", "squares", "empty.png"), "wb") as f:
        f.write(b"")


def _table(root: str) -> str:
    os.makedirs(root)
    path = os.path.join(root, "table.csv")
    with open(path, "w", encoding="utf-8") as f:
        f.write("id,flag,count,score,name\n")
        for i in range(60):
            f.write(f"{i},{'true' if i % 3 else 'false'},{i * 7 % 11},{i / 8:.3f},\"row {i}, text\"\n")
    return path


def _sensors(root: str) -> str:
    os.makedirs(root)
    path = os.path.join(root, "sensors.csv")
    with open(path, "w", encoding="utf-8") as f:
        f.write("device,t,site,reading,status\n")
        for i in range(40):
            f.write(f"d{i % 5},{40 - i},{'north' if i % 2 else 'south'},{i * 0.25:.2f},{'ok' if i % 4 else 'bad'}\n")
    return path


def _settle(folder: str, mtime: int = MTIME) -> None:
    """Gives every file below ``folder`` the same modification time."""
    for here, _, names in os.walk(folder):
        for name in names:
            os.utime(os.path.join(here, name), (mtime, mtime))


def _run(tmp_path, name: str, settle: bool = True, skip: tuple[str, ...] = (), **options) -> dict[str, str]:
    out = str(tmp_path / name)
    if settle:
        source = options["input"]
        _settle(os.path.dirname(source) if os.path.isfile(source) else source)
    result = convert(ConvertConfig(output=out, encode_processes=0, **BAND, **options))
    assert result.ok, result.report
    return _digests(out, str(tmp_path), skip)


def _class_folders(tmp_path):
    root = str(tmp_path / "images")
    _images_with_bad_files(root)
    return _run(tmp_path, "out", input=root, max_bad_fraction=0.5)


def _cifar(tmp_path):
    root = str(tmp_path / "cifar")
    make_cifar_sample(root, counts={"train": 12, "test": 4}, seed=2)
    return _run(tmp_path, "out", input=root)


def _csv_manifest(tmp_path):
    root = str(tmp_path / "manifest")
    make_csv_manifest_sample(root, n=10, seed=3)
    return _run(tmp_path, "out", input=os.path.join(root, "manifest.csv"))


def _table_ratio_splits(tmp_path):
    path = _table(str(tmp_path / "table"))
    return _run(tmp_path, "out", input=path, splits=(("train", 0.75), ("test", 0.25)), key_column="id")


def _sequences(tmp_path):
    path = _sensors(str(tmp_path / "sensors"))
    # A copy of the schema beside the table (settled with it): the manifest names its
    # path, which must not be the checkout's. The input fingerprint holds the schema's
    # absolute path (a role file's), so it is left out here; inputs.jsonl is checked.
    schema = str(tmp_path / "sensors" / "sensors.yaml")
    shutil.copyfile(SENSORS_SCHEMA, schema)
    return _run(tmp_path, "out", input=path, schema=schema, sequence_key="device", sequence_order="t",
                skip=("fingerprint",))


def _gzip(tmp_path):
    root = str(tmp_path / "images")
    make_class_folder_sample(root, per_class=3, splits=None, seed=4)
    return _run(tmp_path, "out", input=root, compression="gzip")


def _resized(tmp_path):
    root = str(tmp_path / "images")
    make_class_folder_sample(root, per_class=3, splits=("train",), seed=5)
    return _run(tmp_path, "out", input=root, max_side=48, image_format="jpeg", jpeg_quality=80)


def _duplicates_by_content(tmp_path):
    root = str(tmp_path / "images")
    make_class_folder_sample(root, per_class=4, splits=None, seed=8)
    for cls, name in (("circles", "circles_0001.png"), ("squares", "squares_0002.jpg")):
        with open(os.path.join(root, cls, name), "rb") as f:
            data = f.read()
        with open(os.path.join(root, "triangles", "copy_of_" + name), "wb") as f:
            f.write(data)
    return _run(tmp_path, "out", input=root, drop_duplicates=True, split_by="content",
                splits=(("train", 0.7), ("validation", 0.3)))


def _incremental_part(tmp_path):
    root = str(tmp_path / "images")
    make_class_folder_sample(root, per_class=2, splits=None, classes=("circles", "squares"), seed=6)
    first = _run(tmp_path, "out", input=root, incremental=True)
    assert not any(name.startswith("part-") for name in first)
    make_class_folder_sample(str(tmp_path / "more"), per_class=1, splits=None, classes=("circles", "squares"), seed=7)
    for cls in ("circles", "squares"):
        for name in os.listdir(tmp_path / "more" / cls):
            late = os.path.join(root, cls, "late_" + name)
            os.rename(tmp_path / "more" / cls / name, late)
            os.utime(late, (MTIME + 86_400, MTIME + 86_400))
    return _run(tmp_path, "out", input=root, incremental=True, settle=False)


CASES = {
    "class_folders_with_bad_files": _class_folders,
    "cifar": _cifar,
    "csv_image_manifest": _csv_manifest,
    "table_ratio_splits": _table_ratio_splits,
    "sequences": _sequences,
    "gzip": _gzip,
    "resized": _resized,
    "incremental_part": _incremental_part,
    "duplicates_by_content": _duplicates_by_content,
}

GOLDEN: dict[str, dict[str, str]] = {
    "cifar": {
        "dataset_info.json": "0ea857501ca9f750345e115b76550dab3aadd7aa6ea0ad5767a71ef78aef7c5b",
        "features.json": "d2682b27273aabc994722a165c42503a742d468e413736b21b98f8afd080be51",
        "image.class.label.labels.txt": "2a2c00f56af9fa247b91a073cb473d8addfa50c09449deda2ba71e1a9e4d4675",
        "inputs.jsonl": "0dccd90448edc1d525a1ec830548eb171c274a910afbef9a9624f59580c36c3d",
        "manifest.json": "e8387c09347597042873f56986c82f8724e30c1bb6757cb9d2f6d75651d7fa98",
        "test-00000-of-00001.tfrecord": "6e997dddb4f5fcaf5e829da4a206da08a4cfd1bdcc0b950acad482d5cb17cda3",
        "test-00000-of-00001.tfrecord.idx": "f8c193551ed641f64a9344879211fc851725d37f72fbfc59f397ffbd6b8685dd",
        "train-00000-of-00001.tfrecord": "edea3e5f1fb424f69aa4437cf30f6cbafcde9c2ef9cc30de1a09098c7b003f95",
        "train-00000-of-00001.tfrecord.idx": "723b962d46cf47487060750842974bb3f65ec17bf37129a0dbfca9f951115222",
    },
    "class_folders_with_bad_files": {
        "dataset_info.json": "2a641eafdb24ec00cddc8598e679b211821ad765d70014b071225e90b2a6cfb5",
        "dead_letter/test-00002-of-00004.jsonl": "88cd03d635144973086d40bcb97c4939b1fc6246753273a4d0a6553e73a4cfe9",
        "dead_letter/train-00003-of-00004.jsonl": "ba32056339764a89c63f3af8957f4889794b186c856fa9b53dc0826309228ad3",
        "features.json": "3b724c7c6fee2426f06a28871bf54d94af8941b1a726f26e82661e5c040c4445",
        "image.class.label.labels.txt": "2a2c00f56af9fa247b91a073cb473d8addfa50c09449deda2ba71e1a9e4d4675",
        "inputs.jsonl": "b53dbb55a28ad3be8894e2ce130b321077def0335697ca07f5c9eecbae40f195",
        "manifest.json": "13939e204015eb334da4a62ca400fed5d282fbef77f0a0b8a45d0473dcf664b0",
        "test-00000-of-00004.tfrecord": "89a6b93d34e10c2e4afa3ac3d16622533603f699474462e5144ce3be00e751f2",
        "test-00000-of-00004.tfrecord.idx": "8b0f30f2e48972d8cea79c0905c43f0bd7c1d87469c79d41288c7af1a3dd04a9",
        "test-00001-of-00004.tfrecord": "e4c54572db590cd00349c81e1bf9aed44b2be681e89f1fc3982bbe3119ae36cd",
        "test-00001-of-00004.tfrecord.idx": "67d263beb0404c0ccbd0c6e341cd535f48acfb57717d49b5e329d7e10730920f",
        "test-00002-of-00004.tfrecord": "cb7ea29c686cf77e46de06967babe6be346d4803c8229b85be4d0974ed26efb0",
        "test-00002-of-00004.tfrecord.idx": "b8eac7fb28173e65536c3e0184ff848c5c4ce52f7251e3cea548d05313e3feda",
        "test-00003-of-00004.tfrecord": "91d02815921b3642a85025b5c198ac23f7f37f67d9cb136a9762c78c44c6b828",
        "test-00003-of-00004.tfrecord.idx": "1e62de02bfe9073eb61a4b003594c0c28efd7886186ed30ad0d26da36da18280",
        "train-00000-of-00004.tfrecord": "4d592e3b5742065e31cc8834dc0c52c3fccf51583d7efdcdfefd86865d3369dd",
        "train-00000-of-00004.tfrecord.idx": "7efe490e9ae3e8758e9c39982f70fdecee9c7adc0a3c50af8fb8d657cce7974a",
        "train-00001-of-00004.tfrecord": "6199b2030ad1f5523969c49d2b80a7216c178a695fd9a422b817573121d09d49",
        "train-00001-of-00004.tfrecord.idx": "c447206e3b53b11bf34a13c322f6e89b60a9b2fbaf0600e723d30c11c050f004",
        "train-00002-of-00004.tfrecord": "3e98f97ed61f75c0c54a479325d64839a613cc287478d009fa3c102d8e283622",
        "train-00002-of-00004.tfrecord.idx": "058a3b3814236b75cfb8ee7173f9caf26ea74fa8fcd489f54100f1647d7b0807",
        "train-00003-of-00004.tfrecord": "3576c157cebb006d88d8d406bb23f1346a4b504b3f15b153e76b9ac22717c3f5",
        "train-00003-of-00004.tfrecord.idx": "c2f1118a5606d1ef6ec852bc768722ce714d7740eed8509f2267c69732bbf7ee",
    },
    "csv_image_manifest": {
        "dataset_info.json": "df3d68ebebd20e238ec33f9571c56c5c433da17ea6cef7f2da0af4d4c41227c7",
        "features.json": "c2682e537b09d435edda28292f44bb0c912b474f1d54c2f5073b658ab5916bf3",
        "image.class.label.labels.txt": "2a2c00f56af9fa247b91a073cb473d8addfa50c09449deda2ba71e1a9e4d4675",
        "inputs.jsonl": "27b2d1164672e34c6eff54cdc5f34fe7c696303a187f25ddb94b790433dbe06c",
        "manifest.json": "d91dafc194653ba874cf4875745627a7b9ccdf5a84e36066dc82c9dad06bb109",
        "test-00000-of-00001.tfrecord": "d97986df97d5018ad2de2c15aed9f8d24b92efaf225baf45b2d4571d951b808c",
        "test-00000-of-00001.tfrecord.idx": "97f2ac58e43678bc7bf3fa07adfb5c1fde8465d0c91db086be11e517525f9db5",
        "train-00000-of-00001.tfrecord": "17315ec22b579c87c27c8587b2ad1f9551aaf59856c7c628f637cf75488f7933",
        "train-00000-of-00001.tfrecord.idx": "51d9bcbe8f8adbae77e2f3e527500c4e074b2b3f942c919a9854f46d8077820a",
    },
    "gzip": {
        "inputs.jsonl": "56ad74b0c3c251494965d99af8b459e9a59729243cffe85b37151c4cb7b9bef4",
        "manifest.json": "7d84cfc0e5ad864c7ec4ced612bee5e031602179cc2aea0516a36f7c4b27d01b",
        "train-00000-of-00002.tfrecord.gz": "43645e8a4146394db6acade307a166a59d96eeff100e3ab3731163a5bacc4d31",
        "train-00001-of-00002.tfrecord.gz": "6b1439d466bcc64a05ec83557a3a9d9d053851e9cb08c233018714fe19dca32b",
    },
    "incremental_part": {
        "dataset_info.json": "5cda819dea18b7509768e3adfa381c2f21e92abcebd6daeb540e11e8e59b3e0f",
        "features.json": "d3658b89751deb7311e572cb28fea63f574bde831918e05d961ed99fb1c88482",
        "image.class.label.labels.txt": "c40d65db806540310fc63f76f336fbefbe4ca06589de268c84865e8db5578f21",
        "inputs.jsonl": "85facbd473f8eaed87101c697efcd8897f2a9abf7899a4eb878099b24052ec87",
        "manifest.json": "7b9439b2e33ef23c376b60cb2e70e163caea4d2085fd450508945b4c573265e8",
        "part-00001/dataset_info.json": "98b76afb35808828a70648ba0b518c5eac513b53d43e842b87526a0576a35ce9",
        "part-00001/features.json": "b8fe0cac479c40657a5e0689f9321fd2f6582767e2bc4016454833dacc5d2f9d",
        "part-00001/image.class.label.labels.txt": "c40d65db806540310fc63f76f336fbefbe4ca06589de268c84865e8db5578f21",
        "part-00001/inputs.jsonl": "6c245d1998d8c1e287ce0c4434fc2fce308e1122fdd39b85f3220466a04f6224",
        "part-00001/manifest.json": "fefb5ee2daf9c0736cbf82ef0d397333b5f937c9660bb5277b26473b7d5b1fce",
        "part-00001/train-00000-of-00001.tfrecord": "d3abaf3e55ad0720c02926b24e4eb9579ca6a5612cb597bb7672fd1179f09b6e",
        "part-00001/train-00000-of-00001.tfrecord.idx": "df92a4285d1622331a9a256becd7641bad34ed0c67e1b8d5402271d404cf6d38",
        "train-00000-of-00001.tfrecord": "18a1758ba4cb31bfe7ec63320c9910a37e4c720472070aeff64eaa2a4862fd83",
        "train-00000-of-00001.tfrecord.idx": "1299d5aac72634f87cc829c6e488f9f9eaf37799c1afeb77478aea168a98bd95",
    },
    "resized": {
        "dataset_info.json": "cd9bf5a72d0e1e457c913117fa0663b03573ab744ef85a22e0f9f67f8aaf0f94",
        "features.json": "e924d2eb05ca0e12606e9bdef3a2d4cc19eda6e9833739b0461bbcd2303e8850",
        "image.class.label.labels.txt": "2a2c00f56af9fa247b91a073cb473d8addfa50c09449deda2ba71e1a9e4d4675",
        "inputs.jsonl": "56382b9d2a1c64c94efa39f87f24d5578623ad0e1fb71978027814d6f7faf5f7",
        "manifest.json": "658b3f94a47f61a954ff2f79416d06f91d7ff0a033235dcbd1baa9a2468b778d",
        "train-00000-of-00001.tfrecord": "fec4f8b6d494d4bb23c9893eadd6836f6c6fdd913bc5187fb50c3f2dfab865f4",
        "train-00000-of-00001.tfrecord.idx": "cf6c3f529009f16175db16e955de66727cbdd469343999ad459955f749540fbd",
    },
    "sequences": {
        "dataset_info.json": "381dc870f9976732c30ac7deb67663b6e1eee85cbe1b4cc422983b0a4a9a1b19",
        "features.json": "b92adce947a2874b9be254c5bb1691970e4163dd100ad8ef384121478d987a85",
        "inputs.jsonl": "90adb88decd0a0124347f8c891a5d7801d62ce5d8b45f1e630888e0f244893c6",
        "manifest.json": "91f7415128ca7d200ef259682bbed12605e3faf4d14d7be9d2f78ad5b8fcc2fc",
        "train-00000-of-00001.tfrecord": "84006e88aeea050d8d770f27ff961bd5569a157bdacff5b57e4fcc3f999ce2ba",
        "train-00000-of-00001.tfrecord.idx": "90c8671f9e44997fd1c1280a1e45b7924cc10e6fb41552f6663dd583c0837550",
    },
    "table_ratio_splits": {
        "dataset_info.json": "f6327478c1533a7341e0cf8a3568ec31c6594466678b7fd19bf2289932a9c7fa",
        "features.json": "21bbc48e963235b09166d8ab431ada6736e6522037869d091ca0c8931c9f0df2",
        "inputs.jsonl": "f2989d311a9a5e4572170626b215e0d5e43a353e31f2a12edb1d5c0fd6166e48",
        "manifest.json": "91c7d39aad78ff851682beacdc78b47471f2b3916ab322e4dbe588a5250e3e3e",
        "test-00000-of-00001.tfrecord": "4f20c9467b123339628a9b72f001b0f993eb47c8e6d6f373b1520647d11fa401",
        "test-00000-of-00001.tfrecord.idx": "f82532ba03bf25aa7c7170f950f5fd1532b4a1e68677aae0ff3f921e8ca3f8ef",
        "train-00000-of-00001.tfrecord": "bfe3b363dd32e008a33310a21d53df38b5ac8a99284c3c751dbb7636bc04c0de",
        "train-00000-of-00001.tfrecord.idx": "edb0140f091a682d13475ad39ef452da49e224abe86e55c3047de872ce7e7008",
    },
    "duplicates_by_content": {
        "dataset_info.json": "d31b8dec4e3870fc5a301a3e33ebe3c809167cbeea2e2417b99410f856eea323",
        "features.json": "3b724c7c6fee2426f06a28871bf54d94af8941b1a726f26e82661e5c040c4445",
        "image.class.label.labels.txt": "2a2c00f56af9fa247b91a073cb473d8addfa50c09449deda2ba71e1a9e4d4675",
        "inputs.jsonl": "acaf8c7abda886bda4bc31b8e44051501f73eceef9753adbe806ecdf19176ca1",
        "manifest.json": "e2d8783cd00796a4e85bf0f921c14fac4b847be7f9c1072d5edfaaebbe85b8ab",
        "train-00000-of-00003.tfrecord": "b27faab68f7a9fe1f1001f2301df358ce9856a5cc593237edb06ec915b8d0ac0",
        "train-00000-of-00003.tfrecord.idx": "714406d91658789aadd61756de2a64aed14508416d66aa9e9d7b8e5f348c88a3",
        "train-00001-of-00003.tfrecord": "4a3a0e88e9b95d28f9cb51d4de3ee3fa5f6d978f8c2e3172f96588d372b12ae5",
        "train-00001-of-00003.tfrecord.idx": "3c2a809e66a44e72fa4b2dfcba3895f5528722148692b2b87d7702cc92b09747",
        "train-00002-of-00003.tfrecord": "203bd55d34564db16d9e86c0b56fc1eef12b85fb6201347b60c07b4463e248ea",
        "train-00002-of-00003.tfrecord.idx": "8b2c11713ba107d94713314f845e3be28c8f0b9d035559d70f42c37f9068ed50",
        "validation-00000-of-00001.tfrecord": "3a480de8c9bb2a43ffb3086e9f9c3ce414cb09849c9bce71bac1fef34210f40a",
        "validation-00000-of-00001.tfrecord.idx": "ab224d87b9370d46c62ee099c5b961746b8a51e1c4c038313b5c3c05f4be0544",
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_published_files_are_byte_for_byte_as_pinned(tmp_path, case):
    found = CASES[case](tmp_path)
    if os.environ.get("GOLDEN_PRINT"):
        print(f"\n    {case!r}: {json.dumps(found, indent=8)},")
    assert found == GOLDEN[case]
