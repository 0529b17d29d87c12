"""The README's Python example runs as written and does what its comments say."""

import pathlib
import re

import torch

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_an_example():
    assert python_blocks(), "README.md lost its Python example"


def test_readme_examples_run(capsys):
    for block in python_blocks():
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
        strategy = namespace.get("strategy")
        if strategy is not None and hasattr(strategy, "_replicas") and "model" in namespace:
            components = strategy._replicas._components
            for replicas in components:  # every replica holds the same parameters
                assert all(torch.equal(replicas[0], other) for other in replicas[1:])
    assert "mean loss over one epoch" in capsys.readouterr().out
