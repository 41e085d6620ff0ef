"""The CLI prints messages, warnings, notes and table cells literally: user text and exception messages quoting
``[batch]``, ``[bold]`` or ``[1, 2]`` are not read as rich markup (which would drop the bracketed text or restyle the
rest of the line)."""

from __future__ import annotations

import io

import pytest
import typer
from rich.table import Table

from conftest import flat, run_cli

import wattcast.cli as cli


def test_error_keeps_bracketed_user_text():
    r = run_cli("predict", "--model", "gpt2[batch]", "--device", "H100")
    assert r.returncode == 2
    assert "error: gpt2[batch]: not a file and not a built-in model" in flat(r.stderr)
    r = run_cli("devices", "H100[bold]x")
    assert r.returncode == 2 and "unknown device 'H100[bold]x'" in flat(r.stderr)
    r = run_cli("predict", "--model", "gpt2", "--device", "H100", "--dtype", "[batch]")
    assert r.returncode == 2 and "unknown dtype '[batch]'" in flat(r.stderr)


@pytest.fixture
def stderr_buf(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(cli, "err", cli.Console(file=buf, width=300, color_system=None))
    return buf


def test_fail_warnings_and_tables_are_literal(stderr_buf):
    with pytest.raises(typer.Exit):
        cli._fail("shape [batch, 1024] vs [1, 2] in [red]x[/red]")
    cli._print_warnings(["layer [bold]3 has [seq] tokens"])
    out = stderr_buf.getvalue()
    assert "error: shape [batch, 1024] vs [1, 2] in [red]x[/red]" in out
    assert "warning: layer [bold]3 has [seq] tokens" in out
    # table cells and titles (names from user files, task names) on the tables' console
    buf = io.StringIO()
    con = cli.Console(file=buf, width=300, color_system=None)
    t = Table(title="task [a]")
    t.add_column("model")
    t.add_row("my[bold]model")
    con.print(t)
    assert "task [a]" in buf.getvalue() and "my[bold]model" in buf.getvalue()
