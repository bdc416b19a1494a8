"""Check that two versions of jaxmigrate give the same results, file by file.

    python benchmarks/equivalence.py record OUT.json TREE [TREE ...] [--jobs 2]
    python benchmarks/equivalence.py compare BEFORE.json AFTER.json

`record` migrates every `.py` and `.ipynb` file under each TREE in memory (nothing is written,
no result cache), under three settings: the default (unsafe sites found, not applied: the
engine re-runs the passes for the safe ones), `--unsafe-fixes` (every rewrite applied) and
`--unsafe-fixes --pmap-style faithful`. For each file and setting it keeps the bucket, the
reason, every field of every site and skip, the new text and the project files it brings, and
writes them to OUT.json. Run it once with each version's interpreter (the old one's virtual
environment, then yours), on the same trees, then `compare` the two: it lists every file whose
record differs and exits 1 if any does.

Speed work on the engine (prefilter, parsing, analyses) must leave every output identical; this
is how that is checked over a large tree (JAX's sources) and the test fixtures.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import multiprocessing
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "unsafe-fixes": {"unsafe_fixes": True},
    "faithful": {"unsafe_fixes": True, "pmap_style": "faithful"},
}


def _plain(value: Any) -> Any:
    """A JSON form of a result's field (dataclasses, enums, sets, mappings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, (frozenset, set)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    return value


def _files(tree: Path) -> Iterator[Path]:
    for path in sorted(tree.rglob("*")):
        if path.suffix in (".py", ".ipynb") and path.is_file() and not path.is_symlink():
            yield path


def _record(job: tuple[str, str, str]) -> tuple[str, str, dict[str, Any]]:
    from jaxmigrate.model import Options
    from jaxmigrate.pipeline.files import process_file
    from jaxmigrate.pipeline.project import Project

    root, path, setting = job
    result = process_file(Path(path), Options(**SETTINGS[setting]), project=Project())
    data = _plain(result)
    data.pop("old_text", None)  # the file itself
    data["path"] = str(Path(path).relative_to(root))
    return data["path"], setting, data


def record(out: Path, trees: list[Path], jobs: int) -> None:
    work = [
        (str(tree), str(path), setting)
        for tree in trees
        for path in _files(tree)
        for setting in SETTINGS
    ]
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs) as pool:
        found = pool.map(_record, work, chunksize=4)
    results: dict[str, dict[str, Any]] = {}
    for (tree, _, _), (shown, setting, data) in zip(work, found, strict=True):
        results.setdefault(f"{Path(tree).name}/{shown}", {})[setting] = data
    out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    sites = sum(len(r["default"]["sites"]) for r in results.values())
    changed = sum(r["unsafe-fixes"]["bucket"] == "changed" for r in results.values())
    print(f"{out}: {len(results)} files, {sites} sites, {changed} changed with --unsafe-fixes")


def compare(before: Path, after: Path) -> int:
    old = json.loads(before.read_text(encoding="utf-8"))
    new = json.loads(after.read_text(encoding="utf-8"))
    differ = 0
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new:
            print(f"{name}: only in {'after' if name in new else 'before'}")
            differ += 1
            continue
        for setting in SETTINGS:
            a, b = old[name].get(setting), new[name].get(setting)
            if a != b:
                keys = sorted(
                    k for k in set(a or {}) | set(b or {}) if (a or {}).get(k) != (b or {}).get(k)
                )
                print(f"{name} [{setting}]: {', '.join(keys)} differ")
                differ += 1
    total = len(set(old) | set(new))
    print(f"{total} files x {len(SETTINGS)} settings compared: {differ} difference(s)")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("trees", type=Path, nargs="+")
    rec.add_argument("--jobs", type=int, default=2)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, [t.resolve() for t in args.trees], args.jobs)
    else:
        sys.exit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
