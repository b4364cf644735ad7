"""AdamW state of an FSDP2 trainer saved and restored sharded, with torch.distributed.checkpoint (DCP): every rank
writes only its own shard of each state tensor, and reads back only the shard its parameters hold. The whole state
never exists in one process, which full fine-tuning at 20B needs (AdamW's two moments are 2x the FP32 masters).

The DCP folder of checkpoint `version` lives in the tensor store beside the checkpoint's own objects, at
`{weights_key}/optimizer.dcp/{file}` (DCP's `.metadata` stored as `metadata`: store keys never start with a dot), so
deleting the checkpoint's commit deletes it. Each rank writes its files into a local folder with DCP's
FileSystemWriter, then uploads them; rank 0 commits the checkpoint's manifest only after every rank's upload.
Keys are the one-process checkpoint's (`opt.{index}.{name}`), so a sharded state also loads whole into one process
(DCP reshards on load): a run trained on N ranks resumes on any number, one included.

Example (every rank):
    meta = save_sharded(store, weights_key("demo", 4), trainer.optimizer)   # before rank 0 publishes checkpoint 4
    load_sharded(store, meta, trainer.optimizer)                            # each rank reads its shards
    tensors = load_whole(store, meta)                                       # one process: the whole state
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from resources.store.base import TensorStore
from workers.trainer.optimizer_state import SHARDED_FORMAT, state_dict_from

FOLDER = "optimizer.dcp"
_DCP_METADATA, _STORED_METADATA = ".metadata", "metadata"


def dcp_prefix(checkpoint_key: str) -> str:
    """Where checkpoint `checkpoint_key`'s sharded optimizer state lives in the store."""
    return f"{checkpoint_key}/{FOLDER}/"


def save_sharded(store: TensorStore, checkpoint_key: str, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Every rank: write this rank's shards of the optimizer's state under `dcp_prefix(checkpoint_key)`; returns the
    JSON metadata the checkpoint's manifest carries (the param groups and non-tensor state). A collective: all ranks
    call it, and it returns once every rank's files are in the store."""
    state_dict = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, values in state_dict["state"].items():
        for name, value in values.items():
            if torch.is_tensor(value):
                tensors[f"opt.{index}.{name}"] = value
            else:
                scalars.setdefault(str(index), {})[name] = value
    prefix = dcp_prefix(checkpoint_key)
    with tempfile.TemporaryDirectory(prefix="spotlight-dcp-") as folder:
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(folder))
        for path in sorted(Path(folder).iterdir()):
            name = _STORED_METADATA if path.name == _DCP_METADATA else path.name
            store.put_bytes(prefix + name, path.read_bytes())
    dist.barrier()  # rank 0 commits the checkpoint only once every rank's shard is stored
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state_dict["param_groups"]]
    return {"format": SHARDED_FORMAT, "prefix": prefix, "scalars": scalars, "param_groups": groups}


def load_sharded(store: TensorStore, meta: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Every rank: load the sharded state `meta` describes into an optimizer over FSDP2 shards, each rank reading the
    shards its parameters hold (a state tensor shaped like its parameter is sharded as the parameter is)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with _local_folder(store, meta["prefix"]) as folder:
        reader = dcp.FileSystemReader(folder)
        template = {}
        for key, item in reader.read_metadata().state_dict_metadata.items():
            param = params[int(key.split(".")[1])]
            dtype = item.properties.dtype
            like_param = tuple(item.size) == tuple(param.shape)
            template[key] = torch.zeros_like(param, dtype=dtype) if like_param else torch.zeros(item.size, dtype=dtype)
        dcp.load(template, storage_reader=reader)
    optimizer.load_state_dict(state_dict_from(template, meta))


def load_whole(store: TensorStore, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One process: the sharded state's tensors whole (`opt.{index}.{name}`), as a one-process checkpoint holds them."""
    with _local_folder(store, meta["prefix"]) as folder:
        reader = dcp.FileSystemReader(folder)
        whole = {
            key: torch.zeros(item.size, dtype=item.properties.dtype)
            for key, item in reader.read_metadata().state_dict_metadata.items()
        }
        dcp.load(whole, storage_reader=reader, no_dist=True)
    return whole


@contextlib.contextmanager
def _local_folder(store: TensorStore, prefix: str) -> Iterator[str]:
    """A local DCP folder of the store's objects under `prefix` (links to the backend's own files where it has them,
    temporary downloads otherwise)."""
    keys = store.list_keys(prefix)
    if prefix + _STORED_METADATA not in keys:
        raise LookupError(f"no sharded optimizer state at {store.url}/{prefix} (its metadata is missing)")
    with tempfile.TemporaryDirectory(prefix="spotlight-dcp-") as folder, contextlib.ExitStack() as files:
        for key in keys:
            name = key[len(prefix) :]
            source = files.enter_context(store.object_file(key))
            (Path(folder) / (_DCP_METADATA if name == _STORED_METADATA else name)).symlink_to(source)
        yield folder
