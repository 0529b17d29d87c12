"""`%dist start --strategy parameter_server --ps N`: bad combinations are refused before any
engine starts (the running case is notebooks/06-parameter-server.ipynb's test)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from nbdist.magics import current_cluster


@pytest.mark.parametrize(
    "line, message",
    [
        ("start -n 3 --ps 1", "--ps 1 is for --strategy parameter_server"),
        ("start --strategy parameter_server -n 1 --ps 1", "leaves no worker"),
        ("start --strategy parameter_server -n 3 --ps 0", "at least one ps task"),
    ],
)
def test_bad_parameter_server_starts_are_usage_errors(ipython, line, message):
    with pytest.raises(UsageError, match=message):
        ipython.run_line_magic("dist", line)
    assert current_cluster() is None
