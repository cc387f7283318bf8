"""What the benchmarks under ``samples/`` and the tests share: GPU timing, engine probes and the device-counters
hook, the no-prefix-walk scheduler, result files. Installed as ``locks_bench`` (``pyproject.toml``'s
``package-dir``), so scripts import it without touching ``sys.path``. Importing it imports neither vLLM nor the
app's dependencies."""
