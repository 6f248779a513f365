"""Progress events of one spawn, for JupyterHub's spawn-pending page."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable


class Progress:
    """Events reported during a spawn, each passed on as soon as it is
    reported (JupyterHub stops reading when the spawn finishes, so waiting
    for its next poll would lose the last ones)."""

    def __init__(self):
        self.events: list[dict] = []
        self._new = asyncio.Event()

    def clear(self) -> None:
        self.events.clear()

    def report(self, message: str, progress: int | None = None) -> None:
        self.events.append({"message": message} if progress is None else {"message": message, "progress": progress})
        self._new.set()

    async def follow(self, pending: Callable[[], bool]) -> AsyncIterator[dict]:
        """Every event, old and new, while ``pending()`` says the spawn goes on."""
        sent = 0
        while True:
            self._new.clear()
            for event in self.events[sent:]:
                yield event
            sent = len(self.events)
            if not pending():
                return
            try:
                await asyncio.wait_for(self._new.wait(), timeout=1)
            except asyncio.TimeoutError:
                pass
