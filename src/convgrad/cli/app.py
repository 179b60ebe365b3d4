"""The ``convgrad`` subcommands: arguments (typer) and output (rich).

Each command parses its options, calls the terminal-free module that does the
work, and prints.  User errors (bad files, bad strings, bad attributes) print
one line ``error: ...`` and exit with status 2; a failed check exits with 1.
"""

from __future__ import annotations

import json
import pathlib
import sys
import zipfile
from typing import Optional

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import convgrad

from ..errors import ConvGradError, ConvGradTypeError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="convgrad: convolution gradients as the oneDNN Graph, OpenVINO and "
                       "TensorFlow specs define them.")
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


class Failure(Exception):
    """A check that ran and failed (exit status 1)."""


def _user_error(message: str) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


def run(argv: list[str] | None = None) -> None:
    """Run the app; user errors become one line on stderr, not a traceback."""
    try:
        app(args=argv, prog_name="convgrad", standalone_mode=True)
    except (ConvGradError, ConvGradTypeError, OSError) as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        sys.exit(2)
    except Failure as e:
        err.print(f"[bold red]FAILED:[/] {escape(str(e))}", soft_wrap=True)
        sys.exit(1)


def _need_cli_extra(what: str, modules: tuple[str, ...]) -> None:
    import importlib.util
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        _user_error(f"{what} needs {', '.join(missing)}: pip install 'convgrad[cli]'")


# ---------------------------------------------------------------------------
# demo, examples
# ---------------------------------------------------------------------------


@app.command()
def demo(
    epochs: int = typer.Option(12, min=1, help="Training epochs."),
    batch: int = typer.Option(32, min=1, help="Minibatch size."),
    train_size: int = typer.Option(0, min=0, help="Use only this many training images "
                                   "(0: all)."),
    seed: int = typer.Option(0, help="Seed of the weights, the split and the batches."),
    plot: pathlib.Path = typer.Option(pathlib.Path("out/demo_loss.png"),
                                      help="Where to write the loss-curve PNG."),
    json_out: Optional[pathlib.Path] = typer.Option(None, "--json",
                                                    help="Also write the metrics as JSON."),
):
    """Train a small CNN on the bundled 8x8 digits, every convolution by convgrad.

    Forward convolutions, data gradients, weight gradients and a transposed
    convolution (oneDNN ConvTranspose, its data gradient and
    ConvTransposeBackpropFilters) are all convgrad calls; a finite-difference
    check runs first.  Needs pip install 'convgrad[cli]'.
    """
    _need_cli_extra("convgrad demo", ("sklearn", "matplotlib"))
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.progress import TimeElapsedColumn

    from . import demo as d

    data = d.load_digits(seed)
    net = d.Net(seed)
    out.print(f"convgrad {convgrad.__version__} demo: {net.describe()}")
    out.print(f"data: scikit-learn 8x8 digits, {len(data.y_train)} training / "
              f"{len(data.y_test)} held-out images")
    fd = d.finite_difference_check(net, data, seed)
    out.print(f"finite-difference check of the ConvTranspose layer's weight gradient "
              f"(float64, {fd.count} entries): max relative error {fd.max_rel:.1e}")
    if fd.max_rel > 1e-5:
        raise Failure(f"finite-difference check: relative error {fd.max_rel:.1e} > 1e-5")
    x, y = data.x_train, data.y_train
    if train_size:
        x, y = x[:train_size], y[:train_size]
    history = []
    columns = (TextColumn("epoch {task.fields[epoch]:>2}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn())
    with Progress(*columns, console=out, transient=False) as progress:
        for epoch in range(1, epochs + 1):
            steps = -(-len(y) // batch)
            task = progress.add_task("train", total=steps, epoch=epoch, loss=float("nan"))
            for loss in d.train_epoch(net, x, y, batch, seed + epoch):
                history.append(loss)
                progress.update(task, advance=1, loss=float(np.mean(history[-steps:])))
    test_loss, acc = d.evaluate(net, data.x_test, data.y_test)
    train_loss, train_acc = d.evaluate(net, x, y)
    d.plot_losses(history, -(-len(y) // batch), plot)
    out.print(f"final training loss {train_loss:.4f} (accuracy {train_acc:.1%}); held-out loss "
              f"{test_loss:.4f}, held-out accuracy {acc:.1%} ({len(data.y_test)} images)")
    out.print(f"loss curve: {escape(str(plot))}")
    if json_out is not None:
        json_out.write_text(json.dumps({
            "losses": history, "steps_per_epoch": -(-len(y) // batch),
            "train_loss": train_loss, "test_loss": test_loss, "test_accuracy": acc,
            "train_accuracy": train_acc, "finite_difference_max_rel": fd.max_rel}))


@app.command()
def examples():
    """Run every spec page's example through convgrad and show how it was checked."""
    from ..examples import main as examples_main
    examples_main()


# ---------------------------------------------------------------------------
# OpenVINO IR
# ---------------------------------------------------------------------------


def _dims(d) -> str:
    return "?" if d is None else "x".join(str(v) for v in d) or "scalar"


_SHORT = {"strides": "s", "pads_begin": "pb", "pads_end": "pe", "dilations": "d",
          "output_padding": "op", "auto_pad": ""}


def _short_attrs(data: dict) -> str:
    return "\n".join(f"{_SHORT.get(k, k + '=')}{v.replace(' ', '')}" for k, v in data.items())


@app.command()
def infer(file: pathlib.Path = typer.Argument(..., help="IR .xml: a whole <net> or bare "
                                              "<layer> elements.")):
    """Infer convolution layers' output shapes and check them against the file.

    Reads a whole IR model or bare <layer> elements (as on the spec pages);
    exits with 1 when an inferred shape differs from the <output> port.
    """
    from . import ir

    rows = ir.infer(ir.load(file))
    if not rows:
        _user_error(f"{file}: no convolution-family layer ({', '.join(ir.CONV_TYPES)})")
    table = Table(title=f"{file.name}: shape inference")
    table.add_column("layer", overflow="fold", min_width=21)
    for col in ("inputs", "attributes", "inferred", "<output>", "status"):
        table.add_column(col, overflow="fold")
    style = {"ok": "green", "MISMATCH": "bold red", "ERROR": "bold red", "skipped": "yellow"}
    for r in rows:
        status = r.status + (f": {r.note}" if r.note and r.status != "ERROR" else "")
        kind = r.layer.type.replace("Convolution", "Conv")
        table.add_row(f"{escape(r.layer.name or r.layer.id)}\n[dim]{escape(kind)}[/]",
                      "\n".join(_dims(s) for s in r.inputs), escape(_short_attrs(r.layer.data)),
                      _dims(r.inferred), _dims(r.declared),
                      f"[{style[r.status]}]{escape(status)}[/]")
    out.print(table)
    for r in rows:
        if r.status == "ERROR":
            out.print(f"[bold red]ERROR[/] {escape(r.note)}")
    bad = [r for r in rows if r.status in ("MISMATCH", "ERROR")]
    if bad:
        raise Failure(f"{len(bad)} of {len(rows)} layers do not match their <output> port "
                      "or break a rule of the op")


@app.command("run")
def run_model(
    model: pathlib.Path = typer.Argument(..., help="IR .xml (its .bin beside it)."),
    inputs: Optional[pathlib.Path] = typer.Option(None, help=".npz with an array per "
                                                  "Parameter name (others are random)."),
    out_file: Optional[pathlib.Path] = typer.Option(None, "--out", help="Write the Result "
                                                    "values (by Result name) to this .npz."),
    seed: int = typer.Option(0, help="Seed of the random inputs."),
    max_elements: int = typer.Option(2**28, min=1, help="Refuse any tensor with more "
                                     "elements (checked before allocating)."),
):
    """Execute an OpenVINO IR model (xml + bin) with given or random inputs.

    Layer types: Parameter, Const, Convolution, GroupConvolution,
    ConvolutionBackpropData, GroupConvolutionBackpropData, Result.
    """
    from . import ir

    given = None
    if inputs is not None:
        try:
            f = np.load(inputs, allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile) as e:
            _user_error(f"--inputs {inputs}: cannot read it as .npz ({e})")
        if not isinstance(f, np.lib.npyio.NpzFile):
            _user_error(f"--inputs {inputs}: a .npy holds one unnamed array; give a .npz "
                        "with one array per Parameter name (numpy.savez)")
        with f:
            given = {k: f[k] for k in f.files}
    used, results = ir.run(ir.load(model), given, seed, max_elements)
    table = Table(title=f"{model.name}: outputs")
    for col in ("Result", "shape", "dtype", "sum", "min", "max"):
        table.add_column(col, overflow="fold")
    for name, a in results.items():
        v = np.asarray(a, np.float64)
        table.add_row(escape(name), _dims(a.shape), str(a.dtype), f"{v.sum():.6g}",
                      f"{v.min():.6g}" if v.size else "-", f"{v.max():.6g}" if v.size else "-")
    out.print("inputs: " + ", ".join(f"{escape(k)} {_dims(v.shape)} {v.dtype}"
                                      + ("" if given and k in given else " (random)")
                                      for k, v in used.items()))
    out.print(table)
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        np.savez(out_file, **results)
        out.print(f"wrote {escape(str(out_file))}")


# ---------------------------------------------------------------------------
# benchdnn-style problems
# ---------------------------------------------------------------------------

_DIR_HELP = "Direction, as benchdnn's --dir: FWD_D, BWD_D (data gradient), BWD_W (weights)."


@app.command("run-problem")
def run_problem(
    problem: str = typer.Argument(..., help="benchdnn problem, e.g. "
                                  "g32mb8ic128ih56oc128oh56kh3ph1"),
    dir: str = typer.Option("FWD_D", "--dir", help=_DIR_HELP),  # noqa: A002
    dtype: str = typer.Option("f32", help="f32, f64, f16 or bf16."),
    algo: str = typer.Option("auto", help="Kernel to force (auto, reference, im2col, ...)."),
    repeats: int = typer.Option(3, min=1, help="Runs; the fastest is reported."),
    seed: int = typer.Option(0, help="Seed of the inputs."),
):
    """Run one convolution problem and print its time and a checksum."""
    from . import problem as pr
    from . import runner

    p = pr.parse(problem)
    kind = pr.direction(dir)
    a, b = runner.inputs(p, kind, runner.np_dtype(dtype), seed)
    result, sec = runner.timed(p, kind, a, b, algo, repeats)
    s = runner.checksum(result)
    out.print(f"problem  {p.canonical()}  (convgrad dilations {list(p.dilations)}, pads_end "
              f"{list(p.pads_end)})")
    roles = {"fwd": ("x", "w", "y"), "dgrad": ("w", "dy", "dx"), "wgrad": ("x", "dy", "dw")}[kind]
    out.print(f"op       {kind} ({dir}), {dtype}, algo {algo}: {roles[0]} {_dims(a.shape)}, "
              f"{roles[1]} {_dims(b.shape)} -> {roles[2]} {_dims(result.shape)}")
    out.print(f"time     {sec * 1e3:.3f} ms (fastest of {repeats}), "
              f"{p.flops() / sec / 1e9:.2f} GFLOP/s")
    out.print(f"checksum sum {s['sum']:.6g}  |sum| {s['abs_sum']:.6g}  min {s['min']:.6g}  "
              f"max {s['max']:.6g}")


@app.command()
def check(
    problems: list[str] = typer.Argument(..., help="One or more benchdnn problems."),
    dir: str = typer.Option("ALL", "--dir", help=_DIR_HELP + " ALL: the three."),  # noqa: A002
    dtype: str = typer.Option("f32", help="f32, f64, f16 or bf16."),
    algo: Optional[str] = typer.Option(None, help="Check only this kernel."),
    seed: int = typer.Option(0, help="Seed of the inputs."),
    peers: bool = typer.Option(True, help="Also compare with PyTorch when it is installed."),
):
    """Compare every kernel, and PyTorch, with the float64 reference kernel.

    Prints a one-line repro command for each failure and exits with 1.
    """
    from . import problem as pr
    from . import runner

    dirs = ["FWD_D", "BWD_D", "BWD_W"] if dir.upper() == "ALL" else [dir]
    parsed = [pr.parse(s) for s in problems]
    kinds = [(d, pr.direction(d)) for d in dirs]
    runner.np_dtype(dtype)
    repro = []
    for p in parsed:
        table = Table(title=f"{p.canonical()} ({dtype}) vs the float64 reference kernel")
        for col in ("dir", "kernel / peer", "max |err|", "bound", "ms", "status"):
            table.add_column(col, overflow="fold")
        for dname, kind in kinds:
            res = runner.check(p, kind, dtype, seed, algo, peers)
            for r in res.rows:
                color = {"ok": "green", "FAIL": "bold red", "skipped": "yellow"}[r.status]
                ms = "-" if r.seconds != r.seconds else f"{r.seconds * 1e3:.2f}"
                table.add_row(dname, r.name, f"{r.max_err:.2e}", f"{r.bound:.2e}", ms,
                              f"[{color}]{r.status}[/]" + (f" {escape(r.note)}" if r.note else ""))
                if r.status == "FAIL":
                    who = f"--algo {r.name}" if r.peer is None else "--peers"
                    repro.append(f"convgrad check {p.canonical()} --dir {dname} --dtype "
                                 f"{dtype} --seed {seed} {who}")
        out.print(table)
    if repro:
        for line in repro:
            out.print(f"repro: {escape(line)}", soft_wrap=True)
        raise Failure(f"{len(repro)} comparison(s) out of tolerance")


# ---------------------------------------------------------------------------
# conformance vectors
# ---------------------------------------------------------------------------


def _compact(value) -> str:
    return str(value).replace(" ", "")


@app.command()
def vectors(
    op: str = typer.Option(..., "--op", help="Spec op name, as in convgrad.op_names() (an "
                           "unknown name lists them), or 'all'."),
    count: int = typer.Option(8, min=1, max=10_000, help="Cases per op."),
    out_dir: pathlib.Path = typer.Option(..., "--out", help="Directory to write into."),
    seed: int = typer.Option(0, help="Seed of the cases and their inputs."),
    dtype: str = typer.Option("float32", help="float32, float64, float16 or bfloat16."),
):
    """Write conformance test vectors (.npz per case plus manifest.json).

    Each case holds the inputs and the expected output, computed by the
    float64 reference kernel; attributes are in the manifest.
    """
    from . import vectors as v

    names = v.all_ops() if op == "all" else [op]
    total = 0
    for name in names:
        manifest = v.write(name, count, out_dir, seed, dtype)
        total += len(manifest["cases"])
        if len(names) > 1:
            out.print(f"{name}: {len(manifest['cases'])} cases")
            continue
        table = Table(title=f"{name} ({dtype}): {manifest['cases'][0]['file'][:-8]}NNNN.npz")
        for col in ("#", "corner", "inputs", "attributes", "output"):
            table.add_column(col, overflow="fold")
        for i, c in enumerate(manifest["cases"]):
            ins = "\n".join(f"{i['name']} {_dims(i['shape'])}" if i["kind"] == "tensor"
                            else f"{i['name']} {_compact(i['value'])}" for i in c["inputs"])
            attrs = " ".join(f"{k}={_compact(v)}" for k, v in c["attributes"].items()
                             if k not in ("dilations", "pads_begin", "pads_end")
                             or set(v) != {1 if k == "dilations" else 0})
            table.add_row(str(i), c["corner"], ins, attrs.replace(" ", "\n"),
                          _dims(c["output_shape"]))
        out.print(table)
    out.print(f"wrote {total} cases and manifest.json to {escape(str(out_dir))}")


# -- the benchmark ---------------------------------------------------------------

@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "help_option_names": []})
def bench(ctx: typer.Context):
    """Time convgrad against the installed peer frameworks on the layer suite.

    Same run, round-robin, medians; writes benchmark.json/.md/.png.  Options
    are those of ``python -m convgrad.bench`` (``convgrad bench --help``).
    """
    import argparse

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn

    from ..bench.__main__ import DESCRIPTION, add_arguments, run_args

    parser = add_arguments(argparse.ArgumentParser(prog="convgrad bench",
                                                   description=DESCRIPTION))
    try:
        args = parser.parse_args(ctx.args)
    except SystemExit as exc:                  # --help, or a usage error argparse printed
        raise typer.Exit(0 if exc.code in (0, None) else 2) from None
    if args.list:
        raise typer.Exit(run_args(args))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task("benchmark", total=None)

        def progress(done, total, label):
            bar.update(task, completed=done, total=total,
                       description=escape(f"benchmark: {label}"))

        code = run_args(args, progress=progress)
    raise typer.Exit(code)
