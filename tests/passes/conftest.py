"""Fixtures shared by the pass tests."""
import gc
import weakref

import pytest


class Instances:
    """Every instance made, since ``record``, of the classes given to it, held by weak reference."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self._monkeypatch = monkeypatch
        self.made: list[weakref.ref] = []

    def record(self, cls: type) -> None:
        init, made = cls.__init__, self.made

        def recorded(obj, *args, **kwargs):
            init(obj, *args, **kwargs)
            made.append(weakref.ref(obj))

        self._monkeypatch.setattr(cls, "__init__", recorded)

    def alive(self) -> list:
        """The recorded instances still alive."""
        return [obj for obj in (ref() for ref in self.made) if obj is not None]


@pytest.fixture
def freed_by_refcounting(monkeypatch):
    """An :class:`Instances` for the test, with the cyclic garbage collector off until it ends: an
    instance held by a reference cycle stays alive (``alive()`` lists it), one that only
    reference counting frees is gone as soon as its last reference is."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield Instances(monkeypatch)
    finally:
        if enabled:
            gc.enable()
