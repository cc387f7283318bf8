"""Where the tests find the repository's own files (the samples, the committed fixtures), wherever a test file sits."""

from pathlib import Path

#: the repository's root
REPO = Path(__file__).resolve().parents[2]
#: small committed fixtures (``tests/fixtures``)
FIXTURES = REPO / "tests" / "fixtures"
