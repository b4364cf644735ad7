"""Reading one commit consistently while another writer replaces it (local folder and S3)."""

from __future__ import annotations

import pytest

from resources.store.base import ObjectNotFoundError, TensorStore


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> TensorStore:
    if request.param == "local":
        return request.getfixturevalue("tmp_store")
    return request.getfixturevalue("s3_server").store()


def test_load_from_reads_the_manifest_it_is_given_or_says_it_was_replaced(store: TensorStore) -> None:
    first = store.publish("state/a1", {"latents": b"step-2"}, metadata={"step": 2}).manifest
    assert store.load_from(first, "latents") == b"step-2"
    store.publish("state/a1", {"latents": b"step-4"}, metadata={"step": 4})
    with pytest.raises(ObjectNotFoundError):  # its object went with it: never step 4's bytes under step 2's metadata
        store.load_from(first, "latents")
