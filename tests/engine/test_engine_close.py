"""``LocksEngine.close`` gives vLLM's engine core time to exit on a busy machine: killed after vLLM's own 5 s,
it left its ``vllm_dist_*`` FileStore file in the temporary folder (seen as a flaky ``test_ask_real_engine``)."""

import pytest

from locks_engine.engine import SHUTDOWN_TIMEOUT_S, LocksEngine


class Core:
    def __init__(self, calls):
        self.calls = calls

    def shutdown(self, timeout=None):
        self.calls.append(("core", timeout))


class OldCore:
    """an engine core client whose shutdown takes no timeout"""

    def __init__(self, calls):
        self.calls = calls

    def shutdown(self):
        self.calls.append(("core", None))


class Engine:
    def __init__(self, core):
        self.engine_core = core

    def shutdown(self):
        self.engine_core.calls.append(("engine", None))


@pytest.mark.parametrize("core,expected", [(Core, [("core", SHUTDOWN_TIMEOUT_S), ("engine", None)]),
                                           (OldCore, [("engine", None)])], ids=["timeout", "no_timeout_parameter"])
def test_close_gives_the_engine_core_its_time(core, expected):
    calls = []
    engine = LocksEngine.__new__(LocksEngine)
    engine.llm, engine._tmp = Engine(core(calls)), None
    engine.close()
    assert calls == expected and engine.llm is None
    assert SHUTDOWN_TIMEOUT_S > 5
    engine.close()  # a second close does nothing
    assert calls == expected
