"""What the spec front-ends share: the plan of one call and the op registry
(``_plan``), attribute parsing (``_common``), and the plain canonical API
(``canonical``).  The dialects themselves are the modules
:mod:`convgrad.onednn`, :mod:`convgrad.openvino` and :mod:`convgrad.tf`."""
