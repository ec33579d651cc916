"""The compiled solves of Stages II and III, made while Stage I runs (:class:`AheadOfTime`;
started by ``gflow.dynamics._flow.prepare_stages``)."""

from __future__ import annotations

import threading


class AheadOfTime:
    """The compiled solves of Stages II and III, made in a background thread while Stage I runs (a
    cold start's head start; :func:`gflow.dynamics._flow.prepare_stages`). Stage III's shapes and static options do not
    depend on the earlier stages; Stage II's heads are Stage I's selection, predicted here as the set
    whose selector weight grows fastest at the start (``argmax −∂L̂/∂C_S / C_S``, the first row of
    the trajectory): when Stage I selects another set, Stage II compiles its own program as before.
    The programs are the ones the stages then call (:func:`gflow._util.prepare_call`): nothing
    changes but when they are compiled."""

    def __init__(self, heads: tuple[int, ...]):
        self.heads = heads
        self.ready = {"II": threading.Event(), "III": threading.Event()}
        self.thread: threading.Thread | None = None

    def join(self) -> None:
        """Wait for the thread (the integration does before it returns or raises: nothing of it
        outlives the run, e.g. the command line's settings, restored when it ends)."""
        if self.thread is not None:
            self.thread.join()

    def wait(self, name: str, heads: tuple[int, ...]) -> None:
        """Before stage `name`'s first solve: wait for its program when it is the one prepared."""
        if name in self.ready and (name == "III" or heads == self.heads):
            self.ready[name].wait()
