"""benchdnn-style convolution problem strings, parsed into a canonical problem.

Pure: integers and strings only, no arrays.  The grammar and the implicit
rules are benchdnn's (``gXmbX_icXidXihXiwX_ocXodXohXowX_kdXkhXkwX_sdXshXswX_
pdXphXpwX_ddXdhXdwX_nNAME``, ``_`` ignored):

- defaults: ``g1``, ``mb2``, strides 1, dilations 0, pads deduced;
- **dilation is 0-based**: ``dh1`` means a gap of one, i.e. convgrad's
  dilation 2 (convgrad's dilation = benchdnn's + 1);
- a spatial axis exists when any of its entries is given; the input size and
  the kernel size are then required;
- a missing output size is ``(i - ((k - 1) * (d + 1) + 1) + 2 * p) / s + 1``
  (C integer division, pad 0 when not given); a given output size with a
  missing pad gets ``p = ((o - 1) * s - i + ((k - 1) * (d + 1) + 1)) / 2``;
- "square"/"cubic" promotion: with only ``d`` given, h and w copy it; with
  ``h`` and not ``w``, w copies h (``ih56kh3`` is 56x56 with a 3x3 kernel);
- the end pad is what the sizes imply:
  ``pe = (o - 1) * s - i + ((k - 1) * (d + 1) + 1) - p``.  benchdnn allows it
  to be negative (the last input rows are never read); convgrad's pads are
  non-negative, so a negative end pad becomes 0, which gives the same output
  size (checked).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import ConvGradError

_KEYS = ("g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw",
         "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw")
_TOKEN = re.compile(r"(mb|ic|id|ih|iw|oc|od|oh|ow|kd|kh|kw|sd|sh|sw|pd|ph|pw|dd|dh|dw|g)(\d+)")
_AXES = ("d", "h", "w")
# Sizes beyond this are refused before anything is computed from them.
MAX_VALUE = 2**31 - 1


class ProblemError(ConvGradError):
    """A problem string that benchdnn's grammar or rules reject."""


@dataclass(frozen=True)
class Problem:
    """A convolution problem in convgrad's terms (dilation 1 = dense)."""

    groups: int
    mb: int
    ic: int
    oc: int
    in_sizes: tuple[int, ...]
    out_sizes: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    name: str = ""

    @property
    def spatial_rank(self) -> int:
        return len(self.in_sizes)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.mb, self.ic, *self.in_sizes)

    @property
    def w_shape(self) -> tuple[int, ...]:
        """Canonical OIX weights ``(O, C/G, *K)``."""
        return (self.oc, self.ic // self.groups, *self.kernel)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.mb, self.oc, *self.out_sizes)

    def attrs(self) -> dict:
        """Keyword arguments of convgrad's canonical API."""
        return dict(strides=list(self.strides), pads_begin=list(self.pads_begin),
                    pads_end=list(self.pads_end), dilations=list(self.dilations),
                    groups=self.groups)

    def flops(self) -> int:
        """2 * multiply-adds of the dense computation (padding taps included)."""
        return 2 * self.mb * self.oc * (self.ic // self.groups) * math.prod(self.kernel) \
            * math.prod(self.out_sizes)

    def canonical(self) -> str:
        """The benchdnn string that describes this problem, every field explicit
        (dilations 0-based again)."""
        axes = _AXES[3 - self.spatial_rank:]

        def field(prefix, values):
            return "".join(f"{prefix}{a}{v}" for a, v in zip(axes, values))

        text = (f"g{self.groups}mb{self.mb}_ic{self.ic}{field('i', self.in_sizes)}"
                f"_oc{self.oc}{field('o', self.out_sizes)}_{field('k', self.kernel)}"
                f"_{field('s', self.strides)}_{field('p', self.pads_begin)}"
                f"_{field('d', [d - 1 for d in self.dilations])}")
        return text + (f"_n{self.name}" if self.name else "")


def _c_div(a: int, b: int) -> int:
    """C integer division (truncates toward zero), as benchdnn computes sizes."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def parse(text: str) -> Problem:
    """Parse a benchdnn convolution problem string (see the module docstring).

    Raises ProblemError naming the entry and the rule broken.
    """
    if not isinstance(text, str) or not text.strip():
        raise ProblemError("problem: empty problem string; example: g32mb8ic128ih56oc128oh56kh3ph1")
    src = text.strip()
    body, _, name = src.partition("n")        # no entry key contains an "n"
    name = name.strip("\"'")
    vals: dict[str, int] = {}
    pos = 0
    while pos < len(body):
        if body[pos] == "_":
            pos += 1
            continue
        m = _TOKEN.match(body, pos)
        if m is None:
            raise ProblemError(f"problem {src!r}: cannot parse at {body[pos:]!r}; entries are "
                               f"{', '.join(_KEYS)} followed by a number, then optionally "
                               "n<name>")
        key, value = m.group(1), int(m.group(2))
        if value > MAX_VALUE:
            raise ProblemError(f"problem {src!r}: {key} = {value}: must be at most {MAX_VALUE}")
        if key in vals:
            raise ProblemError(f"problem {src!r}: {key} given twice")
        vals[key] = value
        pos = m.end()
    return _deduce(src, vals, name)


def _deduce(src: str, vals: dict[str, int], name: str) -> Problem:
    def bad(rule):
        return ProblemError(f"problem {src!r}: {rule}")

    g, mb = vals.get("g", 1), vals.get("mb", 2)
    ic, oc = vals.get("ic", 0), vals.get("oc", 0)
    if g < 1:
        raise bad(f"g = {g}: groups must be positive")
    if mb < 1:
        raise bad(f"mb = {mb}: the minibatch must be positive")
    if ic < 1 or oc < 1:
        raise bad("ic and oc are required and must be positive")
    if ic % g or oc % g:
        raise bad(f"ic = {ic} and oc = {oc} must both be divisible by g = {g}")
    axes = {}
    for a in _AXES:
        e = {f: vals.get(f + a) for f in ("i", "o", "k", "s", "p", "d")}
        if all(v is None for v in e.values()):
            continue
        if not e["i"] or not e["k"]:
            raise bad(f"axis {a}: i{a} and k{a} are required (and positive) when any "
                      f"{a}-entry is given")
        s = 1 if e["s"] is None else e["s"]
        d = 0 if e["d"] is None else e["d"]
        if s < 1:
            raise bad(f"s{a} = {s}: strides must be positive")
        ke = (e["k"] - 1) * (d + 1) + 1
        p, o = e["p"], e["o"]
        if not o:
            p = 0 if p is None else p
            o = _c_div(e["i"] - ke + 2 * p, s) + 1
            if o <= 0:
                raise bad(f"axis {a}: the output size {o} deduced from i{a}{e['i']} "
                          f"k{a}{e['k']} s{a}{s} p{a}{p} d{a}{d} is not positive")
        elif p is None:
            p = _c_div((o - 1) * s - e["i"] + ke, 2)
            if p < 0:
                raise bad(f"axis {a}: o{a} = {o} needs a negative pad ({p}) with "
                          f"i{a}{e['i']} k{a}{e['k']} s{a}{s}")
        axes[a] = dict(i=e["i"], o=o, k=e["k"], s=s, p=p, d=d)
    if not axes:
        raise bad("no spatial size given (e.g. ih56kh3)")
    # Promotion of higher axes to missing lower ones (square / cubic problems).
    if "d" in axes:
        if "h" not in axes and "w" not in axes:
            axes["h"] = axes["w"] = axes["d"]
        elif "h" not in axes or "w" not in axes:
            raise bad("a 3-D problem needs both h and w entries, or neither (cubic)")
    elif "h" in axes and "w" not in axes:
        axes["w"] = axes["h"]
    used = [a for a in _AXES if a in axes]     # now [w], [h, w] or [d, h, w]
    ax = [axes[a] for a in used]
    pads_end = []
    for a, e in zip(used, ax):
        ke = (e["k"] - 1) * (e["d"] + 1) + 1
        pe = max((e["o"] - 1) * e["s"] - e["i"] + ke - e["p"], 0)
        span = e["i"] + e["p"] + pe - ke
        if span < 0 or span // e["s"] + 1 != e["o"]:
            raise bad(f"axis {a}: o{a} = {e['o']} is not the output size of i{a}{e['i']} "
                      f"k{a}{e['k']} s{a}{e['s']} p{a}{e['p']} d{a}{e['d']}")
        pads_end.append(pe)
    return Problem(groups=g, mb=mb, ic=ic, oc=oc,
                   in_sizes=tuple(e["i"] for e in ax), out_sizes=tuple(e["o"] for e in ax),
                   kernel=tuple(e["k"] for e in ax), strides=tuple(e["s"] for e in ax),
                   dilations=tuple(e["d"] + 1 for e in ax),
                   pads_begin=tuple(e["p"] for e in ax), pads_end=tuple(pads_end), name=name)


DIRECTIONS = {"FWD_D": "fwd", "FWD_I": "fwd", "FWD_B": "fwd", "BWD_D": "dgrad",
              "BWD_W": "wgrad", "BWD_WB": "wgrad"}


def direction(value: str) -> str:
    """benchdnn ``--dir`` value (or convgrad's op key) -> ``fwd``/``dgrad``/``wgrad``."""
    key = value.strip()
    if key.upper() in DIRECTIONS:
        return DIRECTIONS[key.upper()]
    if key.lower() in ("fwd", "dgrad", "wgrad"):
        return key.lower()
    raise ConvGradError(f"--dir = {value!r}: must be one of {', '.join(DIRECTIONS)} "
                        "(or fwd, dgrad, wgrad)")
