"""The drain switch (raygen.run.drain): the first signal asks for a drain, a second stops at once, and the
handlers that were there before come back. The end-to-end behaviour is in tests/test_durability.py."""

from __future__ import annotations

import os
import signal

import pytest

from raygen.run.drain import SIGNALS, Drain, StopNow


@pytest.mark.parametrize("sig", SIGNALS)
def test_first_signal_requests_a_drain_second_stops_at_once(sig):
    before = {s: signal.getsignal(s) for s in SIGNALS}
    with Drain(timeout_s=3600) as drain:
        assert not drain.requested
        os.kill(os.getpid(), sig)
        assert drain.requested and drain.signal_name == signal.Signals(sig).name
        assert not drain.expired
        with pytest.raises(StopNow):
            os.kill(os.getpid(), signal.SIGTERM)
    assert {s: signal.getsignal(s) for s in SIGNALS} == before


def test_install_again_wins_over_a_handler_set_meanwhile_and_exit_restores_the_first():
    before = signal.getsignal(signal.SIGTERM)
    with Drain(timeout_s=0) as drain:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what ray.init does to SIGTERM
        drain.install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert drain.requested and drain.expired  # a zero timeout: in-flight sessions get no time
    assert signal.getsignal(signal.SIGTERM) == before
