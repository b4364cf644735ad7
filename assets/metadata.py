"""Phase results as Dagster metadata: numbers as they are, PNG pictures as inline Markdown images."""

from __future__ import annotations

import base64

import dagster as dg

from workers.coordinator.phases import PhaseResult


def png_markdown(png: bytes, caption: str) -> dg.MetadataValue:
    """An inline PNG for the Dagster UI (Markdown with a data: URL)."""
    data = base64.b64encode(png).decode()
    return dg.MetadataValue.md(f"**{caption}**\n\n![{caption}](data:image/png;base64,{data})")


def materialize(result: PhaseResult) -> dg.MaterializeResult:
    """The phase's numbers, tables, paths and pictures as materialization metadata, its checks as check results."""
    meta: dict = dict(result.metadata)
    meta.update({name: dg.MetadataValue.md(table) for name, table in result.tables.items()})
    meta.update({name: dg.MetadataValue.path(path) for name, path in result.paths.items()})
    meta.update({name: png_markdown(png, caption) for name, (png, caption) in result.pictures.items()})
    checks = [
        dg.AssetCheckResult(check_name=name, passed=passed, metadata=check_meta)
        for name, (passed, check_meta) in result.checks.items()
    ]
    return dg.MaterializeResult(metadata=meta, check_results=checks or None)
