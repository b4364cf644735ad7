"""How `spotlight bench` commands print their figures: JSON Lines with --json, else a text report."""

from __future__ import annotations

import json

import typer


def emit_json(record: dict) -> None:
    """One JSON object per line on stdout (JSON Lines), as every command's --json prints."""
    typer.echo(json.dumps(record, sort_keys=True))


def show(figures: dict, as_json: bool, as_text) -> None:
    """A bench's figures: one JSON object, or its text report."""
    if as_json:
        emit_json(figures)
    else:
        typer.echo(as_text(figures))
