"""Places for model submissions, taken on the event loop before a request thread is used.

An upload or a zoo job waits in a request thread for one of `sandbox_processes` confined children, for
seconds to minutes. Unbounded, 32 of them at once held every request thread, and `/healthz` and every read
stalled behind them. So each takes a place here first, as a dependency that runs on the event loop and never
waits: `sandbox_processes` places to run and `upload_queue` to wait; when all are taken the answer is 503
with `Retry-After`, and no thread was used.

    @router.post("/models")
    async def create_model_job(..., _slot: SubmissionSlot) -> JobPublic: ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from service.db import API_THREADS

RETRY_SECONDS = 5  # Retry-After when every place is taken: an import takes seconds


class Places:
    """A count of places taken out of `capacity`; only the event loop's thread touches it, so it needs no lock."""

    def __init__(self, capacity: int) -> None:
        assert capacity >= 1, f"{capacity=} < 1"
        self.capacity = capacity
        self.taken = 0

    def try_take(self) -> bool:
        if self.taken >= self.capacity:
            return False
        self.taken += 1
        return True

    def give_back(self) -> None:
        assert self.taken > 0, f"{self.taken=}: a place given back twice"
        self.taken -= 1


def submission_places(request: Request) -> Places:
    """The app's places: `sandbox_processes` + `upload_queue` of its settings, made on first use, at most half the
    request threads (whatever the settings say, reads keep the other half)."""
    state = request.app.state
    if not hasattr(state, "submission_places"):
        wanted = state.settings.sandbox_processes + state.settings.upload_queue
        state.submission_places = Places(max(1, min(wanted, API_THREADS // 2)))
    return state.submission_places


async def take_submission_slot(request: Request) -> AsyncIterator[None]:
    """Hold one place while the route runs, or answer 503 with Retry-After at once."""
    places = submission_places(request)
    if not places.try_take():
        raise HTTPException(503, f"the server is importing {places.capacity} models already "
                                 f"(ALTUNE_SANDBOX_PROCESSES + ALTUNE_UPLOAD_QUEUE); try again in {RETRY_SECONDS} s",
                            headers={"Retry-After": str(RETRY_SECONDS)})
    try:
        yield
    finally:
        places.give_back()


# scope="function": the place is given back when the handler returns, not after the response is sent
SubmissionSlot = Annotated[None, Depends(take_submission_slot, scope="function")]
