"""``python -m sparkguard`` runs the command-line interface."""

from sparkguard import cli

raise SystemExit(cli.main())
