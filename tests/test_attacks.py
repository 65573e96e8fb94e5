"""No silent wrongness: each attack of tests/harness/attack_table.py through the real CLI.

Per case (see the module docstring of tests/harness/attack_table.py for the exact rules): the
exit status, the first line of the message the user sees, no traceback, and nothing
lost (a published run accounts for every row or file; any other publishes nothing).
``python tests/harness/attack_table.py`` prints the same cases as a table.
"""

import pytest

from tests.harness.attack_table import CASES, run_case


@pytest.mark.e2e
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_attack(case, tmp_path):
    outcome = run_case(case, tmp_path)
    if outcome.skip_reason:
        pytest.skip(outcome.skip_reason)
    assert outcome.ok, outcome.describe()
    assert outcome.nothing_lost, outcome.describe()
    if outcome.run.exit == 0 and outcome.published:
        assert outcome.n_in == outcome.written + outcome.dead + outcome.skipped, outcome.describe()
