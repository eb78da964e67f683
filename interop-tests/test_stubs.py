"""The .pyi stubs describe the compiled module: same public names, same class members."""

import ast
import pathlib

import cubridge
from cubridge import _cubridge

STUB = pathlib.Path(cubridge.__file__).with_name("_cubridge.pyi")


def stub_tree():
    return ast.parse(STUB.read_text())


def test_stub_names_match_the_module():
    tree = stub_tree()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if not node.target.id.startswith("__") or node.target.id == "__version__":
                names.add(node.target.id)
    runtime = {n for n in dir(_cubridge) if not n.startswith("__") or n == "__version__"}
    assert names == runtime


def test_stub_class_members_exist():
    for node in stub_tree().body:
        if isinstance(node, ast.ClassDef):
            cls = getattr(_cubridge, node.name)
            for member in node.body:
                if isinstance(member, ast.FunctionDef) and member.name != "__init__":
                    # Properties that only exist for some arrays (device memory) are class
                    # attributes all the same.
                    assert member.name in dir(cls), f"{node.name}.{member.name}"
