"""Exceptions raised by convgrad.

Every rejected input raises :class:`ConvGradError` (a ``ValueError``) whose
message starts with the op name, names the attribute or input, shows the value
and states the rule that was broken.  Wrong array types and mixed dtypes raise
``TypeError``, as NumPy does.
"""

from __future__ import annotations


class ConvGradError(ValueError):
    """An attribute, shape or input broke a rule of the op's spec."""


class ConvGradTypeError(TypeError):
    """An input has an unsupported or mismatched dtype, or is not array-like."""


def fail(op: str, subject: str, value, rule: str) -> ConvGradError:
    """Build the standard error: ``op: subject = value: rule``."""
    return ConvGradError(f"{op}: {subject} = {_show(value)}: {rule}")


def _show(value) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return repr(value)
