"""The README's Python examples run, and the results their comments claim hold."""

import ast
import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run_and_show_true_results():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 5
    env, claims = {}, 0
    for block in blocks:
        lines = block.splitlines()
        for stmt in ast.parse(block).body:
            src = ast.get_source_segment(block, stmt)
            comment = lines[stmt.end_lineno - 1].partition("#")[2].strip()
            if isinstance(stmt, ast.Expr) and re.fullmatch(r"\(.*\)", comment):
                assert eval(src, env) == eval(comment), src     # "expr  # (1, 2, 3)"
                claims += 1
            else:
                exec(src, env)
    assert claims >= 5
    assert np.ndim(env["dw"]) == 4
