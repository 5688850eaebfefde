"""benchmarks/writer.py's estimator: the marginal cost is the least-squares slope through each
writer's best time at each size; and its flags of the procedure. Functional only: nothing here
is timed."""

from __future__ import annotations

import pytest

from tests.test_benchmark_commit_protocol import load, run_benchmark


def test_slope_of_exact_points_is_their_cost_per_row() -> None:
    writer = load("writer")
    points = [(2_000_000, 0.5 + 2e-7 * 2_000_000), (4_000_000, 1.3), (8_000_000, 2.1)]
    assert writer.slope(points) == pytest.approx(2e-7)


def test_slope_evens_out_one_noisy_size() -> None:
    """One size 0.1 s off moves a two-point difference by 0.1 s / span; three sizes by less."""
    writer = load("writer")
    exact = 1e-7
    noisy = [(2_000_000, 0.2), (4_000_000, 0.4 + 0.1), (8_000_000, 0.8)]
    assert abs(writer.slope(noisy) - exact) < abs((0.5 - 0.2) / 2_000_000 - exact)


def test_slope_needs_two_sizes() -> None:
    writer = load("writer")
    with pytest.raises(ValueError, match="two different sizes"):
        writer.slope([(1_000, 1.0), (1_000, 2.0)])


@pytest.mark.parametrize(("flag", "value"), [("--repeats", "0"), ("--warm-ups", "0")])
def test_repeats_and_warm_ups_below_one_are_refused_naming_the_flag(flag: str, value: str) -> None:
    result = run_benchmark("writer", flag, value)
    assert result.returncode == 2
    assert f"{flag} {value}" in result.stderr
    assert "use at least 1 of each" in result.stderr
