"""The .pyi stubs describe the compiled module: same public names, same class members."""

import ast
import builtins
import inspect
import pathlib
import re

import cubridge
import pytest
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


# Public callables that raise on no argument they accept.
RAISE_NOTHING = {
    "cuda.is_available",
    "cuda.device_count",
    "cuda.shipped_kernels",
    "cuda.loaded_programs",
    "cuda.wait_for_compiles",
}
# Classes that are not called to make instances: exceptions, and Array (made by functions).
NOT_CALLED = {"CudaError", "CompileError", "CudaUnavailableError", "Array"}


def public_objects():
    """(name, object whose docstring help() shows) for every public name."""
    for name in cubridge.__all__:
        obj = getattr(cubridge, name)
        if isinstance(obj, str):  # __version__
            continue
        if isinstance(obj, cubridge.dtype):  # help(cubridge.float32) shows the class's
            obj = type(obj)
        yield name, obj
    for name in cubridge.cuda.__all__:
        yield f"cuda.{name}", getattr(cubridge.cuda, name)


@pytest.mark.parametrize("name, obj", list(public_objects()))
def test_public_names_have_a_docstring_with_an_example(name, obj):
    doc = inspect.getdoc(obj)
    assert doc, name
    assert any(line.lstrip().startswith(">>>") for line in doc.splitlines()), name
    if callable(obj) and name not in RAISE_NOTHING | NOT_CALLED:
        assert "Raises" in doc, name
        # Every exception named there is a real class: builtins or cubridge's.
        for raised in re.findall(r"^\s*(\w+Error)\b", doc.split("Raises", 1)[1], re.M):
            assert isinstance(getattr(builtins, raised, None) or getattr(cubridge, raised), type)
    if callable(obj) and name not in NOT_CALLED:
        inspect.signature(obj)  # help() shows the parameters


@pytest.mark.parametrize("kernel", ["ElementwiseKernel", "RawKernel"])
def test_kernel_calls_are_documented(kernel):
    """CPython gives a slot method such as ``__call__`` its own fixed docstring ("Call self as
    a function."), so the call is documented where help(kernel) shows it: the class's."""
    doc = inspect.getdoc(getattr(cubridge, kernel))
    call = doc.split("Calling", 1)
    assert len(call) == 2, kernel
    assert "stream=None" in call[1] and "Raises" in call[1] and ">>>" in call[1]
