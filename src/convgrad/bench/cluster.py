"""Measuring ``convgrad.dask`` on a ``dask.distributed`` cluster: what a worker
holds at its peak, what travels between workers, and what the graph says may
travel.  Used by ``benchmarks/dask_scaling.py``, ``benchmarks/dask_3d.py`` and
the tests (needs the ``dask`` extra).

- :func:`local_cluster`: a ``LocalCluster`` of worker processes whose transfer
  logs are long enough to hold a whole step.
- :func:`reset_peaks` / :func:`peaks`: each worker process's resident-set high
  water mark (``VmHWM``, reset through ``/proc/self/clear_refs``; Linux).
- :class:`TransferMeter`: the bytes moved between workers during a step, from
  each worker's incoming-transfer log, by kind of key (halo piece, whole input
  chunk, partial weight gradient, ...).
- :func:`graph_traffic`: the same kinds, counted from the graph: what would move
  if every dependency of every task lived on another worker.
- :class:`BlockFiles`: a ``da.store`` target writing each block to its own
  ``.npy`` file, so that a large result goes to disk from the worker that made it.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from pathlib import Path

import numpy as np

from ..dtypes import compute_dtype

LOG_LENGTH = 10**6
"""Entries kept in each worker's transfer log (Dask's default, 1000, can be
shorter than one step)."""


@contextlib.contextmanager
def local_cluster(n_workers: int, threads_per_worker: int = 1, **kwargs):
    """A ``distributed.Client`` on a ``LocalCluster`` of ``n_workers`` processes."""
    import dask
    import distributed

    kwargs = {"dashboard_address": ":0", "silence_logs": 40, **kwargs}
    with dask.config.set({"distributed.admin.low-level-log-length": LOG_LENGTH}), \
            distributed.LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                                     processes=True, **kwargs) as cluster, \
            distributed.Client(cluster) as client:
        yield client


# ----------------------------------------------------------------------------
# Peak memory of the worker processes
# ----------------------------------------------------------------------------


def proc_status(field: str) -> int:
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_process_peak() -> int:
    """Reset this process's VmHWM to its current RSS; return that RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return proc_status("VmRSS")


def process_peak() -> dict:
    return {"peak": proc_status("VmHWM"), "rss": proc_status("VmRSS")}


def _reset_worker_peak() -> int:
    # result buffers an earlier computation left in the worker's pool (D25) would
    # serve this one's results without a rise of the peak: released first
    from ..kernels import _results
    _results.clear()
    return reset_process_peak()


def reset_peaks(client) -> dict[str, int]:
    """Release every worker's idle result buffers and reset its peak RSS; return each
    worker's RSS (the baseline)."""
    return client.run(_reset_worker_peak)


def peaks(client) -> dict[str, dict]:
    """Every worker's peak RSS since :func:`reset_peaks`, and its RSS now (bytes)."""
    return client.run(process_peak)


def can_measure_peaks() -> bool:
    """Whether this system has the ``/proc`` files :func:`reset_peaks` needs."""
    try:
        reset_process_peak()
        process_peak()
    except (OSError, KeyError):
        return False
    return True


# ----------------------------------------------------------------------------
# What travels
# ----------------------------------------------------------------------------


def key_name(key) -> str:
    return key[0] if isinstance(key, tuple) else str(key)


def key_kind(key, inputs: dict[str, str]) -> str:
    """The kind of a key of a ``convgrad.dask`` graph: ``halo`` (a piece cut
    out of a chunk), ``partial`` (a partial weight gradient or a partial sum),
    ``result`` (a result block), or the label ``inputs`` gives the array the
    key belongs to (e.g. ``{x.name: "x chunk"}``); else ``other``."""
    name = key_name(key)
    if name in inputs:
        return inputs[name]
    if name.startswith("convgrad-"):
        tail = name.rsplit("-", 1)[-1]
        if tail == "halo":
            return "halo"
        if tail == "part" or tail.startswith("sum"):
            return "partial"
        return "result"
    return "other"


def _transfer_log(dask_worker):
    return len(dask_worker.transfer_incoming_log), dask_worker.state.transfer_incoming_count_total


def _transfers_since(starts: dict, dask_worker):
    """The ``{key: nbytes}`` of each transfer this worker received since its
    log held ``starts[its address]`` entries."""
    log = list(dask_worker.transfer_incoming_log)[starts.get(dask_worker.address, 0):]
    return [entry["keys"] for entry in log]


class TransferMeter:
    """Bytes received by the workers from other workers between :meth:`start`
    and :meth:`stop`, by key kind (:func:`key_kind`).  Sizes are Dask's
    ``nbytes`` of each received value (the NumPy buffer; messages add a few
    hundred bytes each)."""

    def __init__(self, client, inputs: dict[str, str] | None = None):
        self.client, self.inputs = client, dict(inputs or {})
        self._start: dict | None = None

    def start(self) -> None:
        self._start = self.client.run(_transfer_log)

    def stop(self) -> dict:
        """``{"total": bytes, "transfers": count, "by_kind": {kind: bytes},
        "by_worker": {worker: bytes received}}``."""
        assert self._start is not None, "start() first"
        after = self.client.run(_transfer_log)
        starts = {w: self._start.get(w, (0, 0))[0] for w in after}
        received = self.client.run(_transfers_since, starts)
        by_kind, by_worker, total, count = Counter(), Counter(), 0, 0
        for worker, (length, n_total) in after.items():
            start_len, start_total = self._start.get(worker, (0, 0))
            if length - start_len != n_total - start_total:
                raise RuntimeError(f"{worker}: transfer log overflowed "
                                   f"({length - start_len} of {n_total - start_total} kept)")
            for keys in received[worker]:
                count += 1
                for key, nbytes in keys.items():
                    by_kind[key_kind(key, self.inputs)] += nbytes
                    by_worker[worker] += nbytes
                    total += nbytes
        self._start = None
        return {"total": total, "transfers": count, "by_kind": dict(by_kind),
                "by_worker": {w: by_worker.get(w, 0) for w in after}}


def graph_traffic(arr, inputs: dict[str, str]) -> dict:
    """What the graph of ``arr`` (a ``convgrad.dask`` result) could move at most,
    by kind: for every task of the graph, the bytes of each dependency of a
    given kind (a value a task reads from another worker is sent once).  Input
    chunks are sized from ``inputs``' arrays: pass ``{label: dask array}``.

    ``halo`` is then the sum of all halo pieces, ``partial`` the edges of the
    reduction tree; input chunks count once per reading task (a neighbour whose
    window needs more than half of a chunk reads it whole).  Also: the number of
    blocks, and the largest block's window (all it reads of the large inputs) and
    result, in bytes."""
    from ..dask import _graph

    sizes, labels = {}, {}
    for label, a in inputs.items():
        labels[a.name] = label
        for index in np.ndindex(*a.numblocks):
            shape = [a.chunks[i][j] for i, j in enumerate(index)]
            sizes[(a.name, *index)] = math.prod(shape) * a.dtype.itemsize
    graph = dict(arr.__dask_graph__())
    partial_bytes = arr.size * compute_dtype(arr.dtype).itemsize   # a weight gradient's partial
    out = Counter()
    blocks = max_window = max_result = 0
    for task in graph.values():
        if not (isinstance(task, tuple) and task and callable(task[0])):
            continue
        func, args = task[0], task[1:]
        if func is _graph.run_block:
            block, a_keys, b_keys = args[:3]
            blocks += 1
            itemsize = block.dtype.itemsize
            max_window = max(max_window, sum(math.prod(w.shape) * itemsize
                                             for w in (block.a, block.b) if w is not None))
            max_result = max(max_result, math.prod(block.shape) * itemsize)
            for win, keys in ((block.a, a_keys), (block.b, b_keys)):
                for k, (dst, _src) in zip(keys, win.pieces if win else ()):
                    kind = key_kind(k, labels)
                    if k in sizes:
                        out[kind] += sizes[k]
                    else:                # a halo piece: its destination's size
                        out[kind] += math.prod(s.stop - s.start for s in dst) * itemsize
        elif func is _graph.sum_partials:
            out["partial"] += len(args[0]) * partial_bytes
        elif func is _graph.finish_weights:
            out["partial"] += partial_bytes
    return {"blocks": blocks, "by_kind": dict(out),
            "input_bytes": {label: a.nbytes for label, a in inputs.items()},
            "max_block_window_bytes": max_window, "max_block_result_bytes": max_result}


# ----------------------------------------------------------------------------
# Writing a large result block by block
# ----------------------------------------------------------------------------


class BlockFiles:
    """A ``da.store`` target: each stored block becomes ``<dir>/<starts>.npy``
    (its region's start per axis, joined by ``_``), written by the worker that
    computed it.  :meth:`blocks` reads them back."""

    def __init__(self, directory):
        self.directory = str(directory)

    def _path(self, region) -> Path:
        return Path(self.directory) / ("_".join(str(s.start or 0) for s in region) + ".npy")

    def __setitem__(self, region, value) -> None:
        np.save(self._path(region), np.asarray(value))

    def files(self) -> list[Path]:
        return sorted(Path(self.directory).glob("*.npy"))

    def blocks(self):
        """``(starts, block)`` of every stored block (memory-mapped)."""
        for path in self.files():
            starts = tuple(int(v) for v in path.stem.split("_"))
            yield starts, np.load(path, mmap_mode="r")
