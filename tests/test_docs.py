"""The examples in the public docstrings are doctests."""

import doctest

import numpy as np
import pytest

from convgrad import onednn, openvino, registry, settings, tf


@pytest.mark.parametrize("module", [onednn, openvino, tf, settings, registry],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, extraglobs={"np": np},
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 2
