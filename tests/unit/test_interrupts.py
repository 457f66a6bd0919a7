"""tuner.interrupts: a first signal stops the run even where its KeyboardInterrupt was lost."""

import os
import signal
import time

import pytest

from tuner import interrupts


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the lost raise, by design
def test_a_signal_whose_interrupt_was_lost_still_stops_the_next_step_of_a_trial():
    # Python prints "Exception ignored" and goes on when the handler's KeyboardInterrupt is
    # raised inside a finaliser; the trial then measured on for 60 s after a SIGINT at warm-up.
    from tuner.sequence import checked

    interrupts.install()
    try:
        said = []
        phase = checked(said.append)
        phase("warm-up 1/2")

        class Finaliser:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here, inside __del__: its raise is ignored

        Finaliser()
        assert interrupts.stopping()
        with pytest.raises(KeyboardInterrupt):
            phase("warm-up 2/2")
        assert said == ["warm-up 1/2"]
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        interrupts._state.update(stopping=False, deferring=0, pending=False)
