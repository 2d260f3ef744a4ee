"""Progress of the long parts of a conversion: scanning and writing gigabytes of weights.

Whoever does such work reports it to :func:`current` (a phase with its totals, then bytes and
tensors as they are done); nothing is shown unless a caller installed a reporter with
:func:`reporting`. ``graphamp convert`` installs a rich progress bar when stderr is a terminal,
so a redirected or piped run stays quiet. The passes report through this module too, which
knows nothing of any dialect.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Progress:
    """A reporter that shows nothing (the default); subclasses draw."""

    def begin(self, phase: str, total_bytes: int, total_items: int) -> None:
        """A new phase (``"checking weight ranges"``, ``"writing weights"``); the previous
        one, if any, is complete."""

    def advance(self, nbytes: int, items: int = 1) -> None:
        """``items`` tensors of ``nbytes`` bytes in all are done in the current phase."""

    def end(self) -> None:
        """The current phase is complete."""


_SILENT = Progress()
_CURRENT: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "graphamp_progress", default=None
)


def current() -> Progress:
    """The reporter in effect (one that shows nothing unless :func:`reporting` set one)."""
    return _CURRENT.get() or _SILENT


@contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """Make ``progress`` the reporter for the block; its current phase ends with the block."""
    token = _CURRENT.set(progress)
    try:
        yield progress
    finally:
        progress.end()
        _CURRENT.reset(token)


class BarProgress(Progress):
    """A rich progress bar on stderr per phase: bytes and tensors done, rate, time left.

    Phases below ``min_bytes`` are not drawn (a small model's conversion is over before a bar
    would be read); the bar is removed when its phase ends.
    """

    def __init__(self, console: Any = None, min_bytes: int = 256 << 20) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.min_bytes = min_bytes
        self._bar: Any = None
        self._task: Any = None

    def begin(self, phase: str, total_bytes: int, total_items: int) -> None:
        self.end()
        if total_bytes < self.min_bytes:
            return
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(*_phase_columns(), console=self.console, transient=True)
        self._bar.start()
        self._task = self._bar.add_task(phase, total=total_bytes, tensors=f"0/{total_items}")
        self._items, self._total_items = 0, total_items

    def advance(self, nbytes: int, items: int = 1) -> None:
        if self._bar is None:
            return
        self._items += items
        self._bar.update(self._task, advance=nbytes, tensors=f"{self._items}/{self._total_items}")

    def end(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class FolderProgress(Progress):
    """A folder's conversion: the file being converted and how many are done. Shows nothing;
    :class:`FolderBar` draws."""

    def file(self, name: str) -> None:
        """``name`` is being converted now."""

    def file_done(self) -> None:
        """The current file is converted."""

    def close(self) -> None:
        """Every file is done (or the work stopped): remove what is drawn."""


class FolderBar(FolderProgress):
    """:class:`FolderProgress` drawn with rich on stderr: a line for the files (which one, how
    many of how many, time so far) and under it the current file's weight phases, as
    :class:`BarProgress` draws them, in one live display (rich draws one at a time)."""

    def __init__(self, total_files: int, console: Any = None, min_bytes: int = 256 << 20) -> None:
        from rich.console import Console, Group
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self.min_bytes = min_bytes
        self._files = RichProgress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        )
        self._files_task = self._files.add_task("converting", total=total_files)
        self._phases = RichProgress(*_phase_columns())
        self._phase: Any = None
        self._live = Live(
            Group(self._files, self._phases),
            console=console or Console(stderr=True),
            transient=True,
        )
        self._live.start()

    def file(self, name: str) -> None:
        self._files.update(self._files_task, description=f"converting {name}")

    def file_done(self) -> None:
        self._files.advance(self._files_task)

    def begin(self, phase: str, total_bytes: int, total_items: int) -> None:
        self.end()
        if total_bytes >= self.min_bytes:
            self._phase = self._phases.add_task(
                phase, total=total_bytes, tensors=f"0/{total_items}"
            )
            self._items, self._total_items = 0, total_items

    def advance(self, nbytes: int, items: int = 1) -> None:
        if self._phase is not None:
            self._items += items
            self._phases.update(
                self._phase, advance=nbytes, tensors=f"{self._items}/{self._total_items}"
            )

    def end(self) -> None:
        if self._phase is not None:
            self._phases.remove_task(self._phase)
            self._phase = None

    def close(self) -> None:
        self.end()
        self._live.stop()


def _phase_columns() -> tuple[Any, ...]:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TextColumn("{task.fields[tensors]} tensors"),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )


def folder_for_terminal(total_files: int, stream: Any = None) -> FolderProgress:
    """A :class:`FolderBar` when ``stream`` (default stderr) is a terminal, else silence."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return FolderProgress()
    from rich.console import Console

    return FolderBar(total_files, Console(file=stream))


def for_terminal(stream: Any = None) -> Progress:
    """A :class:`BarProgress` when ``stream`` (default stderr) is a terminal, else silence."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return Progress()
    from rich.console import Console

    return BarProgress(Console(file=stream))
