"""Handles and tagged groups: the part of the protocol every backend shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class Transfer(Protocol):
    """A backend's in-flight transfer. `result()` makes the caller's stream able to use the output and returns it."""

    def result(self) -> torch.Tensor: ...


class UlyssesProtocolError(RuntimeError):
    """The call sequence broke the group protocol (for example a wait before the group's completing call)."""


@dataclass
class TaggedGroup:
    """Transfers submitted with barrier=False plus the call that completes them; a standalone call is a group of one."""

    epoch: int
    tags: list[str | None] = field(default_factory=list)
    completed: bool = False
    captured: bool = False  # recorded into a graph: every call of the group must be


class UlyssesHandle:
    """What `scatter_heads` / `gather_heads` return. `wait()` gives the output tensor; it may be called again."""

    def __init__(self, transfer: Transfer, group: TaggedGroup, tag: str | None, is_open, on_error=None, finish=None):
        self._transfer = transfer
        self._finish = finish  # the output's final view (gather_rows drops its unit head axis)
        self._group = group
        self.tag = tag
        self._is_open = is_open
        self._on_error = on_error  # told about a transfer that failed while waited (a timed-out collective)
        self._output: torch.Tensor | None = None

    @property
    def ready_to_wait(self) -> bool:
        return self._group.completed

    def wait(self) -> torch.Tensor:
        if self._output is not None:
            return self._output
        if not self._is_open():
            raise UlyssesProtocolError(f"Ulysses handle (tag={self.tag!r}) waited after its communicator was closed")
        if not self._group.completed:
            raise UlyssesProtocolError(
                f"Ulysses handle (tag={self.tag!r}) waited before its group's completing call: tags "
                f"{self._group.tags} were submitted with barrier=False; submit the group's last tensor with "
                "barrier=True before waiting on any of them"
            )
        try:
            output = self._transfer.result()
            self._output = output if self._finish is None else self._finish(output)
        except Exception as exc:
            if self._on_error is not None:
                self._on_error(exc)
            raise
        self._transfer = None
        return self._output
