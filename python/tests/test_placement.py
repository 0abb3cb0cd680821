"""ghtier.torch.placement: scoping of the calling thread's tier (the CPU-testable parts)."""
import threading

import pytest

torch = pytest.importorskip("torch")
import ghtier.torch as gt  # noqa: E402


def test_outside_any_scope_is_auto():
    assert gt.current_placement() == "auto"


def test_nesting_restores_each_level():
    with gt.placement("host"):
        assert gt.current_placement() == "host"
        with gt.placement("hbm"):
            assert gt.current_placement() == "hbm"
            with gt.placement("auto"):
                assert gt.current_placement() == "auto"
            assert gt.current_placement() == "hbm"
        assert gt.current_placement() == "host"
    assert gt.current_placement() == "auto"


def test_exception_restores_the_previous_tier():
    with pytest.raises(KeyError):
        with gt.placement("host"):
            raise KeyError("x")
    assert gt.current_placement() == "auto"


def test_decorator_and_reentrant_instance():
    host = gt.placement("host")

    @host
    def inner(depth):
        assert gt.current_placement() == "host"
        if depth:
            with gt.placement("hbm"):
                inner(depth - 1)  # the same instance entered again inside another scope
                assert gt.current_placement() == "hbm"
        return gt.current_placement()

    assert inner(3) == "host"
    assert gt.current_placement() == "auto"


def test_per_thread():
    seen = {}
    entered, release = threading.Event(), threading.Event()

    def other():
        with gt.placement("hbm"):
            seen["inside"] = gt.current_placement()
            entered.set()
            release.wait(30)

    t = threading.Thread(target=other)
    with gt.placement("host"):
        t.start()
        assert entered.wait(30)
        assert gt.current_placement() == "host"  # the other thread's scope does not leak here
        release.set()
        t.join(30)
    assert seen["inside"] == "hbm"
    assert gt.current_placement() == "auto"


@pytest.mark.parametrize("bad", ["HBMx", "gpu", "", 1, None])
def test_invalid_tier_names_the_choices(bad):
    with pytest.raises(ValueError, match="not one of 'auto', 'hbm', 'host'"):
        gt.placement(bad)


def test_case_insensitive():
    with gt.placement("HOST"):
        assert gt.current_placement() == "host"
