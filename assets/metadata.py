"""Phase results as Dagster metadata: numbers as they are, tables as table metadata, paths as paths, PNG pictures
as inline Markdown images."""

from __future__ import annotations

import base64

import dagster as dg

from workers.coordinator.phases import PhaseResult


def png_markdown(png: bytes, caption: str) -> dg.MetadataValue:
    """An inline PNG for the Dagster UI (Markdown with a data: URL)."""
    data = base64.b64encode(png).decode()
    return dg.MetadataValue.md(f"**{caption}**\n\n![{caption}](data:image/png;base64,{data})")


_COLUMN_TYPES = {bool: "bool", int: "int", float: "float", str: "string"}


def table(rows: list[dict]) -> dg.MetadataValue:
    """Rows as a table in the Dagster UI, its schema (column names and types) from the first row."""
    columns = [
        dg.TableColumn(name, type=_COLUMN_TYPES.get(type(value), "string")) for name, value in (rows or [{}])[0].items()
    ]
    return dg.MetadataValue.table(records=[dg.TableRecord(row) for row in rows], schema=dg.TableSchema(columns=columns))


def materialize(result: PhaseResult) -> dg.MaterializeResult:
    """The phase's numbers, tables, paths and pictures as materialization metadata, its checks as check results."""
    meta: dict = dict(result.metadata)
    meta.update({name: table(rows) for name, rows in result.tables.items()})
    meta.update({name: dg.MetadataValue.path(path) for name, path in result.paths.items()})
    meta.update({name: png_markdown(png, caption) for name, (png, caption) in result.pictures.items()})
    checks = [
        dg.AssetCheckResult(check_name=name, passed=passed, metadata=check_meta)
        for name, (passed, check_meta) in result.checks.items()
    ]
    return dg.MaterializeResult(metadata=meta, check_results=checks or None)
