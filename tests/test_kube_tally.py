"""The real-apiserver tier is counted in the output, and a skipped bench test fails the run."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# Only the tally of tests.kubebench.fixtures: its build hook would run build.sh under
# pytester's temporary HOME, i.e. a cold build.
CONFTEST = """
from tests.kubebench.fixtures import _KubeTally

def pytest_configure(config):
    config.addinivalue_line("markers", "kube: on the bench")
    config.pluginmanager.register(_KubeTally(), "kubebench-tally")
"""

ARGS = ("-p", "no:cacheprovider", "-o", "asyncio_default_fixture_loop_scope=function")


def test_skipped_bench_test_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.kube
        def test_skipped():
            pytest.skip("no toolchain")

        @pytest.mark.kube
        def test_passes():
            pass

        def test_not_on_the_bench():
            pass
        """
    )
    result = pytester.runpytest_inprocess(*ARGS)
    result.stdout.fnmatch_lines(["*real kube-apiserver tests: 1 passed, 1 skipped*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_bench_count_is_reported(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.kube
        def test_passes():
            pass
        """
    )
    result = pytester.runpytest_inprocess(*ARGS)
    result.stdout.fnmatch_lines(["*real kube-apiserver tests: 1 passed"])
    assert result.ret == pytest.ExitCode.OK


def test_a_deselected_real_tier_is_said(pytester: pytest.Pytester) -> None:
    """``-m "not kube"`` runs no bench test: the summary says how many were left out."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.kube
        def test_on_the_bench():
            pass

        @pytest.mark.kube
        def test_also_on_the_bench():
            pass

        def test_not_on_the_bench():
            pass
        """
    )
    result = pytester.runpytest_inprocess(*ARGS, "-m", "not kube")
    result.stdout.fnmatch_lines(["*real kube-apiserver tests: 2 deselected*"])
    assert result.ret == pytest.ExitCode.OK


def test_a_bench_test_gets_the_build_budget_until_a_bench_started(
    pytester: pytest.Pytester,
) -> None:
    """The build runs in the bench fixture of whichever worker runs the bench tests, so until a
    bench started in the process a bench test's timeout is longer by the build's budget; every
    other test keeps its limit."""
    pytester.makeconftest(
        "pytest_plugins = ['tests.kubebench.fixtures']\n"
        "import tests.kubebench.fixtures as f\n"
        "f.BUILD_BUDGET_SECONDS = 5.0\n"
    )
    pytester.makepyfile(
        """
        import time
        import pytest

        @pytest.mark.kube
        def test_building():  # no bench started yet: 1 s + the budget
            time.sleep(2)

        def test_plain():  # 1 s
            time.sleep(2)
        """
    )
    result = pytester.runpytest_inprocess(*ARGS, "--timeout=1", "-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*Failed: Timeout (>1.0s) from pytest-timeout.", "FAILED *::test_plain*"]
    )


def test_an_expected_failure_is_no_skip(pytester: pytest.Pytester) -> None:
    """A strict xfail on the bench (a known gap, e.g. waiting for another branch) is counted
    apart and keeps the run green; a skip still fails it."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.kube
        @pytest.mark.xfail(strict=True, reason="needs another branch")
        def test_known_gap():
            assert False

        @pytest.mark.kube
        def test_passes():
            pass
        """
    )
    result = pytester.runpytest_inprocess(*ARGS)
    result.stdout.fnmatch_lines(["*real kube-apiserver tests: 1 passed, 1 xfailed*"])
    assert result.ret == pytest.ExitCode.OK


class _Item:
    """What ``bench_group`` reads of a collected test."""

    def __init__(self, nodeid: str, *fixturenames: str) -> None:
        self.nodeid = nodeid
        self.fixturenames = fixturenames


def test_every_test_of_a_node_shares_one_group_whichever_operator_it_runs() -> None:
    """One kubelet and one pod network at a time: Kubeflow's node cluster and the Apache
    operator's node bench go to one worker, one after the other."""
    from tests.kubebench.fixtures import bench_group

    groups = {
        bench_group(_Item("tests/e2e/a.py::t", "kube_node_cluster")),  # type: ignore[arg-type]
        bench_group(_Item("tests/e2e/b.py::t", "apache_node_bench")),  # type: ignore[arg-type]
    }
    assert groups == {"kube-node"}
    plain = bench_group(_Item("tests/e2e/c.py::t", "apache_operator_bench"))  # type: ignore[arg-type]
    assert plain == "kube-apache"
