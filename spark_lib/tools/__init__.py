"""The command-line tools built on the library: what ``sparkguard <command>`` runs.

``rollback``, ``inspect`` and ``compact`` (:mod:`commands`), ``bundle`` (:mod:`bundle`) and the
local demonstration (:mod:`demo`, with its jobs :mod:`demo_job` and :mod:`demo_plain_job`, run
by ``spark-submit`` or ``python -m``). Nothing else in the library imports them (the operator
reads the bundle's layout from :mod:`bundle`).
"""
