"""Random but reproducible valid geometries, shared by the kernel and adjoint tests."""

import numpy as np


def random_case(seed: int, *, max_rank: int = 3, small: bool = True) -> dict:
    """One valid canonical convolution problem (explicit, possibly asymmetric pads)."""
    rng = np.random.default_rng(seed)
    r = int(rng.integers(1, max_rank + 1))
    groups = int(rng.choice([1, 1, 2, 3]))
    cg, og = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    if rng.random() < 0.2:                       # depthwise, possibly with a multiplier
        cg, groups = 1, int(rng.integers(2, 6))
    kernel = tuple(int(v) for v in rng.integers(1, 4 if r < 3 else 3, r))
    strides = tuple(int(v) for v in rng.integers(1, 4, r))
    dilations = tuple(int(v) for v in rng.integers(1, 3 if r < 3 else 2, r))
    pads_begin = tuple(int(v) for v in rng.integers(0, 3, r))
    pads_end = tuple(int(v) for v in rng.integers(0, 3, r))
    top = 9 if r == 1 else (7 if r == 2 else 5)
    in_sizes = []
    for k, d, b, e in zip(kernel, dilations, pads_begin, pads_end):
        ke = (k - 1) * d + 1
        lo = max(1, ke - b - e)
        in_sizes.append(int(rng.integers(lo, max(lo, top) + 1)))
    out_sizes = tuple((L + b + e - ((k - 1) * d + 1)) // s + 1 for L, k, s, d, b, e in
                      zip(in_sizes, kernel, strides, dilations, pads_begin, pads_end))
    return dict(n=int(rng.integers(1, 3)), c=cg * groups, o=og * groups, groups=groups,
                in_sizes=tuple(in_sizes), kernel=kernel, out_sizes=out_sizes, strides=strides,
                dilations=dilations, pads_begin=pads_begin, pads_end=pads_end)


def case_id(case: dict) -> str:
    return (f"{len(case['kernel'])}d-g{case['groups']}-c{case['c']}o{case['o']}"
            f"-k{'x'.join(map(str, case['kernel']))}-s{'x'.join(map(str, case['strides']))}"
            f"-d{'x'.join(map(str, case['dilations']))}"
            f"-p{'x'.join(map(str, case['pads_begin']))}_{'x'.join(map(str, case['pads_end']))}")


def arrays(case: dict, rng, dtype=np.float64):
    x = rng.standard_normal((case["n"], case["c"], *case["in_sizes"]))
    w = rng.standard_normal((case["o"], case["c"] // case["groups"], *case["kernel"]))
    dy = rng.standard_normal((case["n"], case["o"], *case["out_sizes"]))
    return x.astype(dtype), w.astype(dtype), dy.astype(dtype)


def attrs(case: dict) -> dict:
    return {k: case[k] for k in ("strides", "pads_begin", "pads_end", "dilations", "groups")}


def caller_arrays(case: dict, rng, dtype=np.float32, channels_last: bool = False,
                  xio_weights: bool = False):
    """x, w, dy in NCX/OIX shapes as a caller holds them: channels-last callers'
    data are NCX views of channels-last memory; ``xio_weights``: the weights an
    OIX view of XIO memory (as oneDNN / TensorFlow callers hold them)."""
    def data(n, c, sizes):
        a = rng.standard_normal((n, *sizes, c)).astype(dtype)
        return np.moveaxis(a, -1, 1) if channels_last else np.ascontiguousarray(
            np.moveaxis(a, -1, 1))
    x = data(case["n"], case["c"], case["in_sizes"])
    dy = data(case["n"], case["o"], case["out_sizes"])
    w = rng.standard_normal((case["o"], case["c"] // case["groups"], *case["kernel"]))
    if xio_weights:
        w = np.moveaxis(np.moveaxis(np.ascontiguousarray(
            np.moveaxis(np.moveaxis(w, 0, -1), 0, -2)), -2, 0), -1, 0)
    return x, w.astype(dtype), dy


def reference_results(case: dict, x, w, dy) -> tuple:
    """The float64 forward, weight and data gradients of ``case`` (naive loops)."""
    import naive
    args = dict(strides=case["strides"], dilations=case["dilations"],
                pads_begin=case["pads_begin"], groups=case["groups"])
    x64, w64, dy64 = (np.asarray(a, np.float64) for a in (x, w, dy))
    return (naive.forward(x64, w64, case["out_sizes"], **args),
            naive.wgrad(x64, dy64, case["kernel"], **args),
            naive.dgrad(w64, dy64, case["in_sizes"], **args))
