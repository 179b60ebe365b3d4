"""``python -m convgrad``: the ``convgrad`` command."""

from convgrad.cli import main

main()
