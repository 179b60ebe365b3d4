"""Spec front-ends: thin, spec-named, each mapping to geometry + one kernel call."""
