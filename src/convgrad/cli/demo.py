"""``convgrad demo``: a small CNN trained on the 8x8 digits, convolutions by convgrad.

The network (NCX data; every convolution and its gradients are convgrad calls,
the rest -- bias, ReLU, softmax, Adam -- is a few lines of NumPy)::

    x (B, 1, 8, 8)
    c1 = relu(conv 3x3, 1 -> 8, pad 1)                      (B, 8, 8, 8)
    c2 = relu(conv 3x3, 8 -> 16, stride 2, pad 1)           (B, 16, 4, 4)
    u  = relu(ConvTranspose 3x3, 16 -> 8, stride 2,         (B, 8, 8, 8)
              pad 1, output_padding 1) + c1                  upsampling + skip
    c4 = relu(conv 3x3, 8 -> 16, stride 2, pad 1)           (B, 16, 4, 4)
    logits = conv 4x4, 16 -> 10 (valid)                     (B, 10, 1, 1)

Forward convolutions use ``convgrad.conv_forward``, their gradients
``conv_weight_grad`` and ``conv_data_grad``; the upsampling layer is oneDNN
Graph's ``ConvTranspose`` with its data gradient ``ConvTransposeBackwardData``
and its weight gradient ``ConvTransposeBackpropFilters``
(``convgrad.onednn``), weights in the ``OIX`` = ``(O/G, I, KH, KW)`` format.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np

import convgrad
from convgrad import onednn

# name -> (kind, in channels, out channels, kernel, conv attributes)
LAYERS = {
    "c1": ("conv", 1, 8, 3, dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])),
    "c2": ("conv", 8, 16, 3, dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1])),
    "up": ("convt", 16, 8, 3, dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1],
                                    output_padding=[1, 1])),
    "c4": ("conv", 8, 16, 3, dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1])),
    "fc": ("conv", 16, 10, 4, dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0])),
}
CONVT = dict(data_format="NCX")


@dataclass
class Digits:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def digits_file() -> pathlib.Path:
    """The 8x8 digits file scikit-learn ships (what ``sklearn.datasets.load_digits``
    reads), found without importing scikit-learn (seconds of start-up)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-learn is not installed: pip install 'convgrad[cli]'")
    path = pathlib.Path(list(spec.submodule_search_locations)[0], "datasets", "data",
                        "digits.csv.gz")
    if not path.is_file():
        raise FileNotFoundError(f"scikit-learn's digits data is missing: {path}")
    return path


def load_digits(seed: int, test_fraction: float = 0.2) -> Digits:
    """scikit-learn's bundled 8x8 digits (no download), scaled to [0, 1], split
    with a seeded shuffle."""
    table = np.loadtxt(digits_file(), delimiter=",")             # (1797, 64 pixels + label)
    x = (table[:, :64].reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)
    y = table[:, 64].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Digits(x[train], y[train], x[test], y[test])


class Net:
    """Parameters, forward and backward of the demo network."""

    def __init__(self, seed: int, dtype=np.float32):
        rng = np.random.default_rng(seed)
        self.params: dict[str, np.ndarray] = {}
        for name, (_kind, cin, cout, k, _) in LAYERS.items():
            fan_in = cin * k * k
            # canonical OIX (O, C, K, K) for convs; oneDNN OIX (O/G, I, K, K) for the
            # ConvTranspose, whose I (= its input channels) is the fan-in here.
            shape = (cout, cin, k, k)
            self.params[f"{name}.w"] = (rng.standard_normal(shape)
                                        * np.sqrt(2.0 / fan_in)).astype(dtype)
            self.params[f"{name}.b"] = np.zeros(cout, dtype)
        self._adam = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in self.params.items()}
        self._t = 0

    def astype(self, dtype) -> "Net":
        other = Net.__new__(Net)
        other.params = {k: v.astype(dtype) for k, v in self.params.items()}
        other._adam, other._t = {}, 0
        return other

    @staticmethod
    def describe() -> str:
        return ("conv 1->8, conv 8->16 /2, ConvTranspose 16->8 x2 (+ skip), "
                "conv 8->16 /2, conv 4x4 16->10")

    def forward(self, x: np.ndarray):
        p, cache = self.params, {}

        def conv(name, inp):
            a = LAYERS[name][4]
            z = convgrad.conv_forward(inp, p[f"{name}.w"], **a)
            return z + p[f"{name}.b"][:, None, None]

        cache["x"] = x
        cache["c1"] = h1 = np.maximum(conv("c1", x), 0)
        cache["c2"] = h2 = np.maximum(conv("c2", h1), 0)
        z3 = onednn.conv_transpose(h2, p["up.w"], weights_format="OIX", **LAYERS["up"][4],
                                   **CONVT) + p["up.b"][:, None, None]
        cache["up"] = h3 = np.maximum(z3, 0)
        cache["skip"] = s = h3 + h1
        cache["c4"] = h4 = np.maximum(conv("c4", s), 0)
        logits = conv("fc", h4)[:, :, 0, 0]
        return logits, cache

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray):
        """Mean softmax cross-entropy and the gradient of every parameter."""
        logits, c = self.forward(x)
        p, g = self.params, {}
        z = logits - logits.max(axis=1, keepdims=True)
        prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        n = len(y)
        loss = float(-np.log(prob[np.arange(n), y] + 1e-30).mean())
        d = prob
        d[np.arange(n), y] -= 1
        d = (d / n).astype(logits.dtype)[:, :, None, None]        # dL/dlogits (B, 10, 1, 1)

        def back_conv(name, inp, dz, need_dx=True):
            a = LAYERS[name][4]
            w = p[f"{name}.w"]
            g[f"{name}.w"] = convgrad.conv_weight_grad(inp, dz, w.shape, **a)
            g[f"{name}.b"] = dz.sum(axis=(0, 2, 3))
            return convgrad.conv_data_grad(w, dz, inp.shape, **a) if need_dx else None

        dh4 = back_conv("fc", c["c4"], d)
        ds = back_conv("c4", c["skip"], dh4 * (c["c4"] > 0))
        dz3 = ds * (c["up"] > 0)
        a = LAYERS["up"][4]
        g["up.w"] = onednn.conv_transpose_backprop_filters(
            c["c2"], dz3, p["up.w"].shape, filter_format="OIX", **a, **CONVT)
        g["up.b"] = dz3.sum(axis=(0, 2, 3))
        dh2 = onednn.conv_transpose_backward_data(dz3, p["up.w"], weights_format="OIX", **a,
                                                  **CONVT)
        dh1 = back_conv("c2", c["c1"], dh2 * (c["c2"] > 0)) + ds       # skip path
        back_conv("c1", c["x"], dh1 * (c["c1"] > 0), need_dx=False)
        return loss, g

    def step(self, grads: dict, lr: float = 3e-3, b1: float = 0.9, b2: float = 0.999):
        """One Adam step."""
        self._t += 1
        for k, gk in grads.items():
            m, v = self._adam[k]
            m *= b1
            m += (1 - b1) * gk
            v *= b2
            v += (1 - b2) * gk * gk
            mh = m / (1 - b1 ** self._t)
            vh = v / (1 - b2 ** self._t)
            self.params[k] -= (lr * mh / (np.sqrt(vh) + 1e-8)).astype(self.params[k].dtype)


@dataclass
class FiniteDifference:
    count: int
    max_rel: float


def finite_difference_check(net: Net, data: Digits, seed: int, count: int = 12,
                            eps: float = 1e-6) -> FiniteDifference:
    """Central differences of the loss w.r.t. ``count`` entries of the
    ConvTranspose weights, against ConvTransposeBackpropFilters, in float64
    on 16 training images.  The error is relative to the largest of the
    checked gradient entries."""
    net64 = net.astype(np.float64)
    x = data.x_train[:16].astype(np.float64)
    y = data.y_train[:16]
    _, grads = net64.loss_and_grads(x, y)
    w = net64.params["up.w"]
    rng = np.random.default_rng(seed)
    idx = [tuple(int(rng.integers(s)) for s in w.shape) for _ in range(count)]
    analytic, numeric = [], []
    for i in idx:
        old = w[i]
        w[i] = old + eps
        lp, _ = net64.loss_and_grads(x, y)
        w[i] = old - eps
        lm, _ = net64.loss_and_grads(x, y)
        w[i] = old
        numeric.append((lp - lm) / (2 * eps))
        analytic.append(grads["up.w"][i])
    analytic, numeric = np.array(analytic), np.array(numeric)
    scale = max(float(np.abs(numeric).max()), 1e-12)
    return FiniteDifference(count, float(np.abs(analytic - numeric).max() / scale))


def train_epoch(net: Net, x: np.ndarray, y: np.ndarray, batch: int, seed: int):
    """Yield the loss of each minibatch of one seeded epoch."""
    order = np.random.default_rng(seed).permutation(len(y))
    for start in range(0, len(y), batch):
        sel = order[start:start + batch]
        loss, grads = net.loss_and_grads(x[sel], y[sel])
        net.step(grads)
        yield loss


def evaluate(net: Net, x: np.ndarray, y: np.ndarray, batch: int = 256) -> tuple[float, float]:
    """(mean loss, accuracy)."""
    losses, correct = [], 0
    for start in range(0, len(y), batch):
        xb, yb = x[start:start + batch], y[start:start + batch]
        logits, _ = net.forward(xb)
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        losses.append(-logp[np.arange(len(yb)), yb].sum())
        correct += int((logits.argmax(axis=1) == yb).sum())
    return float(np.sum(losses) / len(y)), correct / len(y)


def plot_losses(losses: list[float], steps_per_epoch: int, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = np.arange(1, len(losses) + 1) / steps_per_epoch
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="minibatch")
    k = max(1, steps_per_epoch)
    if len(losses) >= k:
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1:], smooth, lw=2, label=f"mean of {k} steps")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.set_title("convgrad demo: 8x8 digits")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
