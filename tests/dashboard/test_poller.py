"""The background poller: it keeps the latest answer, and stops by itself when unread."""

import itertools

from api_servers import wait_for

from dashboard.poller import Poller


def test_poller_keeps_the_latest_answer_until_stopped() -> None:
    counter = itertools.count()
    poller = Poller(lambda: next(counter), every_s=0.01, idle_s=60.0).start()
    wait_for(lambda: poller.answers >= 3, what="three answers")
    latest = poller.read()
    assert latest is not None and latest >= 2
    poller.stop()
    assert not poller.alive
    assert poller.read() == poller.answers - 1  # the last fetch's answer


def test_an_unread_poller_stops_by_itself() -> None:
    poller = Poller(lambda: "answer", every_s=0.01, idle_s=0.2).start()
    wait_for(lambda: not poller.alive, what="the unread poller to stop")
    assert poller.read() == "answer" and poller.answers >= 1
