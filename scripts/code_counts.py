"""Count what issue 50 measures in the product's source, with Python's ``ast``.

    python scripts/code_counts.py              # the counts as JSON on stdout
    python scripts/code_counts.py --list NAME  # the places behind one count (file:line)

The rules, so that two runs (before and after a change) count the same things:

- **The product** is the packages ``serving``, ``tasks``, ``registry``, ``flows`` and
  ``specops``: every ``.py`` file under them except protoc's generated modules
  (``*_pb2.py``, ``*_pb2_grpc.py``). Tests, ``benchmarks/`` (the studies) and ``scripts/``
  are not counted.
- **A parameter** is any argument of a ``def`` or ``async def`` (positional, keyword-only,
  ``*args`` and ``**kwargs`` included, ``self``/``cls`` never matter here because of their
  names), lambdas excepted.
- **Untyped target/model parameters** (``untyped_target_params``, ``untyped_model_params``):
  parameters named exactly ``target`` or ``model`` without an annotation;
  ``any_target_model_params``: those two names annotated ``Any`` (or ``typing.Any``).
- **``hardware: str`` parameters** (``hardware_str_params``, per package in
  ``hardware_str_params_by_package``): parameters named ``hardware`` annotated ``str``,
  ``str | None`` or ``Optional[str]``; ``hardware_str_fields``: the same annotation on a
  class-level field named ``hardware`` (a dataclass's or pydantic model's).
  ``hardware_cpu_defaults``: of those parameters and fields, the ones whose default is the
  literal ``"cpu"``.
- **Literals**: ``smollm2_literals`` counts the string constant ``"smollm2"``;
  ``cost_policy_defaults`` the defaults (of parameters and class fields) equal to ``"cost"``
  for a name containing ``policy``; ``k10_defaults`` the defaults equal to ``10`` for a name
  ``k`` or ending in ``_k``.
- **Spec splits** (``spec_partitions``, per module in ``spec_partition_modules``): calls
  ``X.partition(":")``.
- **Decoder constructions** (``decoder_constructions``): calls of a name or attribute
  ``SpeculativeDecoder``.
- **Draft reference types** (``draft_reference_types``): which of the classes that name a
  draft or a champion (``REFERENCE_TYPES`` below) are still defined.
- **Function length** (``functions_over_80``, ``longest_functions``): a function's body lines
  after its docstring, as the formatter lays the file out: the file with every
  ``# fmt: skip`` marker removed, formatted by ``ruff format`` (the project's settings), then
  from the first statement after the docstring to the function's last line, blank and
  comment lines inside included; a nested function counts in its own right and inside its
  parent.
- **Module length** (``modules_over_500``): physical lines of a file.
- **``dict[str, Any]``** (``dict_str_any_in_tasks``): subscripts ``dict[str, Any]`` (or
  ``Dict[...]``) anywhere in ``tasks/``, annotations and expressions alike.
- **``# fmt: skip``** (``fmt_skip``): lines of the product carrying the marker.
- **Packages** (``folders_without_init``): folders of the product holding ``.py`` files
  but no ``__init__.py`` (import-linter does not see them).
- **docs/** (``docs_non_pages``): files under ``docs/`` that are not Markdown pages.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("serving", "tasks", "registry", "flows", "specops")
REFERENCE_TYPES = (
    "DraftVersion",
    "ServingChampion",
    "ChampionRef",
    "LoadedDraft",
    "DraftRef",
    "RegisteredDraft",
    "DraftManifest",
    "Contender",
    # Added with the change itself: the serving champion that replaced ServingChampion,
    # ChampionRef and LoadedDraft (counted so the after-count is honest).
    "Champion",
)
FUNCTION_LIMIT = 80
MODULE_LIMIT = 500


def product_files(root: Path = ROOT) -> list[Path]:
    files = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            files.append(path)
    return files


def _is_any(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "Any"
    if isinstance(node, ast.Attribute):
        return node.attr == "Any"
    return isinstance(node, ast.Constant) and node.value == "Any"


def _is_str(node: ast.expr | None) -> bool:
    """``str``, ``str | None``, ``Optional[str]`` (or their string forms)."""
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value.replace(" ", "")
        return text in ("str", "str|None", "None|str", "Optional[str]")
    if isinstance(node, ast.Name):
        return node.id == "str"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = (node.left, node.right)
        return any(_is_str(s) for s in sides) and all(
            _is_str(s) or (isinstance(s, ast.Constant) and s.value is None) for s in sides
        )
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        return node.value.id == "Optional" and _is_str(node.slice)
    return False


def _params_with_defaults(args: ast.arguments) -> list[tuple[ast.arg, ast.expr | None]]:
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    pairs = list(zip(positional, defaults, strict=True))
    pairs += list(zip(args.kwonlyargs, args.kw_defaults, strict=True))
    pairs += [(a, None) for a in (args.vararg, args.kwarg) if a is not None]
    return pairs


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    end = node.end_lineno or body[-1].end_lineno or body[-1].lineno
    return end - body[0].lineno + 1


def formatted(text: str, relative: str) -> str:
    """``text`` as ``ruff format`` lays it out with its ``# fmt: skip`` markers removed."""
    unskipped = re.sub(r"\s*# fmt: skip", "", text)
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", relative, "-"],
        input=unskipped,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff format failed on {relative}: {done.stderr.strip()}")
    return done.stdout


def _is_dict_str_any(node: ast.Subscript) -> bool:
    if not (isinstance(node.value, ast.Name) and node.value.id in ("dict", "Dict")):
        return False
    if not isinstance(node.slice, ast.Tuple) or len(node.slice.elts) != 2:
        return False
    key, value = node.slice.elts
    return isinstance(key, ast.Name) and key.id == "str" and _is_any(value)


class Counts:
    def __init__(self) -> None:
        self.numbers: Counter[str] = Counter()
        self.places: dict[str, list[str]] = defaultdict(list)

    def add(self, name: str, where: str) -> None:
        self.numbers[name] += 1
        self.places[name].append(where)


def _default_value(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def count_file(path: Path, counts: Counts, lengths: list[tuple[int, str]]) -> None:
    relative = path.relative_to(ROOT).as_posix()
    package = relative.split("/", 1)[0]
    text = path.read_text()
    tree = ast.parse(text, filename=relative)
    lines = text.splitlines()
    if len(lines) > MODULE_LIMIT:
        counts.add("modules_over_500", f"{relative} ({len(lines)} lines)")
    for number, line in enumerate(lines, 1):
        if "# fmt: skip" in line:
            counts.add("fmt_skip", f"{relative}:{number}")
    for node in ast.walk(ast.parse(formatted(text, relative))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            size = _body_lines(node)
            lengths.append((size, f"{relative} {node.name}"))
            if size > FUNCTION_LIMIT:
                counts.add("functions_over_80", f"{relative} {node.name} ({size})")
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg, default in _params_with_defaults(node.args):
                _count_param(arg, default, package, counts, f"{relative}:{arg.lineno}")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if name == "hardware" and _is_str(node.annotation):
                counts.add("hardware_str_fields", where)
                if _default_value(node.value) == "cpu":
                    counts.add("hardware_cpu_defaults", where)
            _count_defaults(name, node.value, counts, where)
        elif isinstance(node, ast.Constant) and node.value == "smollm2":
            counts.add("smollm2_literals", where)
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "partition"
                and len(node.args) == 1
                and _default_value(node.args[0]) == ":"
            ):
                counts.add("spec_partitions", where)
                counts.places["spec_partition_modules"].append(relative)
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called == "SpeculativeDecoder":
                counts.add("decoder_constructions", where)
        elif isinstance(node, ast.Subscript) and package == "tasks" and _is_dict_str_any(node):
            counts.add("dict_str_any_in_tasks", where)
        elif isinstance(node, ast.ClassDef) and node.name in REFERENCE_TYPES:
            counts.add("draft_reference_types", f"{node.name} ({where})")


def _count_param(
    arg: ast.arg, default: ast.expr | None, package: str, counts: Counts, where: str
) -> None:
    name = arg.arg
    if name in ("target", "model"):
        if arg.annotation is None:
            counts.add(f"untyped_{name}_params", where)
        elif _is_any(arg.annotation):
            counts.add("any_target_model_params", where)
    if name == "hardware" and _is_str(arg.annotation):
        counts.add("hardware_str_params", where)
        counts.add(f"hardware_str_params_in_{package}", where)
        if _default_value(default) == "cpu":
            counts.add("hardware_cpu_defaults", where)
    _count_defaults(name, default, counts, where)


def _count_defaults(name: str, default: ast.expr | None, counts: Counts, where: str) -> None:
    value = _default_value(default)
    if "policy" in name and value == "cost":
        counts.add("cost_policy_defaults", where)
    if (name == "k" or name.endswith("_k")) and value == 10 and not isinstance(value, bool):
        counts.add("k10_defaults", where)


def folders_without_init(root: Path = ROOT) -> list[str]:
    missing = []
    for package in PACKAGES:
        for folder in sorted({p.parent for p in (root / package).rglob("*.py")}):
            if not (folder / "__init__.py").is_file():
                missing.append(folder.relative_to(root).as_posix())
    return missing


def docs_non_pages(root: Path = ROOT) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in (root / "docs").rglob("*")
        if p.is_file() and p.suffix != ".md"
    )


def measure(root: Path = ROOT) -> tuple[dict[str, object], dict[str, list[str]]]:
    counts = Counts()
    lengths: list[tuple[int, str]] = []
    for path in product_files(root):
        count_file(path, counts, lengths)
    places = dict(counts.places)
    places["folders_without_init"] = folders_without_init(root)
    places["docs_non_pages"] = docs_non_pages(root)
    lengths.sort(reverse=True)
    numbers: dict[str, object] = {
        name: counts.numbers.get(name, 0)
        for name in (
            "untyped_target_params",
            "untyped_model_params",
            "any_target_model_params",
            "hardware_str_params",
            "hardware_str_params_in_serving",
            "hardware_str_params_in_tasks",
            "hardware_str_fields",
            "hardware_cpu_defaults",
            "smollm2_literals",
            "cost_policy_defaults",
            "k10_defaults",
            "spec_partitions",
            "decoder_constructions",
            "functions_over_80",
            "modules_over_500",
            "dict_str_any_in_tasks",
            "fmt_skip",
        )
    }
    numbers["spec_partition_modules"] = sorted(set(places.get("spec_partition_modules", [])))
    numbers["draft_reference_types"] = sorted(
        {entry.split(" ")[0] for entry in places.get("draft_reference_types", [])}
    )
    numbers["folders_without_init"] = places["folders_without_init"]
    numbers["docs_non_pages"] = len(places["docs_non_pages"])
    numbers["longest_functions"] = [f"{where} ({size})" for size, where in lengths[:5]]
    return numbers, places


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", metavar="NAME", help="print the places behind one count")
    args = parser.parse_args(argv)
    numbers, places = measure()
    if args.list:
        if args.list not in places:
            known = ", ".join(sorted(places))
            print(f"no count {args.list!r}; counts with places: {known}", file=sys.stderr)
            return 2
        print("\n".join(places[args.list]))
        return 0
    print(json.dumps(numbers, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
