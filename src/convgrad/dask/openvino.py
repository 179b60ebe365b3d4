"""OpenVINO ops on Dask arrays: :mod:`convgrad.openvino`'s functions, same names and
attributes, Dask arrays in and out."""

from .. import openvino as _spec
from ._front import dialect_functions

globals().update(dialect_functions(_spec))
__all__ = list(_spec.__all__)
