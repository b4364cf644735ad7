"""`python -m pipelines ...`: the `spotlight` command line (pipelines/cli.py) without the console script."""

from pipelines.cli import app

app(prog_name="spotlight")
