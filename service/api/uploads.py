"""A multipart upload streamed to disk under a size limit, before anything of it is held in memory.

    upload = await receive_upload(request, folder, max_file_bytes=settings.max_upload_bytes)
    upload.path, upload.size, upload.sha256, upload.filename, upload.fields["spec"]

FastAPI's `UploadFile` is filled by Starlette, which reads the whole body (spooling files over 1 MB to
disk) before the handler runs, so a handler can only refuse a large file after receiving all of it.
Here a `Content-Length` over the limit is refused (413) before reading; otherwise the body is parsed
as it arrives (`python_multipart`'s streaming parser), the file part written chunk by chunk to a
temporary file in `folder` and hashed, and reading stops with a 413 at the first byte over the limit.
Other fields are kept in memory up to `max_field_bytes`. On any refusal the temporary file is removed;
on success the caller owns it (moves it into the content-addressed store, or removes it).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fastapi import HTTPException, Request
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from service.api.deps import invalid

MAX_FIELD_BYTES = 64 << 10
MAX_PARTS = 8
OVERHEAD_BYTES = MAX_PARTS * (MAX_FIELD_BYTES + (8 << 10))  # the other fields, part headers, boundaries


@dataclass
class Upload:
    """The file part on disk (a temporary name in the folder it was received into) and the other fields."""

    path: Path
    size: int
    sha256: str
    filename: str | None
    fields: dict[str, str] = field(default_factory=dict)


async def receive_upload(request: Request, folder: Path, *, max_file_bytes: int, file_field: str = "file",
                         max_field_bytes: int = MAX_FIELD_BYTES) -> Upload:
    """Streams the request's multipart body: the `file_field` part to a file in `folder`, the others kept.

    Raises:
        HTTPException: 413 when the file is over `max_file_bytes` (declared or sent), 400 for a broken
            multipart body or a field over `max_field_bytes`.
        RequestValidationError: 422 ("body", `file_field`) when there is no file part.
    """
    kind, params = parse_options_header(request.headers.get("content-type", ""))
    if kind != b"multipart/form-data" or not params.get(b"boundary"):
        raise invalid(("body", file_field), "Field required (send multipart/form-data with a file part)")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_file_bytes + OVERHEAD_BYTES:
        raise _too_large(max_file_bytes)
    folder.mkdir(parents=True, exist_ok=True)
    parser = _Parser(params[b"boundary"], folder, file_field, max_file_bytes, max_field_bytes)
    try:
        await parser.feed(request.stream())
        if parser.upload is None:
            raise invalid(("body", file_field), "Field required")
        return parser.upload
    except BaseException:
        parser.discard()
        raise


def _too_large(limit: int) -> HTTPException:
    return HTTPException(413, f"the file is larger than {limit} bytes (the limit)")


class _Parser:
    """`python_multipart` callbacks: part headers, field values in memory, file data to disk."""

    def __init__(self, boundary: bytes, folder: Path, file_field: str, max_file_bytes: int,
                 max_field_bytes: int) -> None:
        self.folder, self.file_field = folder, file_field
        self.max_file_bytes, self.max_field_bytes = max_file_bytes, max_field_bytes
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin, "on_part_data": self._part_data, "on_part_end": self._part_end,
            "on_header_field": self._header_field, "on_header_value": self._header_value,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_finished,
        })
        self.upload: Upload | None = None
        self.fields: dict[str, str] = {}
        self.parts = 0
        self._file: IO[bytes] | None = None
        self._hash = hashlib.sha256()
        self._pending: list[bytes] = []  # file data parsed from the last chunk, written off the event loop
        self._header, self._value, self._disposition = b"", b"", b""
        self._name: str | None = None
        self._data = bytearray()

    async def feed(self, stream: AsyncIterator[bytes]) -> None:
        async for chunk in stream:
            try:
                self.parser.write(chunk)
            except HTTPException:
                raise
            except Exception as e:  # python_multipart's parse errors, a bad header
                raise HTTPException(400, f"a broken multipart body: {e}") from e
            if self._pending:
                data, self._pending = b"".join(self._pending), []
                await run_in_threadpool(self._file.write, data)
        try:
            self.parser.finalize()
        except Exception as e:
            raise HTTPException(400, f"a broken multipart body: {e}") from e
        if self._pending:
            await run_in_threadpool(self._file.write, b"".join(self._pending))
        if self._file is not None and self.upload is None:
            raise HTTPException(400, "a broken multipart body: the file part does not end")
        if self._file is not None:
            self._file.close()
        if self.upload is not None:
            self.upload.fields = self.fields

    def discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._path.unlink(missing_ok=True)

    def _part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise HTTPException(400, f"a multipart body of more than {MAX_PARTS} parts")
        self._disposition, self._name, self._data = b"", None, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        if self._header.lower() == b"content-disposition":
            self._disposition = self._value
        self._header, self._value = b"", b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise HTTPException(400, 'a broken multipart body: a part without Content-Disposition "name"')
        self._name = options[b"name"].decode("utf-8", errors="replace")
        if self._name == self.file_field:
            if self._file is not None:
                raise invalid(("body", self.file_field), "more than one file part")
            filename = options.get(b"filename")
            self._filename = filename.decode("utf-8", errors="replace") if filename is not None else None
            fd, path = tempfile.mkstemp(dir=self.folder, prefix=".upload-", suffix=".partial")
            self._file, self._path = os.fdopen(fd, "wb"), Path(path)
            self._size = 0

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name == self.file_field and self.upload is None:
            self._size += end - start
            if self._size > self.max_file_bytes:
                raise _too_large(self.max_file_bytes)
            chunk = bytes(data[start:end])
            self._hash.update(chunk)
            self._pending.append(chunk)
        else:
            self._data += data[start:end]
            if len(self._data) > self.max_field_bytes:
                raise HTTPException(400, f"form field {self._name!r} is larger than {self.max_field_bytes} bytes")

    def _part_end(self) -> None:
        if self._name == self.file_field and self.upload is None:
            self.upload = Upload(self._path, self._size, self._hash.hexdigest(), self._filename)
        elif self._name is not None and self._name != self.file_field:
            self.fields[self._name] = self._data.decode("utf-8", errors="replace")
