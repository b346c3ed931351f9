"""The mutation check's list follows the code: each entry names code that exists once.

(`scripts/mutation_check.py` itself takes about 25 minutes; this keeps its list
from going stale, e.g. after a reformat, in every test run.)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_mutation_names_code_that_exists_once() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import mutation_check

    stale = [
        name for name, rel, old, _ in mutation_check.MUTATIONS if (ROOT / rel).read_text().count(old) != 1
    ]
    assert not stale, f"update these entries of scripts/mutation_check.py: {stale}"
    assert len(mutation_check.MUTATIONS) >= 33
