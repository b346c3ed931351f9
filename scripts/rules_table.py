"""Print the tables of the simulator's capture rules and fault kinds (docs/simulator.md).

Usage: PYTHONPATH=src python scripts/rules_table.py   (tests/test_rules.py checks the page holds them)
"""

from cudagraphs.backends import base
from cudagraphs.backends.sim import FAULTS, RULES


def rules_table() -> str:
    names = base.ERROR_NAMES
    head = (
        "| call | on | refused in (capturing thread) | code | invalidates the capture | "
        "refused in (another thread) | invalidates it in |\n|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(
        f"| `{r.call}` | {r.target} | {', '.join(r.refused_in) or 'none (legal)'} | "
        f"{names[r.code] if r.refused_in or r.other_refused_in else '—'} | "
        f"{'yes' if r.invalidates else 'no'} | {', '.join(r.other_refused_in) or 'none'} | "
        f"{', '.join(r.other_invalidates_in) or 'none'} |"
        for r in RULES
    )


def faults_table() -> str:
    head = "| kind | call | code |\n|---|---|---|\n"
    return head + "\n".join(
        f"| `{k}` | `{c}` | {base.ERROR_NAMES[code]} |" for k, (c, code) in FAULTS.items()
    )


if __name__ == "__main__":
    print(rules_table())
    print()
    print(faults_table())
