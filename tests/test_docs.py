"""The examples in the public docstrings are doctests."""

import doctest

import numpy as np
import pytest

from convgrad import onednn, openvino, tf


@pytest.mark.parametrize("module", [onednn, openvino, tf], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, extraglobs={"np": np},
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 2
