"""What the studies under ``samples/studies/`` and their tests share: the offline fidelity measure on captured decode
steps (``fidelity``), the selection-cost study's designs, measures and report (``selection_cost``,
``selection_study``, ``selection_report``, ``selection_policy``), the mass a budget keeps (``mass_budget``) and the
RULER failure reading (``ruler_failure``). Installed as ``locks_studies`` (``pyproject.toml``'s ``package-dir``);
it builds on ``locks_bench`` (captures, result files). Importing it imports neither vLLM nor the app's
dependencies."""
