"""The artifact archive (.tar.gz): adding a file from bytes, and extracting only the files an artifact names,
so an archive from elsewhere cannot write outside its folder. Used by the operator artifact
(`compiler.build`) and the model artifact (`compiler.workloads.model.artifact`).

Layering: imports nothing of altune; `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def extract_artifact(path: str | os.PathLike, dest_dir: str | os.PathLike,
                     files: Sequence[str]) -> Path:
    """Extracts the known artifact files of `path` into `dest_dir` and returns it.

    Only regular files named in `files` (an operator artifact's are `compiler.build.ARTIFACT_FILES`, a
    model's `compiler.workloads.model.MODEL_ARTIFACT_FILES`) are extracted, so an archive from
    elsewhere cannot write outside `dest_dir`.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name in files]
        missing = set(files) - {m.name for m in members}
        if missing:
            raise ValueError(f"{path}: not an altune artifact, missing {sorted(missing)}")
        for member in members:
            source = tar.extractfile(member)
            assert source is not None, f"{member.name} has no content"
            (dest_dir / member.name).write_bytes(source.read())
    return dest_dir
