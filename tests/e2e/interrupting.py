"""Ctrl-C at a chosen moment, for the tests of tclang's helper processes."""


def interrupt_next_wait(monkeypatch, conn) -> None:
    """The next wait for a reply on `conn` (a helper process's pipe) raises
    KeyboardInterrupt, as Ctrl-C after the request was sent would; later waits are real."""
    real_poll = conn.poll

    def interrupted_once(timeout):
        monkeypatch.setattr(conn, "poll", real_poll)
        raise KeyboardInterrupt

    monkeypatch.setattr(conn, "poll", interrupted_once)
