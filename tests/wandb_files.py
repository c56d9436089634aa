"""Reading W&B's offline run files (OUT/wandb/offline-run-*/run-*.wandb) in the tests: what a
sweep logged, without an account or a network."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path


def offline_records(path: Path) -> Iterator[object]:
    """The records of one offline run file (OUT/wandb/offline-run-*/run-*.wandb), parsed
    with wandb's own protobuf (`wandb.proto.wandb_internal_pb2.Record`). The file is a
    LevelDB-style log (wandb's "transaction log"): a 7-byte header, then 32 KiB blocks of
    chunks (CRC, length, type: full / first / middle / last)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    block, pos, parts = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zero padding to the end of the block
            pos += (block - pos % block) % block
            continue
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def offline_history(path: Path) -> tuple[str, dict[int, dict[str, float]]]:
    """(run id, {step: {metric: value}}) of one offline run file."""
    run_id, history = "", {}
    for record in offline_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in record.history.item}
            step = int(record.history.step.num) if record.history.HasField("step") else \
                int(items.get("_step", -1))
            history.setdefault(step, {}).update(
                {k: v for k, v in items.items() if not k.startswith("_")})
    return run_id, history
