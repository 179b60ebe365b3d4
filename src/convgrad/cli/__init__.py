"""The ``convgrad`` command (also ``python -m convgrad``).

Subcommands live in :mod:`convgrad.cli.app` (typer + rich, imported only when
the command runs, never by ``import convgrad``); the work they do lives in
modules without any terminal code: :mod:`.problem` (benchdnn problem strings),
:mod:`.runner` (run-problem / check), :mod:`.ir` (OpenVINO IR), :mod:`.vectors`
(conformance vectors) and :mod:`.demo` (the training demo).
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``convgrad`` script."""
    from .app import run
    run(argv)
