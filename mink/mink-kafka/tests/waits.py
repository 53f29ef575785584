"""What the Kafka test scripts wait on: their consumer threads notify CHANGED after each poll,
and `until` checks a condition then, with a deadline that names what it waited for."""

import threading
import time

CHANGED = threading.Condition()


def until(what, done, seconds=30, state=lambda: None):
    """Returns once `done()` holds, checked after each poll of a consumer thread; fails after
    `seconds` naming what it waited for (and `state()`)."""
    deadline = time.monotonic() + seconds
    with CHANGED:
        while not done():
            left = deadline - time.monotonic()
            assert left > 0, f"waited {seconds}s for {what}; state: {state()}"
            CHANGED.wait(left)
