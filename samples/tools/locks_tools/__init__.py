"""What the tools under ``samples/tools/`` and their tests share: the ingestion fuzzer's document generators,
mutators, checks and worker (``fuzz_docs``, ``fuzz_pdf``, ``fuzz_mutate``, ``fuzz_check``, ``fuzz_run``). Installed
as ``locks_tools`` (``pyproject.toml``'s ``package-dir``). Importing it imports neither vLLM nor the app's
dependencies."""
