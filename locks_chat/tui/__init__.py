"""The Textual app: ``locks-chat book.pdf``. Importing this package starts nothing (no engine, no vLLM)."""
