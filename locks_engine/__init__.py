from locks_engine.config import LocksConfig

__all__ = ["LocksConfig"]
