"""A flow written once, without I/O: a generator that yields each `ChatRequest` and receives
its `Completion` (`kioku.chronicler.chronicle`), run here against a sync model or an async
one, so the two chroniclers share every step but the waiting."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import TypeVar

from kioku.models import ChatRequest, Completion

__all__ = ["adrive", "drive"]

T = TypeVar("T")


def drive(
    flow: Generator[ChatRequest, Completion, T], complete: Callable[[ChatRequest], Completion]
) -> T:
    """Run a flow against a sync model."""
    try:
        request = next(flow)
        while True:
            request = flow.send(complete(request))
    except StopIteration as stop:
        result: T = stop.value
        return result


async def adrive(
    flow: Generator[ChatRequest, Completion, T],
    complete: Callable[[ChatRequest], Awaitable[Completion]],
) -> T:
    """Run a flow against an async model."""
    try:
        request = next(flow)
        while True:
            request = flow.send(await complete(request))
    except StopIteration as stop:
        result: T = stop.value
        return result
