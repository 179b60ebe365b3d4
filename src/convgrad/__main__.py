"""``python -m convgrad``: run the spec pages' examples (``make demo``)."""

from convgrad.examples import main

main()
