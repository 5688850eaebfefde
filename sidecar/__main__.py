"""``python -m sparkguard.sidecar`` runs the marker sidecar."""

from sparkguard.sidecar import cli

raise SystemExit(cli.main())
