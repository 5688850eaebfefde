"""Every ``sparkguard ... --help`` reads like a user's help: no reST markup, no developer notes."""

from __future__ import annotations

import re

import pytest

from sparkguard import cli

#: what only a developer should read: reST roles and literals, internal names
DEVELOPER_TEXT = [
    re.compile(r"``"),
    re.compile(r":(func|class|meth|mod|data):`"),
    re.compile(r"add_arguments|parser's name|this module|DESIGN\.md"),
]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", [None, *cli.SUBCOMMANDS])
def test_help_is_for_users(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    text = _help([] if command is None else [command], capsys)
    assert text.startswith("usage: sparkguard")
    for pattern in DEVELOPER_TEXT:
        assert not pattern.search(text), f"{pattern.pattern!r} in:\n{text}"
    if command is not None:
        assert "exit status:" in text


def test_rollback_and_inspect_say_where_credentials_come_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("rollback", "inspect"):
        text = _help([command], capsys)
        assert "SPARKGUARD_STORAGE_OPTIONS" in text
        assert "AWS_*" in text


def test_sidecar_help_says_what_each_flag_means_and_its_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = " ".join(_help(["sidecar"], capsys).split())
    flags = [
        action
        for action in cli.build_parser().subcommands["sidecar"]._actions
        if action.option_strings and action.dest != "help"
    ]
    assert len(flags) >= 15
    for action in flags:
        meaning, _, rest = (action.help or "").partition(" (default: ")
        assert len(meaning.split()) >= 3, f"{action.option_strings}: {action.help!r}"
        assert rest.split(";")[0], f"{action.option_strings} names no default"
        assert "env SPARKGUARD_" in rest
    assert "--port PORT the port executors send markers to (default: 26754;" in text
    assert "--allowed-roots ALLOWED_ROOTS comma-separated" in text
