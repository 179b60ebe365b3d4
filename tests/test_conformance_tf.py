"""Conformance with TensorFlow 2.21 (CPU): the TF dialect (``convgrad.tf``)
against TensorFlow's own ops.

Every case calls convgrad with exactly the arguments the TensorFlow op takes
(same layout, dtype, strides/dilations/padding spelling) and compares values,
shape and dtype with what TensorFlow computes.  TensorFlow decides the
semantics; only *which* TensorFlow computation is used depends on what its CPU
kernels accept (see /work/probe/tf/REPORT.md):

- float64 and ``padding="EXPLICIT"`` run the Eigen kernels: NHWC only, no
  dilation > 1, no groups, equal row/col strides for depthwise;
- float32 / float16 / bfloat16 with SAME/VALID run the oneDNN kernels
  (``TF_ENABLE_ONEDNN_OPTS=1``, the default): NCHW, dilation and, for Conv2D,
  groups work; Conv3D has no groups and no EXPLICIT padding at all;
- the raw depthwise backprop kernels never apply dilation (SAME silently
  returns the dilation-1 answer), so a dilated depthwise case never uses them.

For each case the first feasible route of :func:`routes` is the reference:

``raw``        the TensorFlow op itself, same arguments, same dtype and layout
               (list-of-pairs padding through TF's own wrappers where they take it);
``raw-nhwc``   the same op on transposed (channels-last) tensors, for NCHW cases
               the Eigen kernels refuse;
``raw-f32``    the op in float32 (oneDNN), for float64 cases that need dilation
               or groups;
``tape``       ``tf.GradientTape`` of the forward ops (``tf.nn.convolution``,
               ``tf.nn.depthwise_conv2d``) in float64: explicit pads as
               ``tf.pad`` + VALID, dilation through TF's space-to-batch, strides
               with dilation as a strided slice of the VALID stride-1 output,
               groups (which no CPU gradient kernel of Conv3D has) as one forward
               conv per contiguous channel block;
``dw-as-grouped-f32``   dilated depthwise with SAME and stride > 1 (which neither
               the depthwise kernels nor the forward wrapper compute): TF's grouped
               Conv2D (groups = in_channels, filter ``[*K, 1, C*M]``) on oneDNN;
``raw-f32-per-group``   grouped 3-D with SAME, dilation and stride: Conv3D in
               float32 once per channel block.

Data are quarter-integers in [-2, 2], so every float32/float64 result here is
exact whatever the summation order: the float32 and float64 routes give the
same numbers, and float16/bfloat16 only differ by the final rounding.

Bad inputs are compared only on the Eigen path (float64, NHWC), where TF raises
cleanly; several of them abort the whole process under oneDNN.
"""

import os
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from convgrad import ConvGradError
from convgrad import tf as cg_tf
from convgrad.dtypes import bfloat16
from conftest import CONFORMANCE_SCALE, assert_close, import_peer

pytestmark = pytest.mark.peers

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")     # TF's default; pinned, as documented
tf = import_peer("tensorflow")

F64, F32, F16, BF16 = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16),
                       bfloat16)
DT_NAME = {F64: "f64", F32: "f32", F16: "f16", BF16: "bf16"}
TF_DT = {F64: tf.float64, F32: tf.float32, F16: tf.float16, BF16: tf.bfloat16}
CL = {1: "NWC", 2: "NHWC", 3: "NDHWC"}          # channels last
CF = {1: "NCW", 2: "NCHW", 3: "NCDHW"}          # channels first
EXPLICITISH = ("EXPLICIT", "pairs", "spatial-pairs")

# op: (spatial rank, gradient, depthwise, tf.raw_ops name)
OPS = {
    "conv2d_backprop_filter": (2, "wgrad", False, "Conv2DBackpropFilter"),
    "conv2d_backprop_input": (2, "dgrad", False, "Conv2DBackpropInput"),
    "conv3d_backprop_filter_v2": (3, "wgrad", False, "Conv3DBackpropFilterV2"),
    "conv3d_backprop_input_v2": (3, "dgrad", False, "Conv3DBackpropInputV2"),
    "depthwise_conv2d_native_backprop_filter":
        (2, "wgrad", True, "DepthwiseConv2dNativeBackpropFilter"),
    "depthwise_conv2d_native_backprop_input":
        (2, "dgrad", True, "DepthwiseConv2dNativeBackpropInput"),
    "conv1d_transpose": (1, "dgrad", False, None),
    "conv2d_transpose": (2, "dgrad", False, None),
}
TRANSPOSES = ("conv1d_transpose", "conv2d_transpose")
# TF's Python wrappers that take padding as a list of [before, after] pairs.
PAIR_WRAPPERS = {
    "conv2d_backprop_filter": lambda **k: tf.compat.v1.nn.conv2d_backprop_filter(**k),
    "conv2d_backprop_input": lambda **k: tf.compat.v1.nn.conv2d_backprop_input(**k),
    "depthwise_conv2d_native_backprop_filter":
        lambda **k: tf.nn.depthwise_conv2d_backprop_filter(**k),
    "depthwise_conv2d_native_backprop_input":
        lambda **k: tf.nn.depthwise_conv2d_backprop_input(**k),
}


def _onednn_active(dtype=F32, grad="wgrad"):
    """True when TF's SAME/VALID backprops (weight or data gradients) in ``dtype``
    run oneDNN (they then accept dilation); the Eigen kernels raise a clean
    InvalidArgumentError."""
    t = TF_DT[dtype]
    kw = dict(strides=[1, 1, 1, 1], padding="VALID", dilations=[1, 2, 1, 1])
    try:
        if grad == "wgrad":
            tf.raw_ops.Conv2DBackpropFilter(
                input=tf.ones((1, 3, 1, 1), t), filter_sizes=[2, 1, 1, 1],
                out_backprop=tf.ones((1, 1, 1, 1), t), **kw)
        else:
            tf.raw_ops.Conv2DBackpropInput(
                input_sizes=[1, 3, 1, 1], filter=tf.ones((2, 1, 1, 1), t),
                out_backprop=tf.ones((1, 1, 1, 1), t), **kw)
        return True
    except tf.errors.InvalidArgumentError:
        return False


ONEDNN = _onednn_active()
# oneDNN's 16-bit kernels depend on the CPU: without AVX-512 (e.g. AVX2-only machines)
# TF runs its Eigen kernels for some of them, which refuse channels-first layouts,
# dilations > 1, groups and unequal depthwise strides.  Probed per dtype and direction.
ONEDNN_16BIT = {(dt, grad): ONEDNN and _onednn_active(dt, grad)
                for dt in (F16, BF16) for grad in ("wgrad", "dgrad")}


# ----------------------------------------------------------------------------
# Layouts and argument spellings
# ----------------------------------------------------------------------------


def cf(df):
    return df[1] == "C"


def to_df(a, df):
    """Channels-last array -> the data format ``df``."""
    return np.moveaxis(a, -1, 1) if cf(df) else a


def from_df(a, df):
    return np.moveaxis(a, 1, -1) if cf(df) else a


def full_list(vals, df, fill=1):
    """Per-spatial values -> one per dimension in ``df`` order."""
    return [fill, fill, *vals] if cf(df) else [fill, *vals, fill]


def full_shape(n, sizes, c, df):
    return [n, c, *sizes] if cf(df) else [n, *sizes, c]


def spatial_pairs(c):
    return [[b, e] for b, e in zip(c.pb, c.pe)]


def full_pairs(c, df):
    return full_list(spatial_pairs(c), df, fill=[0, 0])


def flat(pairs):
    return [v for p in pairs for v in p]


def seq_arg(vals, form, df):
    """strides/dilations of the tf.nn.conv*_transpose wrappers: int, [v], spatial or full."""
    if form == "int":
        return vals[0]
    if form == "len1":
        return [vals[0]]
    if form == "spatial":
        return list(vals)
    return full_list(vals, df)


def same_total(L, ke, s):
    return max(0, (-(-L // s) - 1) * s + ke - L)


def _ints(a):
    return tuple(int(v) for v in a)


def _x(t):
    return "x".join(map(str, t))


# ----------------------------------------------------------------------------
# Seeded random cases (pure functions of (op, index): ids are stable)
# ----------------------------------------------------------------------------

PADS = {2: ("SAME", "VALID", "EXPLICIT", "SAME", "pairs", "VALID", "spatial-pairs"),
        3: ("SAME", "VALID", "EXPLICIT", "SAME", "pairs", "VALID"),
        "conv1d_transpose": ("SAME", "VALID"),
        "conv2d_transpose": ("SAME", "VALID", "pairs", "SAME")}


def gen(op, i, *, dtype=None):
    r, grad, dw, _ = OPS[op]
    rng = np.random.default_rng([zlib.crc32(op.encode()), i])
    pads = PADS[op] if op in PADS else PADS[r]
    pad = pads[i % len(pads)]
    dtype = np.dtype(dtype or (F64, F32)[(i // len(pads)) % 2])
    df = (CF if rng.random() < 0.35 else CL)[r]
    K = _ints(rng.integers(1, 4 if r == 3 else 5, r))
    s = _ints(rng.integers(1, 4, r))
    dmax = 2 if r == 3 else 3
    d = _ints(rng.integers(2, dmax + 1) if rng.random() < 0.3 else 1 for _ in range(r))
    n = int(rng.integers(1, 3))
    if dw:
        C, M = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        G, Cg, Co = C, 1, C * M
    else:
        G = 1 if op == "conv1d_transpose" else int(rng.choice([1, 1, 2, 3]))
        Cg, Og = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        C, Co, M = G * Cg, G * Og, None
    ke = tuple((k - 1) * dd + 1 for k, dd in zip(K, d))
    L, pb, pe, out = [], [], [], []
    for k, dd, e, st in zip(K, d, ke, s):
        while True:
            b = p = 0
            if pad == "VALID":
                size = int(rng.integers(e, e + 2 * st))
                m = (size - e) // st + 1
            elif pad == "SAME":
                cand = list(range(1, e + 2 * st + 1))
                odd = [v for v in cand if same_total(v, e, st) % 2]
                size = int(rng.choice(odd if odd and rng.random() < 0.6 else cand))
                m = -(-size // st)
            else:
                b, p = _ints(rng.integers(0, 4, 2))
                lo = max(1, e - b - p)
                size = int(rng.integers(lo, lo + 2 * st + 1))
                m = (size + b + p - e) // st + 1
            # Not degenerate: some tap reads the input, not only padding.
            first = same_total(size, e, st) // 2 if pad == "SAME" else b
            if any(0 <= j * st + t * dd - first < size for j in range(m) for t in range(k)):
                break
        L.append(size), pb.append(b), pe.append(p), out.append(m)
    # Spatial-only input_sizes / output_shape (groups = 1); TF rejects them for
    # Conv3DBackpropInputV2 and reads a 1-element conv1d_transpose output_shape wrongly.
    spatial_ok = (op in ("conv2d_backprop_input", "conv2d_transpose") and G == 1
                  or op == "depthwise_conv2d_native_backprop_input")
    c = SimpleNamespace(
        op=op, i=i, r=r, grad=grad, dw=dw, dtype=dtype, df=df, pad=pad, K=K, s=s, d=d, n=n,
        C=C, O=Co, G=G, Cg=Cg, M=M, L=tuple(L), pb=tuple(pb), pe=tuple(pe), out=tuple(out),
        ke=ke, spatial=bool(spatial_ok and rng.random() < 0.4),
        sform=str(rng.choice(["int", "len1", "spatial", "full"] if len(set(s)) == 1
                             else ["spatial", "full"])),
        dform=(None if all(v == 1 for v in d) and rng.random() < 0.5 else
               str(rng.choice(["int", "spatial", "full"] if len(set(d)) == 1
                              else ["spatial", "full"]))))
    if op == "conv1d_transpose" and c.sform == "spatial":
        c.sform = "len1"
    c.odd = pad == "SAME" and any(same_total(v, e, st) % 2
                                  for v, e, st in zip(c.L, ke, s))
    grp = f"dw-c{C}m{M}" if dw else f"g{G}"
    padname = pad + ("-odd" if c.odd else "")
    c.id = (f"{i:02d}-{df}-{DT_NAME[dtype]}-{padname}-k{_x(K)}-s{_x(s)}-d{_x(d)}-{grp}"
            f"{'-spatial_sizes' if c.spatial else ''}")
    return c


def data(c):
    """Channels-last float64 nonzero quarter-integers in [-2, 2]: exact in every
    dtype used here, and no tap of a result is zero by accident of a zero input."""
    rng = np.random.default_rng([zlib.crc32(c.op.encode()), c.i, 7])

    def q(shape):
        return rng.integers(1, 9, shape) * rng.choice([-0.25, 0.25], shape)

    w_shape = (*c.K, c.C, c.M) if c.dw else (*c.K, c.Cg, c.O)
    return SimpleNamespace(x=q((c.n, *c.L, c.C)), w=q(w_shape), dy=q((c.n, *c.out, c.O)),
                           w_shape=w_shape)


# ----------------------------------------------------------------------------
# convgrad, called with TensorFlow's arguments
# ----------------------------------------------------------------------------


def pad_kwargs(c, df):
    if c.pad in ("SAME", "VALID"):
        return dict(padding=c.pad)
    if c.pad == "EXPLICIT":
        return dict(padding="EXPLICIT", explicit_paddings=flat(full_pairs(c, df)))
    if c.pad == "pairs":
        return dict(padding=full_pairs(c, df))
    return dict(padding=spatial_pairs(c))


def sizes_arg(c, df):
    return list(c.L) if c.spatial else full_shape(c.n, c.L, c.C, df)


def run_convgrad(c, a):
    df, dt = c.df, c.dtype
    fn = getattr(cg_tf, c.op)
    if c.op in TRANSPOSES:
        kw = dict(strides=seq_arg(c.s, c.sform, df), padding=pad_kwargs(c, df)["padding"],
                  data_format=df)
        if c.dform is not None:
            kw["dilations"] = seq_arg(c.d, c.dform, df)
        return fn(to_df(a.dy, df).astype(dt), a.w.astype(dt), sizes_arg(c, df), **kw)
    kw = dict(strides=full_list(c.s, df), data_format=df, **pad_kwargs(c, df))
    if c.dform is not None:
        kw["dilations"] = full_list(c.d, df)
    if c.grad == "wgrad":
        return fn(input=to_df(a.x, df).astype(dt), filter_sizes=list(a.w_shape),
                  out_backprop=to_df(a.dy, df).astype(dt), **kw)
    return fn(input_sizes=sizes_arg(c, df), filter=a.w.astype(dt),
              out_backprop=to_df(a.dy, df).astype(dt), **kw)


# ----------------------------------------------------------------------------
# TensorFlow references (results channels-last, float64)
# ----------------------------------------------------------------------------


def eigen_kernel(c, dtype):
    if dtype in (F16, BF16) and not ONEDNN_16BIT[(dtype, c.grad)]:
        return True
    return dtype == F64 or c.pad in EXPLICITISH or not ONEDNN


def dead_taps(c):
    """SAME (odd pad at the end): does some filter tap read only padding?"""
    if c.pad != "SAME":
        return False
    for size, k, dd, st, m in zip(c.L, c.K, c.d, c.s, c.out):
        first = same_total(size, (k - 1) * dd + 1, st) // 2
        if any(all(not 0 <= j * st + t * dd - first < size for j in range(m))
               for t in range(k)):
            return True
    return False


def raw_ok(c, dtype, df, *, per_group=False):
    """Does TF's CPU kernel for this op compute the case in ``dtype`` / ``df``?"""
    explicit = c.pad in EXPLICITISH
    if c.r == 3 and explicit:
        return False                       # Conv3D*V2 have no explicit padding
    if c.dw and any(v > 1 for v in c.d):
        return False                       # never applied by the depthwise kernels
    grouped = c.G > 1 and not c.dw and not per_group
    if eigen_kernel(c, dtype):
        return not (any(v > 1 for v in c.d) or grouped or cf(df)
                    or (c.dw and len(set(c.s)) > 1))
    if dtype == BF16 and c.grad == "wgrad" and dead_taps(c):
        # oneDNN's bf16 weight gradients leave such taps uninitialised (garbage,
        # different on every call): see test_bf16_filter_taps_reading_only_padding.
        return False
    return not (c.r == 3 and grouped)


def tf_raw(c, a, dtype, df):
    """The TF op itself in ``dtype`` and data format ``df``."""
    tdt = TF_DT[dtype]
    eigen = eigen_kernel(c, dtype)

    def data_t(v):
        return tf.constant(to_df(v, df), tdt)

    sizes = (list(c.L) if c.spatial and (c.op != "depthwise_conv2d_native_backprop_input"
                                         or not eigen)
             else full_shape(c.n, c.L, c.C, df))
    if c.op in TRANSPOSES:
        fn = tf.nn.conv1d_transpose if c.op == "conv1d_transpose" else tf.nn.conv2d_transpose
        kw = dict(strides=seq_arg(c.s, c.sform, df), padding=pad_kwargs(c, df)["padding"],
                  data_format=df)
        if c.dform is not None:
            kw["dilations"] = seq_arg(c.d, c.dform, df)
        out = fn(data_t(a.dy), tf.constant(a.w, tdt), sizes, **kw)
    else:
        kw = dict(strides=full_list(c.s, df), data_format=df, dilations=full_list(c.d, df))
        if c.grad == "wgrad":
            kw.update(input=data_t(a.x), filter_sizes=list(a.w_shape),
                      out_backprop=data_t(a.dy))
        else:
            kw.update(input_sizes=sizes, filter=tf.constant(a.w, tdt),
                      out_backprop=data_t(a.dy))
        if c.pad == "pairs" and not cf(df):
            out = PAIR_WRAPPERS[c.op](padding=full_pairs(c, df), **kw)
        elif c.pad in EXPLICITISH:
            out = getattr(tf.raw_ops, OPS[c.op][3])(
                padding="EXPLICIT", explicit_paddings=flat(full_pairs(c, df)), **kw)
        else:
            out = getattr(tf.raw_ops, OPS[c.op][3])(padding=c.pad, **kw)
    res = out.numpy()
    got_dtype = res.dtype
    res = res.astype(np.float64)
    return (from_df(res, df) if c.grad == "dgrad" else res), got_dtype


def _native_ok(c):
    """Can the forward wrapper apply stride and dilation itself?"""
    unit_s, unit_d = all(v == 1 for v in c.s), all(v == 1 for v in c.d)
    if c.dw:
        return unit_s or (unit_d and len(set(c.s)) == 1)
    return unit_s or unit_d


def tape_ok(c):
    return _native_ok(c) or c.pad != "SAME"


def tf_forward(c, x, w):
    """TF's forward op, channels-last float64, same attributes as the case."""
    if c.pad in EXPLICITISH:
        x = tf.pad(x, [[0, 0], *spatial_pairs(c), [0, 0]])
        mode = "VALID"
    else:
        mode = c.pad
    native = _native_ok(c)

    def one(xg, wg):
        s = c.s if native else (1,) * c.r
        if c.dw:
            y = tf.nn.depthwise_conv2d(xg, wg, [1, *s, 1], mode, dilations=list(c.d))
        else:
            # data_format must be given: with None, the eager gradient of the
            # 3-D op fails (_Conv3DGrad: 'NoneType' object has no attribute 'decode').
            y = tf.nn.convolution(xg, wg, strides=list(s), padding=mode,
                                  dilations=list(c.d), data_format=CL[c.r])
        if not native:                     # VALID: stride = every s-th stride-1 output
            y = y[(slice(None), *(slice(None, None, v) for v in c.s), slice(None))]
        return y

    if c.dw or c.G == 1:
        return one(x, w)
    return tf.concat([one(xg, wg) for xg, wg in zip(tf.split(x, c.G, axis=-1),
                                                    tf.split(w, c.G, axis=-1))], axis=-1)


def tf_tape(c, a):
    x = tf.constant(a.x if c.grad == "wgrad" else np.zeros_like(a.x))
    w = tf.constant(a.w if c.grad == "dgrad" else np.zeros(a.w_shape))
    with tf.GradientTape() as tape:
        tape.watch(x if c.grad == "dgrad" else w)
        y = tf_forward(c, x, w)
    assert tuple(y.shape) == a.dy.shape, (tuple(y.shape), a.dy.shape)
    g = tape.gradient(y, x if c.grad == "dgrad" else w, output_gradients=tf.constant(a.dy))
    return g.numpy(), None


def tf_dw_as_grouped(c, a):
    """Depthwise = Conv2D with groups = in_channels and filter [*K, 1, C*M]."""
    kw = dict(strides=[1, *c.s, 1], padding=c.pad, dilations=[1, *c.d, 1])
    grouped = (*c.K, 1, c.C * c.M)
    if c.grad == "wgrad":
        out = tf.raw_ops.Conv2DBackpropFilter(
            input=tf.constant(a.x, tf.float32), filter_sizes=list(grouped),
            out_backprop=tf.constant(a.dy, tf.float32), **kw)
        return out.numpy().astype(np.float64).reshape(a.w_shape), None
    out = tf.raw_ops.Conv2DBackpropInput(
        input_sizes=[c.n, *c.L, c.C], filter=tf.constant(a.w.reshape(grouped), tf.float32),
        out_backprop=tf.constant(a.dy, tf.float32), **kw)
    return out.numpy().astype(np.float64), None


def per_group(c, a, fn):
    """fn on each contiguous channel block (groups = 1), concatenated."""
    Og = c.O // c.G
    parts = []
    for g in range(c.G):
        sub = SimpleNamespace(**{**vars(c), "C": c.Cg, "O": Og, "G": 1, "spatial": False})
        sa = SimpleNamespace(x=a.x[..., g * c.Cg:(g + 1) * c.Cg],
                             w=a.w[..., g * Og:(g + 1) * Og],
                             dy=a.dy[..., g * Og:(g + 1) * Og], w_shape=(*c.K, c.Cg, Og))
        parts.append(fn(sub, sa)[0])
    return np.concatenate(parts, axis=-1), None


def routes(c):
    """(name, fn(arrays) -> (channels-last float64 result, TF's dtype or None)),
    the most direct TensorFlow computation first."""
    if raw_ok(c, c.dtype, c.df):
        yield "raw", lambda a: tf_raw(c, a, c.dtype, c.df)
    if cf(c.df) and raw_ok(c, c.dtype, CL[c.r]):
        yield "raw-nhwc", lambda a: tf_raw(c, a, c.dtype, CL[c.r])
    if c.dtype != F32:
        for df in (c.df, CL[c.r]):
            if raw_ok(c, F32, df):
                yield "raw-f32", lambda a, df=df: (tf_raw(c, a, F32, df)[0], None)
    if tape_ok(c):
        yield "tape", lambda a: tf_tape(c, a)
    if ONEDNN and c.dw and c.pad in ("SAME", "VALID"):
        yield "dw-as-grouped-f32", lambda a: tf_dw_as_grouped(c, a)
    if ONEDNN and c.G > 1 and not c.dw and raw_ok(c, F32, CL[c.r], per_group=True):
        yield "raw-f32-per-group", lambda a: per_group(
            c, a, lambda sc, sa: tf_raw(sc, sa, F32, CL[c.r]))


def reference(c, a):
    for name, fn in routes(c):
        want, tf_dtype = fn(a)
        return name, want, tf_dtype
    if ONEDNN:
        pytest.fail(f"no TensorFlow route computes {c.op}[{c.id}]")
    pytest.skip("needs TF's oneDNN kernels (TF_ENABLE_ONEDNN_OPTS=1)")


def check(c):
    a = data(c)
    route, want, tf_dtype = reference(c, a)
    got = run_convgrad(c, a)
    if c.grad == "dgrad":
        want = to_df(want, c.df)
    msg = f"{c.op}[{c.id}] via {route}"
    assert isinstance(got, np.ndarray), msg
    assert got.dtype == c.dtype, (msg, got.dtype)
    if tf_dtype is not None:
        assert tf_dtype == c.dtype, (msg, tf_dtype)
    assert got.shape == want.shape, (msg, got.shape, want.shape)
    if not np.abs(want).max() > 0 and c.op in COUNTS and c.i >= COUNTS[c.op]:
        # a draw of the long run whose products all cancel (e.g. 507 of the depthwise
        # filter gradient): convgrad must give those zeros too, but it proves little
        assert_close(got, want, c.dtype)
        pytest.skip("a long-run draw whose products all cancel: an all-zero reference")
    assert np.abs(want).max() > 0, (msg, "degenerate case: all-zero reference")
    assert_close(got, want, c.dtype)
    return route


# ----------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------

COUNTS = {"conv2d_backprop_filter": 28, "conv2d_backprop_input": 28,
          "conv3d_backprop_filter_v2": 14, "conv3d_backprop_input_v2": 14,
          "depthwise_conv2d_native_backprop_filter": 18,
          "depthwise_conv2d_native_backprop_input": 18,
          "conv1d_transpose": 10, "conv2d_transpose": 16}
# CONVGRAD_CONFORMANCE_SCALE=k (`make conformance-long`): k times as many cases per op.
SCALE = CONFORMANCE_SCALE
SWEEP = {op: [gen(op, i) for i in range(k * SCALE)] for op, k in COUNTS.items()}
# float16 / bfloat16: two of each op.
LOWP = [gen(op, 100 + j, dtype=dt)
        for op in OPS for j, dt in enumerate((F16, BF16))]


@pytest.mark.parametrize("c", [pytest.param(c, id=f"{op}-{c.id}")
                               for op, cases in SWEEP.items() for c in cases])
def test_sweep(c):
    check(c)


@pytest.mark.parametrize("c", [pytest.param(c, id=f"{c.op}-{c.id}") for c in LOWP])
def test_low_precision(c):
    check(c)


def test_sweep_covers_the_plan():
    """The seeded sweep really contains what it is meant to test."""
    cases = [c for cs in SWEEP.values() for c in cs]
    for op, cs in SWEEP.items():
        assert any(c.odd for c in cs), f"{op}: no SAME case with an odd total"
        assert {c.dtype for c in cs} == {F32, F64}, op
        assert any(cf(c.df) for c in cs) and any(not cf(c.df) for c in cs), op
        assert {c.pad for c in cs} == set(PADS[op] if op in PADS else PADS[OPS[op][0]]), op
    for feature in (lambda c: any(v > 1 for v in c.d), lambda c: any(v > 1 for v in c.s),
                    lambda c: max(c.K) == 4, lambda c: 3 in c.s and 3 in c.d):
        assert sum(map(feature, cases)) >= 10
    assert any(c.G > 1 and c.r == 3 for c in cases)
    assert any(c.G > 1 and c.op == "conv2d_backprop_filter" for c in cases)
    assert any(c.G > 1 and c.op == "conv2d_transpose" for c in cases)
    assert {c.M for c in cases if c.dw} == {1, 2, 3}
    assert any(c.dw and any(v > 1 for v in c.d) for c in cases)
    assert any(c.spatial and c.op == "conv2d_backprop_input" for c in cases)
    for op in TRANSPOSES:      # SAME output_shape values that are not stride * input
        assert any(c.pad == "SAME" and any(v != st * m for v, st, m in zip(c.L, c.s, c.out))
                   for c in SWEEP[op]), op
        assert any(c.pad == "VALID" for c in SWEEP[op]), op
    assert {c.dtype for c in LOWP} == {F16, BF16}
    used = {name for c in cases + LOWP for name, _ in list(routes(c))[:1]}
    if ONEDNN:
        assert used >= {"raw", "raw-nhwc", "raw-f32", "tape"}, used


# ----------------------------------------------------------------------------
# Literals (/work/probe/tf/REPORT.md, Q1 and Q3): 1-D rows, H=1, one channel
# ----------------------------------------------------------------------------

# (x, dy, w, K, stride, expected dw, expected dx): SAME with an odd total puts
# the extra pad at the end.
SAME_ODD = [
    ([1, 2, 3, 4], [1, 10, 100, 1000], [1, 10], 2, 1, [4321, 432], [1, 20, 200, 2000]),
    ([1, 2, 3, 4], [1, 10, 100, 1000], [1, 10, 100, 1000], 4, 1, [3210, 4321, 432, 43],
     [20, 300, 4000, 30000]),
    ([1, 2, 3, 4, 5], [1, 10, 100], [1, 10], 2, 2, [531, 42], [1, 10, 10, 100, 100]),
]


def _row(v, dtype):
    return np.asarray(v, dtype).reshape(1, 1, -1, 1)


@pytest.mark.parametrize("dtype", [F64, F32], ids=DT_NAME.get)
@pytest.mark.parametrize("lit", SAME_ODD, ids=["X4-K2", "X4-K4", "X5-K2-s2"])
def test_same_odd_total_literals(lit, dtype):
    x, dy, w, k, s, want_dw, want_dx = lit
    kw = dict(strides=[1, 1, s, 1], padding="SAME")
    for got, ref in (
            (cg_tf.conv2d_backprop_filter(_row(x, dtype), [1, k, 1, 1], _row(dy, dtype), **kw),
             tf.raw_ops.Conv2DBackpropFilter(input=_row(x, dtype), filter_sizes=[1, k, 1, 1],
                                             out_backprop=_row(dy, dtype), **kw)),
            (cg_tf.conv2d_backprop_input([1, 1, len(x), 1], _row(w, dtype).reshape(1, k, 1, 1),
                                         _row(dy, dtype), **kw),
             tf.raw_ops.Conv2DBackpropInput(input_sizes=[1, 1, len(x), 1],
                                            filter=_row(w, dtype).reshape(1, k, 1, 1),
                                            out_backprop=_row(dy, dtype), **kw))):
        ref = ref.numpy()
        assert got.dtype == ref.dtype == dtype
        assert got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(
        cg_tf.conv2d_backprop_filter(_row(x, dtype), [1, k, 1, 1], _row(dy, dtype), **kw)
        .ravel(), want_dw)
    np.testing.assert_array_equal(
        cg_tf.conv2d_backprop_input([1, 1, len(x), 1], _row(w, dtype).reshape(1, k, 1, 1),
                                    _row(dy, dtype), **kw).ravel(), want_dx)


@pytest.mark.parametrize("dtype", [F64, F32], ids=DT_NAME.get)
def test_dilated_depthwise_follows_the_forward_op(dtype):
    """H=1, K=2, d=2, SAME, x=1..5, dy=1..10000: pads (1, 1), dw = [43210, 5432]
    (the gradient of tf.nn.depthwise_conv2d with dilations=2).  TF 2.21's raw
    DepthwiseConv2dNativeBackpropFilter ignores the dilation and returns the
    dilation-1 answer [54321, 5432]: that is why dilated depthwise cases are
    routed through the forward op."""
    x = _row([1, 2, 3, 4, 5], dtype)
    dy = _row([1, 10, 100, 1000, 10000], dtype)
    kw = dict(strides=[1, 1, 1, 1], padding="SAME", dilations=[1, 1, 2, 1])
    got = cg_tf.depthwise_conv2d_native_backprop_filter(x, [1, 2, 1, 1], dy, **kw)
    xt, wt = tf.constant(x), tf.zeros((1, 2, 1, 1), TF_DT[dtype])
    with tf.GradientTape() as tape:
        tape.watch(wt)
        y = tf.nn.depthwise_conv2d(xt, wt, [1, 1, 1, 1], "SAME", dilations=[1, 2])
    want = tape.gradient(y, wt, output_gradients=tf.constant(dy)).numpy()
    assert got.dtype == want.dtype == dtype
    assert got.shape == want.shape == (1, 2, 1, 1)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.ravel(), [43210, 5432])
    raw = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=x, filter_sizes=[1, 2, 1, 1], out_backprop=dy, **kw).numpy()
    np.testing.assert_array_equal(raw.ravel(), [54321, 5432])      # TF ignores d


@pytest.mark.parametrize("op", ["conv2d_backprop_filter", "conv3d_backprop_filter_v2",
                                "depthwise_conv2d_native_backprop_filter"])
def test_bf16_filter_taps_reading_only_padding(op):
    """W=2, K=4, stride 3, SAME: one output, pads (1, 1), so taps 0 and 3 read
    only padding and their gradient is 0.  TF 2.21's oneDNN bf16 weight-gradient
    kernels return uninitialised memory for such taps (e.g. 6.2e-17 and 2.1e34
    here, different on every call), so bf16 weight gradients with such taps are
    compared with TF in float32 (oneDNN, correct) and float64 (Eigen)."""
    r, _, _, raw = OPS[op]
    one = (1,) * (r - 1)
    x = np.ones((2, *one, 2, 3))
    dy = np.ones((2, *one, 1, 6 if op.startswith("depthwise") else 2))
    fs = [*one, 4, 3, 2]
    kw = dict(strides=[1, *[3] * r, 1], padding="SAME")        # size-1 axes: K 1, pads 0
    got = getattr(cg_tf, op)(x.astype(BF16), fs, dy.astype(BF16), **kw)
    assert got.dtype == BF16 and got.shape == tuple(fs)
    want = np.zeros(fs)
    want[..., 1:3, :, :] = 2.0                  # taps 1, 2 read x[0], x[1]; batch 2
    np.testing.assert_array_equal(got.astype(np.float64), want)
    for dt in (tf.float32, tf.float64):
        ref = getattr(tf.raw_ops, raw)(input=tf.constant(x, dt), filter_sizes=fs,
                                       out_backprop=tf.constant(dy, dt), **kw).numpy()
        assert ref.shape == got.shape
        np.testing.assert_array_equal(ref, want)


def test_onednn_kernels_are_active():
    """The sweep's float32 routes assume TF's default oneDNN kernels (dilation
    and groups in the Conv2D backprops)."""
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0":
        pytest.skip("TF_ENABLE_ONEDNN_OPTS=0: the Eigen kernels run everywhere")
    assert ONEDNN


# ----------------------------------------------------------------------------
# Invalid inputs: TF (Eigen path, float64, NHWC) and convgrad both refuse
# ----------------------------------------------------------------------------

def _q(*shape):
    return np.random.default_rng(sum(shape)).integers(-8, 9, shape) / 4.0


BASE = {
    "conv2d_backprop_filter": dict(input=_q(1, 5, 5, 4), filter_sizes=[3, 3, 4, 6],
                                   out_backprop=_q(1, 5, 5, 6)),
    "conv2d_backprop_input": dict(input_sizes=[1, 5, 5, 4], filter=_q(3, 3, 4, 6),
                                  out_backprop=_q(1, 5, 5, 6)),
    "conv3d_backprop_filter_v2": dict(input=_q(1, 4, 5, 5, 4), filter_sizes=[2, 3, 3, 4, 6],
                                      out_backprop=_q(1, 4, 5, 5, 6)),
    "conv3d_backprop_input_v2": dict(input_sizes=[1, 4, 5, 5, 4], filter=_q(2, 3, 3, 4, 6),
                                     out_backprop=_q(1, 4, 5, 5, 6)),
    "depthwise_conv2d_native_backprop_filter": dict(
        input=_q(1, 5, 5, 4), filter_sizes=[3, 3, 4, 2], out_backprop=_q(1, 5, 5, 8)),
    "depthwise_conv2d_native_backprop_input": dict(
        input_sizes=[1, 5, 5, 4], filter=_q(3, 3, 4, 2), out_backprop=_q(1, 5, 5, 8)),
}
_NEG = dict(padding="EXPLICIT", explicit_paddings=[0, 0, 3, -1, 1, 1, 0, 0])
ERRORS = [
    *[(op, "out_backprop-size-off-by-one",
       dict(out_backprop=_q(*(v + (i == 2) for i, v in enumerate(BASE[op]["out_backprop"]
                                                                 .shape)))))
      for op in BASE],
    ("conv2d_backprop_input", "out_backprop-size-VALID", dict(padding="VALID")),
    *[(op, "negative-explicit-padding", _NEG) for op in
      ("conv2d_backprop_filter", "conv2d_backprop_input",
       "depthwise_conv2d_native_backprop_filter", "depthwise_conv2d_native_backprop_input")],
    ("conv2d_backprop_filter", "stride-on-channel", dict(strides=[1, 1, 1, 2])),
    ("conv2d_backprop_input", "stride-on-batch", dict(strides=[2, 1, 1, 1])),
    ("conv3d_backprop_filter_v2", "stride-on-channel", dict(strides=[1, 1, 1, 1, 2])),
    ("conv3d_backprop_input_v2", "stride-on-batch", dict(strides=[2, 1, 1, 1, 1])),
    ("depthwise_conv2d_native_backprop_filter", "stride-on-batch", dict(strides=[2, 1, 1, 1])),
    ("depthwise_conv2d_native_backprop_input", "stride-on-channel",
     dict(strides=[1, 1, 1, 2])),
    ("conv2d_backprop_filter", "explicit-padding-on-channel",
     dict(padding="EXPLICIT", explicit_paddings=[0, 0, 1, 1, 1, 1, 1, 0])),
    ("depthwise_conv2d_native_backprop_input", "explicit-padding-on-batch",
     dict(padding="EXPLICIT", explicit_paddings=[1, 0, 1, 1, 1, 1, 0, 0])),
    ("conv2d_backprop_input", "explicit_paddings-of-length-6",
     dict(padding="EXPLICIT", explicit_paddings=[0, 0, 1, 1, 1, 1])),
    ("conv2d_backprop_filter", "explicit_paddings-with-SAME",
     dict(explicit_paddings=[0] * 8)),
    ("conv2d_backprop_filter", "stride-0", dict(strides=[1, 0, 1, 1])),
    ("conv2d_backprop_filter", "filter_sizes-out-depth", dict(filter_sizes=[3, 3, 4, 5])),
    ("depthwise_conv2d_native_backprop_filter", "filter_sizes-multiplier",
     dict(filter_sizes=[3, 3, 4, 3])),
    ("conv2d_backprop_input", "input_sizes-batch", dict(input_sizes=[2, 5, 5, 4])),
    ("conv2d_backprop_input", "filter-out-depth", dict(filter=_q(3, 3, 4, 5))),
]


@pytest.mark.parametrize("op, bad", [pytest.param(op, bad, id=f"{op}-{name}")
                                     for op, name, bad in ERRORS])
def test_errors(op, bad):
    kw = dict(BASE[op], strides=[1] * (OPS[op][0] + 2), padding="SAME")
    kw.update(bad)
    tf_kw = {k: tf.constant(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)):
        getattr(tf.raw_ops, OPS[op][3])(**tf_kw)
    with pytest.raises(ConvGradError) as err:
        getattr(cg_tf, op)(**kw)
    assert str(err.value).startswith(OPS[op][3] + ": "), str(err.value)
    assert isinstance(err.value, ValueError)
