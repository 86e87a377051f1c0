"""What both fuzz targets share: the corpus, the mutations, the limits and the report.

A target (``fuzz_schema.py``, ``fuzz_decoder.py``) supplies a :class:`Target`: how to
run a group of inputs through the library and check what came back, plus its own
structure-aware mutation and generator. This module runs the loop:

1. every corpus file once (``fuzz/corpus/<target>/``), then
2. generated inputs until ``--inputs`` is reached: a corpus seed mutated structurally
   (parsed, one node changed, written back), token-wise (a word swapped for a hostile
   token), byte-wise (flips, insertions, deletions, truncation, splices), or a fresh
   input from the target's grammar, or a huge one (deep nesting, giant scalars).

What counts as a crash (the worker exits non-zero at the first one and saves the input
under ``fuzz/crashes/``):

- any exception that is not the outcome the library promises (the target decides), or
  a broken promise the target checks (:class:`FuzzFailure`);
- a hang: one group of inputs running past ``--timeout`` seconds. ``faulthandler``'s
  watchdog thread kills the worker even inside a C call that holds the GIL, so the
  loop runs in a child process and the parent saves the input in flight;
- memory: peak RSS above ``--max-rss-mb`` (checked after every group), or a
  MemoryError under the address-space limit the worker sets (a few times that bound);
- the worker dying any other way (a segfault, the OOM killer).

The mutations use :mod:`random` with a fixed ``--seed``, so a run is reproducible.
"""

from __future__ import annotations

import argparse
import base64
import faulthandler
import hashlib
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

FUZZ_DIR = Path(__file__).resolve().parent
ROOT = FUZZ_DIR.parent
CRASH_DIR = FUZZ_DIR / "crashes"
#: the worker's exit code after it saved a crash itself
EXIT_CRASH = 2


class FuzzFailure(Exception):
    """The library broke one of its promises (a target's own check), without raising."""


class Target(Protocol):
    """One fuzz target. ``run`` raises on a crash and returns outcome counts otherwise."""

    name: str
    #: how many inputs one call of ``run`` takes (a schema: 1; Kafka records: a micro-batch)
    group_sizes: tuple[int, int]
    #: hostile tokens for the token and byte mutations
    tokens: Sequence[bytes]
    #: how often each strategy runs: structure, tokens, bytes, splice, generate, huge
    weights: tuple[float, float, float, float, float, float]
    #: the default --timeout: seconds one group may take before it counts as a hang
    timeout_s: float

    def run(self, group: Sequence[bytes]) -> Counter[str]: ...

    def mutate_structured(self, data: bytes, rng: random.Random) -> bytes | None: ...

    def generate(self, rng: random.Random) -> bytes: ...

    def generate_huge(self, rng: random.Random) -> bytes: ...


# --------------------------------------------------------------------------- corpus files


def encode_group(group: Sequence[bytes]) -> bytes:
    """One input as its raw bytes; several as ``{"inputs": [base64, ...]}`` (a ``.batch.json``)."""
    if len(group) == 1:
        return group[0]
    return json.dumps({"inputs": [base64.b64encode(g).decode("ascii") for g in group]}).encode()


def read_corpus(directory: Path) -> list[tuple[str, list[bytes]]]:
    """Every file under ``directory`` (sorted) as ``(name, group)``: a ``.batch.json`` file
    is one group of several inputs, any other file one input."""
    out: list[tuple[str, list[bytes]]] = []
    if not directory.is_dir():
        return out
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name.endswith(".batch.json"):
            group = [base64.b64decode(s) for s in json.loads(data)["inputs"]]
        else:
            group = [data]
        out.append((str(path.relative_to(directory)), group))
    return out


def save_crash(target: str, group: Sequence[bytes], kind: str) -> Path:
    """Write a crashing input (or group) under ``fuzz/crashes/``; returns its path."""
    CRASH_DIR.mkdir(exist_ok=True)
    blob = encode_group(group)
    digest = hashlib.sha256(blob).hexdigest()[:12]
    suffix = ".bin" if len(group) == 1 else ".batch.json"
    path = CRASH_DIR / f"{target}-{kind}-{digest}{suffix}"
    path.write_bytes(blob)
    return path


#: corpus files longer than this are run as they are but not mutated: a mutant of a
#: 40 KB schema costs seconds, and the huge generator covers the size dimension
MAX_SEED_BYTES = 8 * 1024


def mutation_seeds(corpus: Sequence[tuple[str, list[bytes]]]) -> list[bytes]:
    return [g for _, group in corpus for g in group if len(g) <= MAX_SEED_BYTES]


# --------------------------------------------------------------------------- mutations

_WORD = re.compile(rb"[A-Za-z0-9_.+\-:]+")
#: byte values that trip decoders: NUL, DEL, a lone UTF-8 lead/continuation byte,
#: an overlong encoding, an encoded surrogate, a BOM, line ends and tabs.
HOSTILE_BYTES: tuple[bytes, ...] = (
    b"\x00", b"\x7f", b"\xff", b"\xc3", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xef\xbb\xbf",
    b"\r", b"\r\n", b"\t", b"\x0b", b"\x1b", b"\xe2\x80\xa8", b"\xf4\x90\x80\x80",
)


_STRATEGIES = ("structure", "tokens", "bytes", "splice", "generate", "huge")


@dataclass
class Mutator:
    """Turns corpus seeds into new inputs (see the module docstring)."""

    seeds: list[bytes]
    rng: random.Random
    target: Target
    max_len: int
    huge: bool = True
    used: Counter[str] = field(default_factory=Counter)

    def next(self) -> bytes:
        rng = self.rng
        weights = self.target.weights if self.huge else (*self.target.weights[:5], 0.0)
        strategy = rng.choices(_STRATEGIES, weights=weights)[0]
        seed = rng.choice(self.seeds) if self.seeds else b""
        out: bytes | None
        if strategy == "huge":
            self.used["huge"] += 1
            return self.target.generate_huge(rng)
        if strategy == "structure":
            kind, out = "structure", self.target.mutate_structured(seed, rng)
            if out is None:
                kind, out = "tokens", self.tokens(seed)
        elif strategy == "tokens":
            kind, out = "tokens", self.tokens(seed)
        elif strategy == "bytes":
            kind, out = "bytes", self.bytes_ops(seed, rng.randint(1, 6))
        elif strategy == "splice":
            kind, out = "splice", self.splice(seed, rng.choice(self.seeds) if self.seeds else b"")
        else:
            kind, out = "generate", self.target.generate(rng)
        if rng.random() < 0.15:
            out = self.bytes_ops(out, 1)
            kind += "+bytes"
        self.used[kind] += 1
        return out[: self.max_len]

    def tokens(self, data: bytes) -> bytes:
        """Swap one to three words for hostile tokens (or insert tokens at word edges)."""
        rng = self.rng
        for _ in range(rng.randint(1, 3)):
            words = list(_WORD.finditer(data))
            token = rng.choice(self.target.tokens)
            if not words or rng.random() < 0.2:
                pos = rng.randint(0, len(data))
                data = data[:pos] + token + data[pos:]
                continue
            m = rng.choice(words)
            if rng.random() < 0.8:
                data = data[:m.start()] + token + data[m.end():]
            else:
                data = data[:m.end()] + token + data[m.end():]
        return data

    def bytes_ops(self, data: bytes, n: int) -> bytes:
        rng = self.rng
        buf = bytearray(data)
        for _ in range(n):
            op = rng.randrange(10)
            size = len(buf)
            pos = rng.randint(0, size)
            if op == 0 and size:
                i = rng.randrange(size)
                buf[i] ^= 1 << rng.randrange(8)
            elif op == 1 and size:
                buf[rng.randrange(size)] = rng.randrange(256)
            elif op == 2:
                buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            elif op == 3:
                buf[pos:pos] = rng.choice(HOSTILE_BYTES)
            elif op == 4 and size:
                end = min(size, pos + rng.randint(1, max(1, size // 4)))
                del buf[pos:end]
            elif op == 5 and size:
                start = rng.randrange(size)
                chunk = buf[start:start + rng.randint(1, 64)]
                buf[pos:pos] = chunk * rng.randint(1, 4)
            elif op == 6:
                del buf[pos:]
            elif op == 7:
                buf[pos:pos] = rng.choice(self.target.tokens)
            elif op == 8:
                lines = bytes(buf).split(b"\n")
                if len(lines) > 1:
                    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
                    lines[i], lines[j] = lines[j], lines[i]
                    buf = bytearray(b"\n".join(lines))
            else:
                lines = bytes(buf).split(b"\n")
                i = rng.randrange(len(lines))
                lines[i] = b" " * rng.choice((0, 1, 2, 4, 8)) + lines[i].lstrip(b" ")
                buf = bytearray(b"\n".join(lines))
        return bytes(buf)

    def splice(self, a: bytes, b: bytes) -> bytes:
        """The head of ``a`` and the tail of ``b``, cut at line ends when there are any."""
        rng = self.rng
        la, lb = a.split(b"\n"), b.split(b"\n")
        if len(la) > 1 and len(lb) > 1:
            return b"\n".join(la[:rng.randint(0, len(la))] + lb[rng.randint(0, len(lb)):])
        return a[:rng.randint(0, len(a))] + b[rng.randint(0, len(b)):]


# --------------------------------------------------------------------------- the run


@dataclass
class Stats:
    inputs: int = 0
    groups: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    slowest_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def rate(self) -> float:
        return self.inputs / max(time.perf_counter() - self.started, 1e-9)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_group(target: Target, group: Sequence[bytes]) -> Counter[str]:
    """Run ``group``; on an exception, find the one input that fails alone (if any) and
    raise :class:`Crashed` with it."""
    try:
        return target.run(group)
    except Exception as first:
        culprit: Sequence[bytes] = group
        exc: Exception = first
        if len(group) > 1:
            for one in group:
                try:
                    target.run([one])
                except Exception as single:
                    culprit, exc = [one], single
                    break
        raise Crashed(culprit, exc) from exc


class Crashed(Exception):
    def __init__(self, group: Sequence[bytes], exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.group = list(group)
        self.exc = exc


def parse_args(name: str, argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=f"Fuzz the {name} target (see fuzz/README.md).")
    p.add_argument("--inputs", type=int, default=100_000, help="inputs to run, corpus included")
    p.add_argument("--seed", type=int, default=1, help="seed of the mutations (a run is reproducible)")
    p.add_argument("--corpus", type=Path, default=FUZZ_DIR / "corpus" / name)
    p.add_argument("--timeout", type=float, help="seconds one group of inputs may take (default: the "
                   "target's: schema 20, decoder 10)")
    p.add_argument("--max-rss-mb", type=float, default=2048.0, help="peak resident memory bound")
    p.add_argument("--max-len", type=int, default=64 * 1024,
                   help="length cap of mutated inputs (the huge generator goes past it on purpose)")
    p.add_argument("--report", type=Path, help="also write the results as JSON here")
    p.add_argument("--keep-going", action="store_true",
                   help="do not stop at the first crash: save one input per crash site, exit 2 at the end")
    p.add_argument("--replay", type=Path, nargs="+", help="run only these files (or directories)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(make_target: Callable[[], Target], name: str, argv: Sequence[str] | None = None) -> int:
    """The command line of a target script (``--help`` lists the options)."""
    args = parse_args(name, argv)
    if args.replay:
        return _replay(make_target(), args.replay)
    if not args.worker:
        return _supervise(name, list(sys.argv[1:] if argv is None else argv))
    return _work(make_target(), args)


def _inflight(name: str) -> Path:
    return CRASH_DIR / f".{name}.inflight"


def _supervise(name: str, argv: list[str]) -> int:
    """Run the loop in a child; a child that dies (hang, signal) leaves its input in flight."""
    CRASH_DIR.mkdir(exist_ok=True)
    script = Path(sys.modules["__main__"].__file__ or "")
    rc = subprocess.run([sys.executable, str(script), *argv, "--worker"], check=False).returncode
    if rc in (0, EXIT_CRASH):
        return rc
    inflight = _inflight(name)
    how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc} (a hang ends so)"
    print(f"\nCRASH: the worker {how} while running the input in flight", flush=True)
    if inflight.exists():
        blob = inflight.read_bytes()
        kind = "hang" if rc == 1 else "died"
        if blob.startswith(b'{"inputs": ['):
            group = [base64.b64decode(s) for s in json.loads(blob)["inputs"]]
        else:
            group = [blob]
        print(f"saved to {save_crash(name, group, kind)}", flush=True)
    return EXIT_CRASH


def _limit_address_space(max_rss_mb: float) -> None:
    """Cap the worker's address space, so a runaway allocation is a MemoryError here
    rather than the machine's OOM killer (Arrow and the thread stacks reserve more
    virtual memory than they use, hence the headroom)."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    limit = vm + int(4 * max_rss_mb * 2**20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _work(target: Target, args: argparse.Namespace) -> int:
    if args.timeout is None:
        args.timeout = target.timeout_s
    _limit_address_space(args.max_rss_mb)
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <worker pid>: where is it now?
    corpus = read_corpus(args.corpus)
    if not corpus:
        print(f"no corpus under {args.corpus}", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    mutator = Mutator(mutation_seeds(corpus), rng, target, args.max_len)
    stats = Stats()
    inflight = _inflight(target.name)
    rss_start = current_rss_mb()
    print(f"{target.name}: {len(corpus)} corpus files, target {args.inputs:,} inputs, seed {args.seed}, "
          f"timeout {args.timeout:g} s per group, peak RSS bound {args.max_rss_mb:g} MB", flush=True)
    last_print = time.perf_counter()
    queue = [group for _, group in corpus]
    crashes: dict[str, int] = {}
    try:
        while stats.inputs < args.inputs:
            # the watchdog covers making the inputs too (a harness hang is a hang as well)
            inflight.write_bytes(b"(generating the next inputs)")
            faulthandler.dump_traceback_later(args.timeout, exit=True)
            if queue:
                group = queue.pop(0)
            else:
                lo, hi = target.group_sizes
                group = [mutator.next() for _ in range(rng.randint(lo, hi))]
            inflight.write_bytes(encode_group(group))
            faulthandler.dump_traceback_later(args.timeout, exit=True)
            t0 = time.perf_counter()
            try:
                counts = run_group(target, group)
            except Crashed as crash:
                if not args.keep_going:
                    raise
                counts = Counter({"CRASH": len(group)})
                _note_crash(target.name, crash, crashes)
            finally:
                faulthandler.cancel_dump_traceback_later()
            elapsed = time.perf_counter() - t0
            stats.slowest_s = max(stats.slowest_s, elapsed)
            stats.outcomes.update(counts)
            stats.inputs += len(group)
            stats.groups += 1
            if peak_rss_mb() > args.max_rss_mb:
                raise Crashed(group, FuzzFailure(
                    f"peak RSS {peak_rss_mb():.0f} MB is over the bound of {args.max_rss_mb:g} MB"))
            now = time.perf_counter()
            if now - last_print >= 15:
                last_print = now
                print(f"  {stats.inputs:,} inputs  {stats.rate():,.0f}/s  rss {current_rss_mb():.0f} MB  "
                      f"peak {peak_rss_mb():.0f} MB", flush=True)
    except Crashed as crash:
        path = save_crash(target.name, crash.group, "crash")
        print(f"\nCRASH after {stats.inputs:,} inputs: {crash}", flush=True)
        traceback.print_exception(crash.exc)
        print(f"saved to {path}; replay with: .venv/bin/python fuzz/fuzz_{target.name}.py --replay {path}",
              flush=True)
        return EXIT_CRASH
    finally:
        inflight.unlink(missing_ok=True)
    wall = time.perf_counter() - stats.started
    if crashes:
        print(f"\n{sum(crashes.values())} crashing groups, {len(crashes)} distinct places:")
        for where, count in sorted(crashes.items(), key=lambda kv: -kv[1]):
            print(f"  {count:>6,}  {where}")
        return EXIT_CRASH
    result = {
        "target": target.name, "inputs": stats.inputs, "groups": stats.groups, "corpus_files": len(corpus),
        "seed": args.seed, "wall_s": round(wall, 1), "inputs_per_s": round(stats.inputs / wall, 1),
        "slowest_group_s": round(stats.slowest_s, 3), "rss_start_mb": round(rss_start),
        "rss_end_mb": round(current_rss_mb()), "peak_rss_mb": round(peak_rss_mb()), "crashes": 0,
        "outcomes": dict(stats.outcomes.most_common()), "mutations": dict(mutator.used.most_common()),
    }
    print(f"\n{target.name}: {stats.inputs:,} inputs in {wall:,.1f} s ({result['inputs_per_s']:,} inputs/s), "
          f"no crash; slowest group {stats.slowest_s:.2f} s; RSS {rss_start:.0f} -> "
          f"{current_rss_mb():.0f} MB, peak {peak_rss_mb():.0f} MB")
    for outcome, count in stats.outcomes.most_common():
        print(f"  {count:>9,}  {outcome}")
    print("mutations: " + ", ".join(f"{k} {v:,}" for k, v in mutator.used.most_common()), flush=True)
    if args.report:
        args.report.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _note_crash(name: str, crash: Crashed, seen: dict[str, int]) -> None:
    """--keep-going: save the crash, print it the first time its place is seen."""
    frames = traceback.extract_tb(crash.exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}features{os.sep}" in f.filename] or frames
    where = repr(crash.exc)
    if ours:
        where = f"{type(crash.exc).__name__} at {ours[-1].filename}:{ours[-1].lineno}"
    seen[where] = seen.get(where, 0) + 1
    if seen[where] == 1:
        path = save_crash(name, crash.group, "crash")
        print(f"CRASH {where}: {str(crash)[:300]}\n  saved to {path}", flush=True)


def _replay(target: Target, paths: Sequence[Path]) -> int:
    """Run the given files (directories: every file in them) once each, in this process."""
    failed = 0
    for path in paths:
        entries = read_corpus(path) if path.is_dir() else read_corpus_file(path)
        for name, group in entries:
            try:
                counts = run_group(target, group)
            except Crashed as crash:
                failed += 1
                print(f"CRASH {name}: {crash}")
                traceback.print_exception(crash.exc)
                continue
            print(f"ok    {name}: {dict(counts)}")
    return EXIT_CRASH if failed else 0


def read_corpus_file(path: Path) -> list[tuple[str, list[bytes]]]:
    data = path.read_bytes()
    if path.name.endswith(".batch.json"):
        return [(path.name, [base64.b64decode(s) for s in json.loads(data)["inputs"]])]
    return [(path.name, [data])]


def quick_run(target: Target, corpus: Path, *, inputs: int, seed: int, huge: bool = True) -> Counter[str]:
    """``inputs`` mutated inputs in this process, no supervisor (for the pytest). Raises
    :class:`Crashed` at the first crash. ``huge=False`` leaves out the huge generator
    (its inputs take seconds each)."""
    rng = random.Random(seed)
    mutator = Mutator(mutation_seeds(read_corpus(corpus)), rng, target, 16 * 1024, huge=huge)
    out: Counter[str] = Counter()
    done = 0
    while done < inputs:
        lo, hi = target.group_sizes
        group = [mutator.next() for _ in range(rng.randint(lo, hi))]
        out.update(run_group(target, group))
        done += len(group)
    return out


def check_rows_readable(table: Any) -> None:
    """Valid rows must read back as Python values (what psycopg and the SDK see): dates
    and timestamps in the years 1..9999, zoned ones read in UTC as the stores keep them.
    Raises FuzzFailure otherwise."""
    import pyarrow as pa

    columns = []
    for col in table.columns:
        if pa.types.is_timestamp(col.type) and col.type.tz is not None:
            col = col.cast(pa.timestamp(col.type.unit, "UTC"))
        columns.append(col)
    try:
        pa.table(columns, names=table.column_names).to_pylist()
    except (ValueError, OverflowError) as exc:
        raise FuzzFailure(f"a valid row no store can hold: {exc}") from exc


def json_dumps_any(obj: Any, rng: random.Random) -> bytes:
    """``obj`` as JSON with a random spelling (spacing, ASCII escapes, NaN tokens)."""
    seps = rng.choice(((",", ":"), (", ", ": "), (" , ", " : ")))
    text = json.dumps(obj, separators=seps, ensure_ascii=rng.random() < 0.5, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")
