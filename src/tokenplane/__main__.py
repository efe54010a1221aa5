"""``python -m tokenplane`` is the ``tokenplane`` command."""

from tokenplane.cli import app

app()
