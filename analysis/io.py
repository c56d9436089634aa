"""Atomic file writes: write a temp file in the target's directory, then `os.replace` it. A
reader never sees a half-written file; a writer that fails leaves the previous file (if any)
untouched and no temp file behind."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd
    from matplotlib.figure import Figure

_FILE_MODE = 0o644


def atomic_write(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                    suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_parquet(df: pd.DataFrame, path: str | os.PathLike[str],
                         metadata: dict[str, str] | None = None) -> Path:
    """`metadata`: the file's key-value schema metadata (`pyarrow.parquet.read_schema`)."""
    if not metadata:
        return atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    merged = dict(table.schema.metadata or {})
    merged.update({k.encode(): v.encode() for k, v in metadata.items()})
    table = table.replace_schema_metadata(merged)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def atomic_savefig(fig: Figure, path: str | os.PathLike[str]) -> Path:
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110,
                                                      bbox_inches="tight"))
