"""runtime/threads.py: outcomes carry failures home, polled waits stop, joins are bounded."""

from __future__ import annotations

import logging
import queue
import threading
import time

import pytest

from poptorch_sim.runtime.threads import (
    POLL_S,
    attempt,
    join_all,
    polled_get,
    polled_put,
    start_thread,
    unwrap,
)


def test_an_outcome_carries_the_value_or_the_exception_with_its_traceback() -> None:
    def fails() -> None:
        raise KeyError("lost")

    assert attempt(sum, [1, 2]) == (True, 3)
    ok, exc = attempt(fails)
    assert not ok and isinstance(exc, KeyError)
    with pytest.raises(KeyError, match="lost") as info:
        unwrap((ok, exc))
    assert any(entry.name == "fails" for entry in info.traceback)  # raised where it happened


def test_polled_get_takes_an_item_and_gives_up_at_its_timeout_or_stop() -> None:
    inbox: queue.Queue[int] = queue.Queue()
    stop = threading.Event()
    inbox.put(7)
    assert polled_get(inbox, stop, 0.0) == (True, 7)
    start = time.monotonic()
    assert polled_get(inbox, stop, 0.12) == (False, None)
    assert 0.1 <= time.monotonic() - start < 5.0
    stop.set()
    inbox.put(8)
    assert polled_get(inbox, stop) == (True, 8)  # queued already: still taken after stop
    assert polled_get(inbox, stop) == (False, None)  # no timeout, but stopped


def test_polled_get_notices_a_stop_set_by_another_thread() -> None:
    inbox: queue.Queue[int] = queue.Queue()
    stop = threading.Event()
    threading.Timer(2 * POLL_S, stop.set).start()
    assert polled_get(inbox, stop) == (False, None)


def test_polled_put_waits_for_room_unless_stopped() -> None:
    outbox: queue.Queue[int] = queue.Queue(maxsize=1)
    assert polled_put(outbox, 1, lambda: False)
    threading.Timer(2 * POLL_S, outbox.get).start()
    assert polled_put(outbox, 2, lambda: False)  # room made by another thread
    assert not polled_put(outbox, 3, lambda: True)
    assert list(outbox.queue) == [2]


def test_join_all_is_bounded_and_names_what_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    quick = start_thread(lambda: None, "quick")
    stuck = start_thread(release.wait, "stuck", 30.0)
    assert stuck.daemon and stuck.name == "stuck"
    with caplog.at_level(logging.WARNING):
        assert join_all([quick, stuck], timeout=0.1, why=" (busy)") == ["stuck"]
    assert "stuck did not stop within 0 s (busy)" in caplog.text
    release.set()
    assert join_all([stuck]) == []


def test_join_all_skips_the_calling_thread() -> None:
    seen: list[list[str]] = []
    me = start_thread(lambda: seen.append(join_all([threading.current_thread()])), "self")
    me.join(30.0)
    assert seen == [[]]
