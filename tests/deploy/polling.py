"""Waiting for a state, never for a time: the deploy tests' one polling helper."""
import time


def wait_for(what, predicate, seconds=20, interval=0.05):
    """Returns once predicate() is true; fails naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")
