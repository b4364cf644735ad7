"""Fuzzing the small JSON decoders: store manifests and queue request bodies raise only ValueError.

A manifest that is accepted must be safe to act on: every object it names lies inside its
own commit (a publish deletes the objects of the manifest it replaces, so a manifest naming
another commit's objects would delete them), with a non-negative size.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from resources.queue.records import MAX_BODY_BYTES, Request
from resources.store.manifest import Manifest, ObjectEntry, checksum, object_key
from tests.fuzz.fuzzing import FUZZ, count_input

COMMIT = "runs/demo/anchors/v000001"
GOOD = Manifest(
    COMMIT,
    {"tensors.safetensors": ObjectEntry(object_key(COMMIT, "tensors.safetensors", checksum(b"x")), checksum(b"x"), 1)},
    {"version": 1},
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(
    [
        COMMIT + "/tensors.safetensors.abc",
        "runs/other/anchors/v000000/tensors.safetensors.abc",
        COMMIT,
        COMMIT + "/a/b",
        "../../etc/passwd",
        "/abs",
        "",
        COMMIT + "/.hidden",
    ]
) | st.text(max_size=30)


def _manifest_bodies() -> st.SearchStrategy[bytes]:
    good = json.loads(GOOD.to_bytes())

    def rewrite(field: str, value: object) -> bytes:
        body = json.loads(json.dumps(good))
        if field.startswith("objects."):
            entry = body["objects"]["tensors.safetensors"]
            entry[field.split(".", 1)[1]] = value
        elif field == "objects":
            body["objects"] = value
        else:
            body[field] = value
        return json.dumps(body).encode()

    fields = st.sampled_from(
        [
            "format",
            "commit_key",
            "writer",
            "metadata",
            "objects",
            "objects.key",
            "objects.xxh3_128",
            "objects.size_bytes",
        ]
    )
    return (
        st.builds(rewrite, fields, json_values | keys)
        | st.binary(max_size=200)
        | st.builds(lambda depth: ("[" * depth + "]" * depth).encode(), st.integers(1, 200_000))
    )


@FUZZ
@given(_manifest_bodies())
def test_manifest_bytes_parse_or_raise_value_error_and_name_only_their_own_objects(data: bytes) -> None:
    count_input("manifest")
    try:
        manifest = Manifest.from_bytes(data, where="fuzz", commit_key=COMMIT)
    except ValueError:
        return
    for _name, entry in manifest.objects.items():
        assert entry.key.startswith(COMMIT + "/") and "/" not in entry.key[len(COMMIT) + 1 :]
        assert isinstance(entry.size_bytes, int) and entry.size_bytes >= 0 and isinstance(entry.xxh3_128, str)


def test_a_manifest_of_another_commit_is_refused() -> None:
    try:
        Manifest.from_bytes(GOOD.to_bytes(), where="fuzz", commit_key="runs/demo/anchors/v000002")
    except ValueError as err:
        assert "v000002" in str(err)
    else:
        raise AssertionError("a manifest read at another commit's key was accepted")


def _request_bodies() -> st.SearchStrategy[bytes | str]:
    fields = st.fixed_dictionaries(
        {
            "request_id": st.text(max_size=12) | st.just("r0"),
            "iteration": json_values | st.integers(0, 2**64),
            "kind": st.sampled_from(["rollout", "validate", "explore", "other"]),
        },
        optional={"payload": json_values, "extra": json_values},
    )
    return (
        st.builds(lambda body: json.dumps(body), fields)
        | st.binary(max_size=200)
        | st.text(max_size=200)
        | st.builds(
            lambda depth: (
                '{"request_id":"r","iteration":0,"kind":"rollout","payload":' + "[" * depth + "]" * depth + "}"
            ),
            st.integers(1, 100_000),
        )
        | st.just(
            json.dumps({"request_id": "r", "iteration": 0, "kind": "rollout", "payload": {"x": "y" * MAX_BODY_BYTES}})
        )
    )


@FUZZ
@given(_request_bodies())
def test_request_bodies_parse_or_raise_value_error_and_round_trip(data: bytes | str) -> None:
    count_input("queue_body")
    try:
        request = Request.from_json(data)
    except ValueError:
        return
    assert Request.from_json(request.to_json()) == request
    assert 0 <= request.iteration < 2**63  # fits a SQLite INTEGER and a Redis hash field
