"""Every code block of README.md stays true: python blocks run, bash commands are checked.

Python blocks run in order in one namespace, in a scratch folder that has the
repository's ``../shared`` beside it (as a clone has), so relative data paths work
as a reader would type them. Bash blocks are not run (they install, or run long
benchmarks); each command is checked instead: ``pip install`` names existing
extras, ``python SCRIPT ARGS`` and ``torchrun ... SCRIPT ARGS`` name a script
whose ``parse_args`` accepts ARGS, ``python -m MODULE`` names an importable module,
and pytest's markers exist. .ci/run installs exactly as the README says.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHARED_DATA = Path(os.environ.get("NEUROVEC_DATA", ROOT.parent / "shared" / "data"))  # the one data variable


def blocks(language: str) -> list[tuple[str, str]]:
    """``(section title, code)`` of every fenced block in ``language``, in order."""
    found, section = [], ""
    for match in re.finditer(r"^## ([^\n]*)$|^```(\w*)\n(.*?)^```$", README.read_text(), re.M | re.S):
        if match.group(1) is not None:
            section = match.group(1).strip()
        elif match.group(2) == language:
            found.append((section, match.group(3)))
    return found


def commands(code: str) -> list[list[str]]:
    """The commands of a bash block, comments dropped, one argv per line."""
    argvs = []
    for line in re.sub(r"\\\n", " ", code).splitlines():  # join continued lines first
        argv = shlex.split(line, comments=True)
        if argv:
            argvs.append(argv)
    return argvs


def test_python_blocks_run(tmp_path, monkeypatch):
    pytest.importorskip("torch_geometric")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("neuralogic")
    if shutil.which("java") is None:
        pytest.skip("the NeuraLogic block needs Java")
    if not SHARED_DATA.is_dir():
        pytest.skip(f"no shared data at {SHARED_DATA}")
    (tmp_path / "shared").symlink_to(SHARED_DATA.parent)
    work = tmp_path / "neurovec"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("NEUROVEC_DATA", raising=False)
    namespace: dict = {"__name__": "readme"}
    code_blocks = blocks("python")
    assert len(code_blocks) >= 5
    for section, code in code_blocks:
        try:
            exec(compile(code, f"README.md ({section})", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"README.md section {section!r}: a python block fails: {error!r}\n{code}") from error
    # Re-running the whole README works too (e.g. create_database on an existing file).
    for section, code in code_blocks:
        if "create_database" in code:
            exec(compile(code, f"README.md ({section})", "exec"), namespace)


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _torch_pin() -> str:
    install = next(code for section, code in blocks("bash") if section == "Install")
    return next(arg for argv in commands(install) for arg in argv if arg.startswith("torch=="))


def _check_script(script: Path, args: list[str], where: str) -> None:
    assert script.is_file(), f"{where}: no script {script}"
    name = f"readme_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses in the script look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    parse = getattr(module, "parse_args", None)
    assert parse is not None, f"{where}: {script.name} has no parse_args(argv) to check its arguments with"
    try:
        parse(args)
    except SystemExit as error:
        raise AssertionError(f"{where}: {script.name} rejects the arguments {args}") from error


def _check(argv: list[str], where: str, env: dict) -> None:
    program, args = argv[0], argv[1:]
    if program == "export":
        for assignment in args:
            name, _, value = assignment.partition("=")
            env[name] = value
            if "/" in value:
                assert (ROOT / value).exists() or not SHARED_DATA.is_dir(), f"{where}: {value} does not exist"
        return
    if program == "pip":
        assert args[0] == "install", f"{where}: only pip install is expected"
        for arg in args[1:]:
            if "[" in arg:
                names = set(arg[arg.index("[") + 1:arg.index("]")].split(","))
                assert names <= _extras(), f"{where}: unknown extras {sorted(names - _extras())}"
            elif arg.startswith("torch"):
                assert arg == _torch_pin(), f"{where}: {arg} differs from the install section's {_torch_pin()}"
        return
    if program == "torchrun":
        script = next(a for a in args if a.endswith(".py"))
        _check_script(ROOT / script, args[args.index(script) + 1:], where)
        return
    if program == "python":
        if args[:1] == ["-m"]:
            module, rest = args[1], args[2:]
            if module == "pytest":
                markers = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
                                   ["ini_options"]["markers"])
                for k, arg in enumerate(rest):
                    if arg == "-m":
                        for word in re.findall(r"\w+", rest[k + 1]):
                            assert word in ("not", "and", "or") or f"{word}:" in markers, f"{where}: marker {word}"
                return
            assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
            main = ROOT / Path(*module.split(".")[1:]).with_suffix(".py")
            if main.is_file():
                _check_script(main, rest, where)
            return
        _check_script(ROOT / args[0], args[1:], where)
        return
    raise AssertionError(f"{where}: tests/test_readme.py does not know how to check {program!r}; teach it")


def test_bash_commands_are_valid(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT.parent))
    env: dict = {}
    bash = blocks("bash")
    assert bash
    for section, code in bash:
        for argv in commands(code):
            _check(argv, f"README.md ({section}): {' '.join(argv)}", env)


def test_ci_installs_as_the_readme_says():
    install = [code for section, code in blocks("bash") if section == "Install"]
    assert len(install) == 1, "README.md's Install section has one bash block: the install commands"
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    readme_lines = [line.split("#")[0].strip() for line in install[0].splitlines() if line.split("#")[0].strip()]
    positions = [ci_lines.index(line) if line in ci_lines else -1 for line in readme_lines]
    assert -1 not in positions and positions == sorted(positions), (
        f".ci/run must run README.md's install commands in order: {readme_lines}")
    test_command = [code for section, code in blocks("bash") if section == "Tests"][0].strip()
    assert test_command in ci_lines


def test_packaging_lists_every_package():
    """A non-editable install carries every subpackage (e.g. neurovec.benchmarks for benchmark.py)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"neurovec"} | {"neurovec." + ".".join(p.parent.relative_to(ROOT).parts)
                            for p in ROOT.rglob("__init__.py")
                            if p.parent != ROOT and p.parent.relative_to(ROOT).parts[0] not in ("tests", "build")
                            and not any(part.startswith(".") for part in p.parent.relative_to(ROOT).parts)}
    assert found == listed, f"pyproject.toml packages: missing {sorted(found - listed)}, extra {sorted(listed - found)}"


def test_semantics_section_matches_the_docs_and_runs():
    """README.md's "NeuraLogic semantics for PyG users" is docs/relational.md's section, word for word, and its block
    runs (an unhidden edge adds its value 1 to every feature; a hidden one gives PyG's sum of neighbours)."""
    heading = "## NeuraLogic semantics for PyG users"
    section = lambda text: re.search(re.escape(heading) + r"\n(.*?)(?=^## |\Z)", text, re.S | re.M)  # noqa: E731
    readme = section(README.read_text())
    if readme is None:
        pytest.skip("README.md has no section 'NeuraLogic semantics for PyG users' yet (the lead pastes it)")
    docs = section((ROOT / "docs" / "relational.md").read_text())
    assert readme.group(1).strip() == docs.group(1).strip()
    code = re.search(r"```python\n(.*?)```", readme.group(1), re.S).group(1)
    exec(compile(code, "README.md (NeuraLogic semantics for PyG users)", "exec"), {})


#: A repository path in backticks: a top-level folder of the package, then a file.
_PATH = re.compile(r"`((?:compiler|engines|sources|datasets|benchmarks|tests|examples|docs)/[\w./-]+\.(?:py|cpp|h|md|json|sh))`")


@pytest.mark.parametrize("doc", ["README.md"] + sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_files_the_docs_name_exist(doc):
    """A file named in README.md or docs/ (as `engines/native_ops.cpp`) is in the repository: README.md named
    engines/native_kernels.h for months after it was folded into native_ops.cpp."""
    text = (README if doc == "README.md" else ROOT / "docs" / doc).read_text()
    missing = sorted({m for m in _PATH.findall(text) if not (ROOT / m).exists()})
    assert not missing, f"{doc} names files that do not exist: {missing}"
