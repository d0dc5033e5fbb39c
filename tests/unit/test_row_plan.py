"""Which kernel serves each row count (qcompile.nn.row_plan): decided once, before a model
generates. No kernel is built."""

import pytest

from qcompile.errors import ArgumentError
from qcompile.nn import row_plan


def test_the_smallest_kernel_at_least_as_large():
    plan = row_plan([1, 16])
    assert plan == {1: 1, **{r: 16 for r in range(2, 17)}}
    plan = row_plan([16, 4, 1, 8])  # tuned M = 4 and 8 join the decode and chunk kernels
    assert [plan[r] for r in (1, 2, 4, 5, 8, 9, 16)] == [1, 4, 4, 8, 8, 16, 16]


def test_fewer_counts_when_the_dense_path_starts_early():
    assert row_plan([1], counts=1) == {1: 1}  # prefill_rows=2: the prompt is dense
    assert row_plan([], counts=0) == {}       # prefill_rows=1: every call is dense


@pytest.mark.parametrize("rows, counts", [([1], 16), ([0, 16], 16), ([1, 17], 16), ([], 1)])
def test_rows_that_do_not_cover_the_counts(rows, counts):
    with pytest.raises(ArgumentError, match="kernel rows must lie in 1..16"):
        row_plan(rows, counts)
