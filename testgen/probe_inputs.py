"""Inputs for an op no test calls, found by probing the repository's own CPU implementation.

An op that reads index tensors has no valid call by rule: torchsparse's `count_cuda(idx, s)` bumps
`out[idx[i]]` and `voxelize_forward_cuda(inputs, idx, counts)` reads `counts[idx[i]]`, and an index
past its table is undefined behaviour in the kernel and in the reference alike. The CPU
implementation the test compares with knows the contract, though, and built with AddressSanitizer it
reports the first read or write outside a tensor. So calls are drafted from the host function's
signature and the code around it (each tensor's dtype and rank as the code reads them, a size the
code checks against a number, every other size the same n, each integer tensor holding every value
of a range, a table's rows each distinct (a kernel writing through a row of indices would race on a
repeated one), a table of rows that each start with a count a partition of the indices (each listed
once in the whole table), each integer a size or a small count, each flag either way, each string a
mode the code names, each list of numbers one a spatial dimension: a sparse convolution's kernel
size, stride and shape, with its coordinates that many columns wide) and run through that build in
the sandbox (standalone/probe.py). A draft counts when it ran without a report, an exception or a
crash and wrote something not zero; the first KEEP such drafts in order of preference (the widest
ranges, the size itself) are kept at each n, so an op of integer tensors alone (no dtype to vary)
still gets enough cases over three shapes when the GPU finds some of them invalid.

`KMINER_PROBE=off` turns the probe off (each probed op costs an ASan build, ~30 s of g++).

What a draft can still get wrong (an index that must be sorted or unique, a kernel stricter than
its CPU twin) surfaces as the label failing its own test on the GPU, never as a row.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import subprocess
import sys
import sysconfig
import tempfile
from functools import cache
from pathlib import Path

import torch

from miner import sandbox, toolchain
from testgen.cases import EDGES, BaseCall, with_edge
from testgen.cpu_twin import COMPILE_LIMITS, built_as_torch_builds
from testgen.probe_slots import Slot, TensorFacts, slots_for
from testgen.standalone import PROBE
from testgen.tile_sizes import sizes_at_rank

log = logging.getLogger(__name__)
SIZES_BY_RANK = {2: (16, 7, 29), 3: (10, 5, 13), 4: (6, 4, 7)}  # n per draft set, by the top rank
MAX_DRAFTS = 192  # per size
# elements of a draft at a tile size: its tensors are embedded in the test. 65 a side at rank 3
# with a rule book as tall (mmcv's sparse max-pool backward: features and pairs 65^3 each) is
# 0.56M; at 2^18 no draft of 65 was kept, and the kernel for counts of 64 and more never ran
MAX_TILE_ELEMENTS = 1 << 20
KEEP = 3  # drafts kept per size: more value ranges give int-only ops 9 cases, not 3 (some
# turn out invalid on the GPU: pytorch_sparse's random walk kept 4 of 6)
PROBE_LIMITS = sandbox.Limits(seconds=150, memory_mb=8 << 10, processes=64, watch_rss=True)
ASAN_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer")
ASAN_OPTIONS = (  # a draft's child ends at its first report: that is its verdict
    "detect_leaks=0:halt_on_error=1:allocator_may_return_null=1:detect_odr_violation=0:"
    "symbolize=0:malloc_context_size=2"
)
SEED = 20261127
RANDOM, TIES, WITHIN = "random", "ties", "within"  # how floating tensors are drafted
PROBE_ORIGIN = (
    "kminer's probe of the repository's CPU implementation: drafted calls (every size n, "
    "integer tensors holding every value of a range) kept where that implementation, built with "
    "AddressSanitizer, ran clean and wrote a result"
)
_FLOATS = (1.25, -0.5, 2.0, 0.75)


def _choices(slot: Slot, n: int, wider_first: bool = False) -> tuple:
    """The values a slot tries, best first (one value: fixed). A tensor also tries one more
    dimension than the code reads (hash_cpu reads `idx.size(0)` and four ints per row), after
    every value range at the rank it reads (before them: `wider_first`)."""
    if slot.kind == "int":
        return tuple(dict.fromkeys((n, 4, 2, 1, 0)))
    if slot.kind == "ints":  # a value for every dimension: its name's, n, then small ones
        return (n,) if slot.first is None else tuple(dict.fromkeys((slot.first, n, 3, 1, 2, 0)))
    if slot.kind == "bool":
        return (False, True)
    if slot.kind == "flag":  # an integer read as a flag
        return (0, 1)
    if slot.kind in ("str", "enum"):
        return slot.modes
    if slot.kind == "intlists":  # (groups, entries a group)
        return ((3, n), (1, n), (3, max(2, n // 4)))
    if slot.kind != "tensor":
        return (None,)
    dtype = slot.facts.dtype
    if slot.facts.counted is not None:  # counted rows of indices below n, then a few
        values = (("counted", n), ("counted", max(2, n // 4)), ("counted", 1))
    elif dtype.is_floating_point:
        values = (None,)
    elif dtype == torch.bool:
        values = ("bools",)
    elif slot.facts.columns:  # entries of distinct index columns: n, then a few
        return ((0, ("columns", n)), (0, ("columns", max(2, n // 4))))
    elif slot.facts.coordinates:  # distinct rows of cells in a grid n a side, then fewer
        return ((0, (0, n)), (0, (0, max(4, n // 4))))
    else:
        values = ((-1, n), (0, n), (0, max(2, n // 4)), (0, 1))
    if slot.facts.view:  # in the shape it is viewed in
        return tuple((0, v) for v in values)
    wider = (1,) if slot.facts.fixed_rank is None and not slot.facts.row else ()
    extras = (*wider, 0) if wider_first else (0, *wider)
    return tuple((extra, v) for extra in extras for v in values)


def _tensor(
    facts: TensorFacts, n: int, choice, gen: torch.Generator, shape: list | None = None
) -> torch.Tensor:
    extra, values = choice
    shape = shape if shape is not None else facts.shape(n, extra)
    count = 1
    for s in shape:
        count *= s
    if facts.zeros:
        return torch.zeros(shape, dtype=facts.dtype)
    if facts.dtype.is_floating_point:
        return (torch.randn(count, generator=gen) * 2).to(facts.dtype).reshape(shape)
    if values == "bools":
        return (torch.randint(0, 2, (count,), generator=gen) == 1).reshape(shape)
    if values[0] == "columns":
        return _columns(facts, n, values[1], gen)
    lo, hi = values
    if len(shape) >= 2 and 1 < shape[-1] <= hi - lo:  # a table of index rows: each row distinct
        width, rows = shape[-1], {}  # within; coordinates, while draws allow, from each other
        for k in range(8 * (count // width) if facts.coordinates else count // width):
            row = torch.randperm(hi - lo, generator=gen)[:width]  # (a kernel writing each
            rows[tuple(row.tolist()) if facts.coordinates else k] = row  # cell would race)
            if len(rows) == count // width:
                break
        made = list(rows.values())
        made += [made[k % len(made)] for k in range(count // width - len(made))]
        return (torch.stack(made) + lo).to(facts.dtype).reshape(shape)
    # every value of the range (its ends always), in a seeded order
    values = torch.arange(count) % (hi - lo) + lo
    values[-1] = hi - 1
    return values[torch.randperm(count, generator=gen)].to(facts.dtype).reshape(shape)


def _columns(facts: TensorFacts, n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """`count` entries of `facts.columns` indices below n, each column distinct (a rule book
    pairs each input row with one output row: SparseConvNet's forward adds into its output
    rows unguarded, its backward into its input rows), flat where the code reads it flat."""
    width = facts.columns
    shape = [count * width] if facts.ndim == 1 else [1] * (facts.ndim - 2) + [count, width]
    return _entries(width, n, count, gen).to(facts.dtype).reshape(shape)


def _entries(width: int, n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """`count` entries (rows) of `width` indices below n, each column distinct."""
    return torch.stack([torch.randperm(n, generator=gen)[:count] for _ in range(width)], 1)


def _counted(rows: int, width: int, top: int, gen: torch.Generator) -> torch.Tensor:
    """`rows` rows of `width` numbers, each a count at most width - 1 followed by that many
    indices below `top`, every index in one row only (the groups of a partition: a sample's
    active sites), until the indices run out; the other rows count none. Numbers past a row's
    count are never read: they hold 0."""
    table = torch.zeros(rows, width, dtype=torch.int64)
    left = torch.randperm(top, generator=gen).tolist()
    for row in table:
        take = int(torch.randint(0, min(width - 1, len(left)) + 1, (1,), generator=gen))
        row[0] = take
        row[1 : 1 + take] = torch.tensor(left[:take], dtype=torch.int64)
        left = left[take:]
    return table


def _groups(width: int, n: int, choice: tuple, gen: torch.Generator) -> list[list[int]]:
    """Groups of `count` entries of `width` indices below n, each index column of a group
    distinct (a rule book's group pairs each input row with one output row: a kernel that
    writes each output once per group would race on a repeated one), flattened per group."""
    groups, count = choice
    return [_entries(width, n, count, gen).reshape(-1).tolist() for _ in range(groups)]


def drafts(
    slots: list[Slot], n: int, floats: str = RANDOM, only: list | None = None
) -> list[tuple[tuple, list]]:
    """(choice indices, arguments) of the drafts at size n, best first: the fewest steps away
    from each slot's first choice. `floats`: how floating tensors are drafted (RANDOM; TIES:
    three values only, so that code acting only where two values are equal (a max-pool's
    backward writes where the output equals the input) finds ties anywhere the indices lead,
    and each tensor tries a dimension more first (rows a stride steps over: the code reads
    only `data_ptr`); WITHIN: values in [0, n), so a float the code takes as an index (a
    region's batch column, its corners) stays inside tensors n wide). `only`: the choice
    indices wanted, in order (the others are not made)."""
    options = [_choices(s, n, wider_first=floats == TIES) for s in slots]
    out = []
    combos = (  # the wanted ones in the same order, however many steps away
        only
        if only is not None
        else itertools.islice(_by_steps([len(o) for o in options]), MAX_DRAFTS)
    )
    for combo in combos:
        gen = torch.Generator().manual_seed(SEED + n)  # the same float data in every draft
        args, numbers = [], iter(_FLOATS * 8)
        for slot, opts, k in zip(slots, options, combo, strict=True):
            if slot.kind == "tensor" and (slot.facts.view or slot.facts.counted is not None):
                args.append(None)  # made once the numbers its shape or rows read are
            elif slot.kind == "tensor":
                args.append(_drafted(slot.facts, n, opts[k], gen, floats))
            elif slot.kind == "intlists":
                args.append(_groups(slot.width, n, opts[k], gen))
            elif slot.kind == "ints":
                args.append([opts[k]] * slot.width)
            elif slot.kind == "float":
                args.append(next(numbers))
            else:
                args.append(opts[k])
        for i, slot in enumerate(slots):
            if slot.kind == "product":
                args[i] = math.prod(args[f] for f in slot.factors)
        for i, (slot, opts, k) in enumerate(zip(slots, options, combo, strict=True)):
            if slot.kind == "tensor" and slot.facts.view:
                shape = [n if d[0] == "n" else d[1] if d[0] == "literal" else args[d[1]]
                         for d in slot.facts.view]  # fmt: skip
                args[i] = _drafted(slot.facts, n, opts[k], gen, floats, shape)
            elif slot.kind == "tensor" and slot.facts.counted is not None:
                _, (_, top) = opts[k]  # ("counted", indices below top)
                width = int(args[slot.facts.counted]) + 1  # n rows of it
                dtype = slot.facts.dtype if not slot.facts.dtype.is_floating_point else torch.int32
                args[i] = _counted(n, width, top, gen).to(dtype)
        for i, slot in enumerate(slots):
            if slot.kind == "count":  # as many entries as the tensor holds
                args[i] = args[slot.factors[0]].numel() // slot.width
        out.append((combo, args))
    return out


def _drafted(facts, n, choice, gen, floats, shape=None) -> torch.Tensor:
    made = _tensor(facts, n, choice, gen, shape)
    if floats == WITHIN and made.is_floating_point():
        return (torch.rand(made.shape, generator=gen) * n).to(made.dtype)
    if floats == TIES and made.is_floating_point():
        ties = torch.randint(-1, 2, made.shape, generator=gen) * 0.5
        made = ties.to(made.dtype)
    return made


def _by_steps(counts: list[int]):
    """Every choice tuple (one index below each count), by the sum of its indices, then in
    order: generated a sum at a time, so eight slots of eight choices cost no 16M-tuple sort."""
    top = sum(c - 1 for c in counts)
    for total in range(top + 1):
        yield from _summing(counts, total)


def _summing(counts: list[int], total: int):
    if not counts:
        if total == 0:
            yield ()
        return
    rest = sum(c - 1 for c in counts[1:])
    for first in range(max(0, total - rest), min(counts[0] - 1, total) + 1):
        for tail in _summing(counts[1:], total - first):
            yield (first, *tail)


@cache
def _gcc_file(name: str) -> str:
    """Where g++ finds its runtime file `name`, "" when it has none."""
    try:
        found = subprocess.run(
            ["g++", f"-print-file-name={name}"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return found if found.startswith("/") and Path(found).exists() else ""


def _libasan() -> str:
    return _gcc_file("libasan.so")


def _preload() -> str:
    """The sanitizer's runtime, then the C++ runtime: loaded by the interpreter only later (with
    torch), `__cxa_throw` is not found when the sanitizer starts, and every C++ exception, such
    as a TORCH_CHECK refusing a draft, ends the process in a sanitizer CHECK failure that reads
    as a memory error."""
    return " ".join(p for p in (_libasan(), _gcc_file("libstdc++.so.6")) if p)


def asan_build(source: Path, name: str, out: Path) -> Path | None:
    """The self-contained reference `source` as the module `name` at `out`, built with
    AddressSanitizer by g++ in the sandbox; None when it does not build."""
    source = source.resolve()
    inc = [*toolchain.torch_include_dirs(), sysconfig.get_paths()["include"]]
    lib = Path(toolchain.torch_include_dirs()[0]).parent / "lib"
    flags = [
        f"-std={toolchain.cxx_standard()}", "-shared", "-fPIC", "-O1", "-w", "-fopenmp",
        *ASAN_FLAGS, *[f"-I{d}" for d in [*inc, *toolchain.header_library_dirs()]],
        "-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={name}",
        *toolchain.abi_flags(),
    ]  # fmt: skip
    libs = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    with tempfile.TemporaryDirectory(prefix="kminer-asan-") as tmp:
        so = Path(tmp) / "module.so"
        argv = ["g++", *flags, str(source), "-o", str(so), *libs]
        done = built_as_torch_builds(
            argv, lambda a: sandbox.run(a, COMPILE_LIMITS, cwd=Path(tmp), readable=[source.parent])
        )
        if done.returncode != 0 or not so.is_file():
            log.info("%s does not build with ASan: %s", source.name, done.stderr[-300:])
            return None
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(so.read_bytes())
        return out


def _verdicts(
    module: Path, name: str, grouped: list, folder: Path, bare: tuple = ()
) -> dict[int, str]:
    """Each draft's verdict from standalone/probe.py (`grouped`: (group, arguments), a group
    ending at its KEEP-th `ok`); those it did not reach in PROBE_LIMITS have none. `bare`: the
    arguments the code resizes, passed without fences (grown in place, a tensor would write
    into its own fence: SparseConvNet's output_features.resize_ for a taller input)."""
    data = folder / "drafts.pt"
    torch.save(grouped, data)
    env = {"LD_PRELOAD": _preload(), "ASAN_OPTIONS": ASAN_OPTIONS, "OMP_NUM_THREADS": "1"}
    out = folder / "verdicts.jsonl"
    argv = [sys.executable, str(PROBE), str(module), name, str(data), str(out), str(KEEP)]
    argv.append(json.dumps(list(bare)))
    sandbox.run(argv, PROBE_LIMITS, env=env, cwd=folder, readable=[module.parent])
    verdicts = {}
    for line in (sandbox.read_output(out) or b"").decode().splitlines():
        entry = json.loads(line)
        verdicts[entry["draft"]] = entry["verdict"]
    return verdicts


def probed_calls(
    params: list[tuple[str, str]],
    texts: list[tuple[str, list[str]]],
    reference: Path,
    cache_dir: Path,
    tile_sizes: tuple[int, ...] = (),
) -> list[BaseCall] | str:
    """Calls of the host function `params` describes that its CPU implementation `reference`
    (a kminer reference source, bound as `reference`) runs clean, at up to three sizes, and
    at each of `tile_sizes` (testgen/tile_sizes.py) the drafts that ran clean at those; else
    why there are none."""
    if os.environ.get("KMINER_PROBE", "on") == "off":
        return "no call was drafted (KMINER_PROBE=off)"
    slots = slots_for(params, texts)
    if slots is None:
        return "no call can be drafted for it (a parameter that is no tensor or number)"
    if not _libasan():
        return "no call was drafted (g++ has no AddressSanitizer runtime here)"
    text = reference.read_bytes()
    key = hashlib.sha256(text + json.dumps(ASAN_FLAGS).encode()).hexdigest()[:16]
    name = f"kminer_probe_{key}"
    module = (cache_dir / key / f"{name}.so").resolve()
    if not module.is_file() and asan_build(reference, name, module) is None:
        return "its CPU implementation does not build with AddressSanitizer"
    bare = tuple(i for i, s in enumerate(slots) if s.facts and s.facts.resized)
    rank = max((s.facts.ndim for s in slots if s.facts), default=1)
    sizes = SIZES_BY_RANK[min(max(rank, 2), 4)]
    n_floats = sum(s.kind == "tensor" and s.facts.dtype.is_floating_point for s in slots)
    verdicts: dict = {}
    for floats in (RANDOM, TIES, WITHIN):
        if floats == TIES and (n_floats < 2 or "empty" not in verdicts.values()):
            continue  # ties: where no draft wrote
        failed = {v.split(":")[0] for v in verdicts.values()}
        if floats == WITHIN and not failed & {"asan", "raised"}:
            continue  # floats that may be indices: where drafts read out of bounds or raised
        flat = [(n, combo, args) for n in sizes for combo, args in drafts(slots, n, floats)]
        verdicts = _verdicts_of(module, name, sizes, flat, bare)
        held: dict = {}  # n -> the arguments of its drafts that ran ok, best first
        for k, (n, _, args) in enumerate(flat):
            if verdicts.get(k) == "ok":
                held.setdefault(n, []).append(args)
        if held or not n_floats:
            break
    if not held:
        seen = sorted({v.split(":")[0] for v in verdicts.values()})
        return f"no drafted call ran clean through its CPU implementation ({', '.join(seen)})"
    clean = [(n, combo) for k, (n, combo, _) in enumerate(flat) if verdicts.get(k) == "ok"]
    tiles = sizes_at_rank(tile_sizes, rank)
    if tiles:  # only the drafts that ran clean at the probe's own sizes: tensors are larger
        more = [
            (t, c, a)
            for t in tiles
            for c, a in drafts(slots, t, floats, only=_tile_combos(slots, clean, t))
            if _elements(a) <= MAX_TILE_ELEMENTS
        ]
        tile_verdicts = _verdicts_of(module, name, tiles, more, bare)
        for k, (n, _, args) in enumerate(more):
            if tile_verdicts.get(k) == "ok":
                held.setdefault(n, []).append(args)
    taller: dict = {}  # tile size -> its clean drafts with a tensor a row taller
    grown = _taller([(t, args) for t in tiles for args in held.get(t, [])[:KEEP]], floats)
    if grown:
        grown_verdicts = _verdicts_of(module, name, tiles, grown, bare)
        for k, (n, _, args) in enumerate(grown):
            if grown_verdicts.get(k) == "ok":
                taller.setdefault(n, []).append(args)
    # each size's best draft first (the plan's first calls), then the runners-up
    calls = [
        BaseCall(kept[n][rank], PROBE_ORIGIN)
        for kept, at in ((held, (*sizes, *tiles)), (taller, tiles))
        for rank in range(KEEP)
        for n in at
        if rank < len(kept.get(n, []))
    ]
    return _edges_checked(module, name, calls, bare)


def _edges_checked(module: Path, name: str, calls: list[BaseCall], bare: tuple) -> list:
    """The calls, each with the edge values its CPU implementation runs clean. A draft is
    clean at its own values; negated or enlarged, a value the code uses as an index (a region's
    batch column drafted as 2.4) reaches outside the buffers, and the reference and the kernel
    corrupt memory in the test (PyTorch-Encoding's RoIAlign backward died at exit)."""
    checks = [(k, edge) for k in range(len(calls)) for edge in EDGES]
    with tempfile.TemporaryDirectory(prefix="kminer-probe-") as tmp:
        grouped = [(g, with_edge(calls[k].args, edge)) for g, (k, edge) in enumerate(checks)]
        verdicts = _verdicts(module, name, grouped, Path(tmp), bare)
    for k, call in enumerate(calls):
        call.edges = tuple(
            edge
            for g, (j, edge) in enumerate(checks)
            if j == k and verdicts.get(g) in ("ok", "empty")
        )
    return calls


def _taller(clean: list[tuple[int, list]], floats: str) -> list[tuple[int, tuple, list]]:
    """(tile size, (), arguments): each clean draft at a tile size t with one floating tensor
    of two dimensions or more t + 1 rows tall. Square tensors hide the kernel that takes the
    rows past the last whole tile (SparseConvNet's forwardB, launched on nActive % K rows, never
    ran: every wrong variant of it passed) and a kernel that swaps two dimensions."""
    out = []
    for t, args in clean:
        for i, a in enumerate(args):
            if not (isinstance(a, torch.Tensor) and a.is_floating_point()):
                continue
            if a.dim() < 2 or a.shape[0] != t:
                continue
            gen = torch.Generator().manual_seed(SEED + t + i)
            shape = [t + 1, *a.shape[1:]]  # its floats drafted as every draft's are
            made = _drafted(TensorFacts(dtypes=[a.dtype]), t, (0, None), gen, floats, shape)
            out.append((t, (), [*args[:i], made, *args[i + 1 :]]))
    return out


def _tile_combos(slots: list[Slot], clean: list[tuple[int, tuple]], to: int) -> list[tuple]:
    """The drafts that ran clean, made at size `to`, best first; each followed by itself with
    every other count of entries of a rule book (of whole tiles, a kernel over tiles runs; of
    a few, the one for the rest: SparseConvNet's forwardA and forwardB)."""
    made = sorted({_at_size(slots, c, n, to) for n, c in clean}, key=lambda c: (sum(c), c))
    counted = [i for i, s in enumerate(slots) if s.kind == "tensor" and s.facts.columns]
    out = []
    for combo in made:
        out.append(combo)
        for i in counted:
            out += [(*combo[:i], k, *combo[i + 1 :]) for k in range(len(_choices(slots[i], to)))]
    return list(dict.fromkeys(out))


def _at_size(slots: list[Slot], combo: tuple, n: int, to: int) -> tuple:
    """The choices at size `to` that make the draft `combo` made at size n: an integer that was
    n is `to`, one that was a small count (1, 2, 4) stays that count, wherever it sits among
    the choices at `to` (4 is n itself at n = 4)."""
    out = []
    for slot, k in zip(slots, combo, strict=True):
        if slot.kind in ("int", "ints"):
            before, after = _choices(slot, n), _choices(slot, to)
            value = to if before[k] == n else before[k]
            k = after.index(value) if value in after else k
        out.append(k)
    return tuple(out)


def _elements(args: list) -> int:
    return sum(a.numel() for a in args if isinstance(a, torch.Tensor))


def _verdicts_of(
    module: Path, name: str, sizes: tuple, flat: list, bare: tuple = ()
) -> dict[int, str]:
    with tempfile.TemporaryDirectory(prefix="kminer-probe-") as tmp:
        grouped = [(sizes.index(n), args) for n, _, args in flat]
        return _verdicts(module, name, grouped, Path(tmp), bare)
