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
