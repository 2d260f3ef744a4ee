"""Writing an external data file at the disk's speed, a tensor at a time.

Bytes go through two page-aligned buffers: the caller fills one while a background thread writes
the other, so reading and rounding the next weights overlaps the disk write. The file is opened
with ``O_DIRECT`` where the filesystem takes it: the data skips the page cache, so a machine
without memory to spare (or a VM whose fresh pages are slow to get) neither copies it nor
reclaims pages for it, and the cache is left to the input being read. The last, partial
block is written padded and the file cut to its length. Elsewhere (tmpfs, other systems) the
same code writes through the page cache.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from graphamp.core import progress

BUFFER_BYTES = 16 << 20  # per buffer; two of them
BLOCK = 4096  # O_DIRECT needs offsets, sizes and addresses aligned to the logical block


class DataFileWriter:
    """Appends bytes to a new file; :meth:`close` makes it complete (or raises what failed)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        direct = getattr(os, "O_DIRECT", 0)
        try:
            self._fd = os.open(path, flags | direct, 0o666)
            self.direct = bool(direct)
        except OSError:  # a filesystem without O_DIRECT (tmpfs): the page cache it is
            self._fd = os.open(path, flags, 0o666)
            self.direct = False
        self.length = 0  # bytes accepted so far
        self._buffers = [mmap.mmap(-1, BUFFER_BYTES) for _ in range(2)]  # page-aligned
        self._current = 0
        self._filled = 0
        self._free: queue.Queue[int] = queue.Queue()
        self._free.put(1)
        self._jobs: queue.Queue[tuple[int, int] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_jobs, daemon=True)
        self._thread.start()

    def write(self, data: memoryview | bytes) -> None:
        """Append ``data`` (copied into the buffers; the caller may reuse it at once)."""
        view = memoryview(data).cast("B")
        while view.nbytes:
            room = BUFFER_BYTES - self._filled
            take = min(room, view.nbytes)
            buffer = self._buffers[self._current]
            buffer[self._filled : self._filled + take] = view[:take]
            self._filled += take
            self.length += take
            view = view[take:]
            if self._filled == BUFFER_BYTES:
                self._submit(BUFFER_BYTES)

    def write_all(self, pieces: Iterable[memoryview | bytes]) -> None:
        for piece in pieces:
            self.write(piece)

    def _submit(self, nbytes: int) -> None:
        """Hand the current buffer to the writer thread and take the other one."""
        self._raise_error()
        self._jobs.put((self._current, nbytes))
        self._current = self._free.get()  # waits until the thread has written it
        self._filled = 0
        self._raise_error()

    def _write_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            index, nbytes = job
            try:
                if self._error is None:
                    self._write_buffer(index, nbytes)
            except BaseException as exc:  # handed to the caller by _raise_error
                self._error = exc.with_traceback(None)  # no frame keeps a buffer view alive
            finally:
                self._free.put(index)

    def _write_buffer(self, index: int, nbytes: int) -> None:
        view = memoryview(self._buffers[index])[:nbytes]
        while view.nbytes:
            written = os.write(self._fd, view)
            view = view[written:]

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Write what is buffered, cut the file to its length and close it."""
        try:
            if self._filled:
                tail = self._filled
                padded = -(-tail // BLOCK) * BLOCK if self.direct else tail
                self._buffers[self._current][tail:padded] = bytes(padded - tail)
                self._submit(padded)
            self._jobs.put(None)
            self._thread.join()
            self._raise_error()
            os.ftruncate(self._fd, self.length)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop without completing (after an error); the caller removes the file."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._buffers = []  # unmapped when the last view of them goes


@contextmanager
def writing(
    path: str | os.PathLike[str], what: str, total: int, items: int
) -> Iterator[DataFileWriter]:
    """A :class:`DataFileWriter` of ``path`` for the block, under a progress bar saying ``what``
    (``total`` bytes in ``items`` pieces: the block advances it): closed when the block ends,
    abandoned on an error (the caller removes the file)."""
    reporter = progress.current()
    reporter.begin(what, total, items)
    writer = DataFileWriter(path)
    try:
        yield writer
        writer.close()
    except BaseException:
        writer.abandon()
        raise
    finally:
        reporter.end()
