"""pytest-xdist's loadgroup under pytest 9 (used by ``tests/conftest.py``; no imports of the
project, so ``tests/test_xdist_groups.py`` can load it into a pytester run by its path)."""

from __future__ import annotations

import pytest


def suffix_node_ids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each ``xdist_group`` test the ``@<group>`` node-id suffix loadgroup schedules by.

    pytest-xdist 3.8 writes the suffix to ``item._nodeid``, which pytest 9 no longer reads (a
    node's id is ``item._id``): its loadgroup then silently schedules every test on its own, and
    both workers start a kube-apiserver. This does what xdist means to, for either pytest, and
    only under ``--dist loadgroup``.
    """
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers only
        return
    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        if not names or "@" in item.nodeid.rsplit("]", 1)[-1]:
            continue  # no group, or xdist already added the suffix
        nodeid = f"{item.nodeid}@{'_'.join(sorted(names))}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(nodeid)
        else:  # pytest < 9
            item._nodeid = nodeid
