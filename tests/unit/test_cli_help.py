"""Every command's --help renders: argparse %-formats help text, so one stray '%' in an
option's description used to crash `swarm agent --help` with a traceback."""

from __future__ import annotations

import argparse

import pytest

from swarm.cli import build_parser


def _commands() -> list[str]:
    parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(subs[0].choices)


@pytest.mark.parametrize("command", _commands())
def test_help_renders(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and command in out


def test_agent_help_lists_every_cli_option(capsys: pytest.CaptureFixture[str]) -> None:
    from swarm.options import OPTIONS

    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "--help"])
    out = capsys.readouterr().out
    for opt in OPTIONS:
        if opt.cli and opt.name != "socket":
            assert f"--{opt.name}" in out
    assert "PSI some avg10 (%)" in out and "--no-nvml" in out
