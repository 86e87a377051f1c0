"""``features kernels``: inspect a schema's compiled transform program.

``features kernels --schema NAME`` prints each derived feature, its steps, output
columns and dtypes, and the device ``FEATURES_DEVICE`` resolves to;
``--show-source`` prints the generated CuPy kernel instead (no GPU needed).
NAME is a schema name in the schemas folder (``Settings.schemas_dir``) or a path to
a YAML file.

Exit codes: 0 success; 2 a schema that does not parse or compile, or a GPU requested
(``--device gpu``) where none is usable.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from features.cli import COMMANDS
from features.config import resolve_settings
from features.kernels.cupy_backend import generate_source
from features.kernels.ops import plan_program
from features.kernels.program import arrow_dtype, compile_transforms
from features.schema.parse import load_schema


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``kernels`` on the ``features`` parser."""
    parser = subparsers.add_parser(
        "kernels",
        help=COMMANDS["kernels"].summary,
        description="Compile a schema's derived features and show the program: each feature's "
        "steps and output columns, the device it runs on, or (--show-source) the generated "
        "fused CuPy kernel.",
    )
    parser.add_argument("--schema", required=True, metavar="NAME",
                        help="schema name in the schemas folder, or a path to a YAML file")
    parser.add_argument("--show-source", action="store_true", help="print the generated CUDA kernel source")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None,
                        help="override FEATURES_DEVICE for this command")
    parser.set_defaults(func=run_kernels)


def _schema_path(name: str, schemas_dir: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    for suffix in (".yaml", ".yml"):
        candidate = Path(schemas_dir) / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return Path(schemas_dir) / f"{name}.yaml"


def run_kernels(args: argparse.Namespace) -> int:
    """Print the program or its kernel source; returns the exit code (module docstring)."""
    settings = resolve_settings(device=args.device)
    schema = load_schema(_schema_path(args.schema, settings.schemas_dir))
    if args.show_source:
        print(generate_source(plan_program(schema)).render(), end="")
        return 0
    program = compile_transforms(schema, device=settings.device)
    print(f"schema {schema.name} {schema.version_str}: {len(program.plan.features)} feature(s), "
          f"device {program.device} (FEATURES_DEVICE={settings.device})")
    for fp in program.plan.features:
        steps = " -> ".join(s.op for s in fp.feature.steps)
        where = "host" if fp.one_hot is not None else "kernel"
        print(f"  {fp.name} <- {fp.feature.source}: {steps} [{where}, on_invalid {fp.feature.on_invalid}]")
        for col in fp.columns:
            print(f"    {col.name}: {col.dtype} ({arrow_dtype(col.dtype)})")
    return 0
