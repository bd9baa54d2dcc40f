"""Inputs for an op no test calls, found by probing the repository's own CPU implementation.

An op that reads index tensors has no valid call by rule: torchsparse's `count_cuda(idx, s)` bumps
`out[idx[i]]` and `voxelize_forward_cuda(inputs, idx, counts)` reads `counts[idx[i]]`, and an index
past its table is undefined behaviour in the kernel and in the reference alike. The CPU
implementation the test compares with knows the contract, though, and built with AddressSanitizer
it reports the first read or write outside a tensor. So calls are drafted from the host
function's signature and the code around it (each tensor's dtype and rank as the code reads them,
a size the code checks against a number, every other size the same n, each integer tensor holding
every value of a range, a table's rows each distinct (a kernel writing through a row of indices
would race on a repeated one), each integer a size or a small count, each flag either way, each
string a mode the code names) and run
through that build in the sandbox (standalone/probe.py). A draft counts when it ran without a
report, an exception or a crash and wrote something not zero; the first KEEP such drafts in order
of preference (the widest ranges, the size itself) are kept at each n, so an op of integer
tensors alone (no dtype to vary) still gets enough cases over three shapes when the GPU finds
some of them invalid.

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
import re
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from miner import sandbox, toolchain
from miner.textprep import split_top
from testgen.cases import BaseCall
from testgen.cpu_twin import COMPILE_LIMITS
from testgen.llm_inputs import param_kind
from testgen.made_inputs import C_DTYPES
from testgen.standalone import PROBE
from testgen.tile_sizes import sizes_at_rank
from wrappers.adapter import aliases as type_aliases

log = logging.getLogger(__name__)
SIZES_BY_RANK = {2: (16, 7, 29), 3: (10, 5, 13), 4: (6, 4, 7)}  # n per draft set, by the top rank
MAX_DRAFTS = 192  # per size
MAX_TILE_ELEMENTS = 1 << 18  # in a draft at a tile size: its tensors are embedded in the test
KEEP = 3  # drafts kept per size: more value ranges give int-only ops 9 cases, not 3 (some
# turn out invalid on the GPU: pytorch_sparse's random walk kept 4 of 6)
PROBE_LIMITS = sandbox.Limits(seconds=150, memory_mb=8 << 10, processes=64, watch_rss=True)
ASAN_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer")
ASAN_OPTIONS = (  # a draft's child ends at its first report: that is its verdict
    "detect_leaks=0:halt_on_error=1:allocator_may_return_null=1:detect_odr_violation=0:"
    "symbolize=0:malloc_context_size=2"
)
SEED = 20261127
PROBE_ORIGIN = (
    "kminer's probe of the repository's CPU implementation: drafted calls (every size n, "
    "integer tensors holding every value of a range) kept where that implementation, built with "
    "AddressSanitizer, ran clean and wrote a result"
)
_DTYPES = {  # made_inputs' C types, and those only a probe meets (flags, bytes, unsigned)
    **C_DTYPES, "unsigned": torch.int32, "uint32_t": torch.int32, "Half": torch.float16,
    "bool": torch.bool, "uint8_t": torch.uint8, "int8_t": torch.int8, "int16_t": torch.int16,
    "short": torch.int16,
}  # fmt: skip
_SCALAR_NAMES = {
    "Int": torch.int32, "Long": torch.int64, "Float": torch.float32, "Double": torch.float64,
    "Half": torch.float16, "Bool": torch.bool, "Byte": torch.uint8,
}  # fmt: skip
_DATA = r"(?:data_ptr|data|mutable_data_ptr|const_data_ptr)"
_FLOATS = (1.25, -0.5, 2.0, 0.75)


@dataclass
class TensorFacts:
    """What the code says of one tensor parameter."""

    dtypes: list = field(default_factory=list)  # in the order the code names them
    rank: int = 1
    fixed_rank: int | None = None
    fixed_dims: dict = field(default_factory=dict)  # dim -> size the code checks it against
    row: int | None = None  # elements a row, where the code steps its data by a literal
    zeros: bool = False  # the code refuses it unless all zero (a buffer its caller clears)
    columns: int = 0  # entries of this many indices a count counts (a rule book's pairs)
    view: tuple = ()  # the shape the code views it in: ("n",), ("literal", k), ("slot", i)

    @property
    def dtype(self) -> torch.dtype:
        return self.dtypes[0] if self.dtypes else torch.float32

    @property
    def ndim(self) -> int:
        if self.fixed_rank is not None:
            return self.fixed_rank
        return max(self.rank, 2) if self.row else self.rank

    def shape(self, n: int, extra: int) -> list[int]:
        """Every size n but those the code fixes: a checked dimension, the last one where the
        code reads rows of a literal width (devoxelize's `indices.data_ptr<int>() + i * 8`)."""
        dims = self.ndim + extra
        shape = [self.fixed_dims.get(d, n) for d in range(dims)]
        if self.row and dims - 1 not in self.fixed_dims:
            shape[-1] = self.row
        return shape


def _words(type_text: str) -> str:
    return " ".join(
        w for w in re.findall(r"\w+", type_text) if w not in ("const", "at", "c10", "std")
    )


def _dtype_of(type_text: str, aliases: dict | None = None) -> torch.dtype | None:
    """The dtype of a C type, through the code's own names for types (`using Int = int32_t;`:
    SparseConvNet reads every index as `data_ptr<Int>()`)."""
    text = _words(type_text)
    if aliases and text in aliases:
        text = _words(aliases[text])
    return _DTYPES.get(text) if text else None


def read_facts(
    code: str, name: str, facts: TensorFacts, aliases: dict | None = None, depth: int = 0
) -> None:
    """Add what `code` says of the tensor it calls `name`: the element types its data is read
    as (through the code's `aliases` of C types), the sizes and strides it reads, the dimensions
    and dtype it checks; and of a copy it reads in the tensor's place."""
    n = re.escape(name)
    member = rf"\b{n}\s*(?:\.|->)\s*"
    for m in re.finditer(member + _DATA + r"\s*<([^<>()]+)>", code):
        _note(facts, _dtype_of(m[1], aliases), m[1])
    row_step = r"\s*<[^<>()]+>\s*\(\s*\)\s*\+\s*(?:\w+\s*\*\s*(\d+)|(\d+)\s*\*\s*\w+)\b(?!\s*[*(])"
    for m in re.finditer(member + _DATA + row_step, code):
        if 1 < int(m[1] or m[2]) <= 64:
            facts.row = int(m[1] or m[2])
    for m in re.finditer(member + r"\w*accessor\w*\s*<\s*([^,<>]+?)\s*,\s*(\d+)", code):
        _note(facts, _dtype_of(m[1], aliases), m[1])
        facts.rank = max(facts.rank, int(m[2]))
    for m in re.finditer(member + r"size\s*\(\s*(\d+)\s*\)", code):
        facts.rank = max(facts.rank, int(m[1]) + 1)
    for m in re.finditer(member + r"stride\s*\(\s*(\d+)\s*\)", code):  # steps over dim k
        facts.rank = max(facts.rank, int(m[1]) + 2)  # to reach dim k + 1 (a row's stride)
    if re.search(member + r"eq\s*\(\s*0\s*\)\s*\.\s*all\s*\(", code):
        facts.zeros = True
    for m in re.finditer(member + r"(?:view|reshape)\s*\(\s*\{([^{}]*)\}", code):
        facts.rank = max(facts.rank, len(split_top(m[1])))  # a view of its data as k dims
    for m in re.finditer(member + r"sizes\s*\(\s*\)\s*\[\s*(\d+)\s*\]", code):
        facts.rank = max(facts.rank, int(m[1]) + 1)
    for m in re.finditer(member + r"(?:dim|ndimension)\s*\(\s*\)\s*==\s*(\d+)\b", code):
        facts.fixed_rank = int(m[1])
    for m in re.finditer(member + r"(?:dim|ndimension)\s*\(\s*\)\s*-\s*(\d+)\b", code):
        facts.rank = max(facts.rank, int(m[1]) + 1)  # `w.dim() - 2` spatial dims: one at least
    for m in re.finditer(member + r"size\s*\(\s*(\d+)\s*\)\s*==\s*(\d+)\b", code):
        if 0 < int(m[2]) <= 64:
            facts.fixed_dims[int(m[1])] = int(m[2])
    scalar = r"(?:scalar_type|dtype)\s*\(\s*\)\s*==\s*(?:\w+::)*k?(\w+)"
    for m in re.finditer(member + scalar, code):
        _note(facts, _SCALAR_NAMES.get(m[1]), m[1])
    typed = rf"\b\w+\s*<\s*(?:const\s+)?([A-Za-z_][\w:]*)\s*>\s*\(\s*{n}\s*\)"
    for m in re.finditer(typed + r"(\s*\.\s*subview\s*\(([^()]*)\))?", code):
        _note(facts, _dtype_of(m[1], aliases), m[1])  # a typed view: `tv::torch2tv<const int>(x)`
        if m[2]:  # a view k indices into it has k dimensions more than the one it gives
            facts.rank = max(facts.rank, len(split_top(m[3])) + 1)
    if depth < 1:  # a copy that the code reads in its place: `auto c = x.to(torch::kCPU);`, `= x;`
        copies = rf"\b([A-Za-z_]\w*)\s*=\s*{n}\s*(?:;|\.\s*(?:to|cpu|contiguous|clone)\s*\()"
        for m in re.finditer(copies, code):
            if m[1] != name:
                read_facts(code, m[1], facts, aliases, depth + 1)


def _note(facts: TensorFacts, dtype: torch.dtype | None, type_text: str) -> None:
    if dtype is None and re.fullmatch(r"\s*(?:\w+::)*\w+\s*", type_text):
        dtype = torch.float32  # a template parameter (scalar_t): the dispatch's float
    if dtype is not None and dtype not in facts.dtypes:
        facts.dtypes.append(dtype)


@dataclass
class Slot:
    """One parameter of the drafts: its kind and, for a tensor, what the code says of it; for
    a string, the modes the code names."""

    kind: str
    facts: TensorFacts | None = None
    modes: tuple = ()
    width: int = 1  # of a list of index groups: the indices one entry of a group takes
    factors: tuple = ()  # of a number the code checks to be their product: their slots


_PRODUCT = re.compile(
    r"\b(?:TORCH_CHECK|AT_ASSERT|assert)\s*\(\s*([A-Za-z_]\w*)\s*==\s*"
    r"([A-Za-z_]\w*(?:\s*\*\s*[A-Za-z_]\w*)*)\s*[,)]"
)


_COUNTED = re.compile(
    r"\bTORCH_CHECK\s*\(\s*([A-Za-z_]\w*)\s*\.\s*numel\s*\(\s*\)\s*>=\s*(\d+)\s*\*\s*"
    r"([A-Za-z_]\w*)\s*[,)]"
)


def products(slots: list[Slot], texts: list[tuple[str, list[str]]]) -> None:
    """Numbers the code checks to be a product of others, or another (`TORCH_CHECK(input_stride
    == input_nPlanes * nGroups)`: what the op computes before calling its launcher), and counts
    of the entries a tensor holds (`rules.numel() >= 2 * nHot`), are made from them, not
    drafted: no draft spends its steps finding the one value that agrees."""
    for code, names in texts:
        index = {n: i for i, n in enumerate(names) if i < len(slots) and n}
        for m in _PRODUCT.finditer(code):
            target = index.get(m[1])
            factors = tuple(index.get(f.strip()) for f in m[2].split("*"))
            if target is None or None in factors or target in factors:
                continue
            if slots[target].kind == "int" and all(slots[f].kind == "int" for f in factors):
                slots[target] = Slot("product", factors=factors)
        for m in _COUNTED.finditer(code):  # `rules.numel() >= 2 * nHot`: nHot entries of 2
            tensor, target = index.get(m[1]), index.get(m[3])
            if tensor is None or target is None or not 0 < int(m[2]) <= 16:
                continue
            if slots[target].kind == "int" and slots[tensor].kind == "tensor":
                slots[target] = Slot("count", factors=(tensor,), width=int(m[2]))
                slots[tensor].facts.columns = int(m[2])


def views(slots: list[Slot], texts: list[tuple[str, list[str]]]) -> None:
    """Tensors the code views in a shape of the numbers it takes (`w.view({-1, nGroups,
    input_nPlanes, output_nPlanes})`: a weight its caller sized by them) are drafted in that
    shape, n where it says -1: drafted n a side, a tensor agrees with those numbers in few
    drafts, and a tile size's tensors grow by their numbers, not by n to the fourth."""
    for code, names in texts:
        index = {n: i for i, n in enumerate(names) if i < len(slots) and n}
        for i, name in enumerate(names[: len(slots)]):
            facts = slots[i].facts
            if not name or slots[i].kind != "tensor" or facts.view:
                continue
            m = re.search(rf"\b{re.escape(name)}\s*(?:\.|->)\s*{_VIEWED}", code)
            dims = tuple(_view_dim(d.strip(), index, slots) for d in split_top(m[1])) if m else ()
            named = dims and None not in dims and any(d[0] == "slot" for d in dims)
            if named and sum(d[0] == "n" for d in dims) <= 1:
                facts.view = dims


_VIEWED = r"(?:view|reshape)\s*\(\s*\{([^{}]*)\}"


def _view_dim(text: str, index: dict, slots: list[Slot]) -> tuple | None:
    if text == "-1":
        return ("n",)
    if text.isdigit() and 0 < int(text) <= 64:
        return ("literal", int(text))
    k = index.get(text)
    return ("slot", k) if k is not None and slots[k].kind in ("int", "product") else None


def group_width(code: str, name: str) -> int | None:
    """How many indices make one entry of a group, as the code that loops over the groups
    `name` counts them (`for (auto &r : _rules) { Int nHot = r.size() / 2; ...`)."""
    n = re.escape(name)
    element = rf"&\s*(\w+)\s*(?::\s*{n}\s*\)|=\s*{n}\s*\[)"  # `&r : groups)`, `&r = groups[i]`
    for loop in re.finditer(element, code):
        size = re.search(rf"\b{loop[1]}\s*\.\s*size\s*\(\s*\)\s*/\s*(\d+)\b", code[loop.end() :])
        if size and 0 < int(size[1]) <= 16:
            return int(size[1])
    return None


def string_modes(code: str, name: str) -> tuple[str, ...]:
    """The words a string parameter may hold, as the code names them: compared with it
    (`reduce == "max"`), then keys of a table from words (pytorch_sparse's
    `reduce2REDUCE = {{"sum", SUM}, {"mean", MEAN}, ...}`, read by its dispatch macro)."""
    n = re.escape(name)
    compared = re.findall(rf'\b{n}\s*==\s*"(\w+)"|"(\w+)"\s*==\s*{n}\b', code)
    keys = re.findall(r'\{\s*"(\w{1,16})"\s*,\s*[\w:]+\s*\}', code)
    return tuple(dict.fromkeys([a or b for a, b in compared] + keys))[:6]


def _choices(slot: Slot, n: int, wider_first: bool = False) -> tuple:
    """The values a slot tries, best first (one value: fixed). A tensor also tries one more
    dimension than the code reads (hash_cpu reads `idx.size(0)` and four ints per row), after
    every value range at the rank it reads (before them: `wider_first`)."""
    if slot.kind == "int":
        return tuple(dict.fromkeys((n, 4, 2, 1, 0)))
    if slot.kind == "bool":
        return (False, True)
    if slot.kind == "str":
        return slot.modes
    if slot.kind == "intlists":  # (groups, entries a group)
        return ((3, n), (1, n), (3, max(2, n // 4)))
    if slot.kind != "tensor":
        return (None,)
    dtype = slot.facts.dtype
    if dtype.is_floating_point:
        values = (None,)
    elif dtype == torch.bool:
        values = ("bools",)
    elif slot.facts.columns:  # entries of distinct index columns: n, then a few
        return ((0, ("columns", n)), (0, ("columns", max(2, n // 4))))
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
        width = shape[-1]
        rows = [torch.randperm(hi - lo, generator=gen)[:width] for _ in range(count // width)]
        return (torch.stack(rows) + lo).to(facts.dtype).reshape(shape)
    # every value of the range (its ends always), in a seeded order
    values = torch.arange(count) % (hi - lo) + lo
    values[-1] = hi - 1
    return values[torch.randperm(count, generator=gen)].to(facts.dtype).reshape(shape)


def _columns(facts: TensorFacts, n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """`count` entries of `facts.columns` indices below n, each column distinct (a rule book
    pairs each input row with one output row: SparseConvNet's forward adds into its output
    rows unguarded, its backward into its input rows), flat where the code reads it flat."""
    width = facts.columns
    made = torch.stack([torch.randperm(n, generator=gen)[:count] for _ in range(width)], 1)
    shape = [count * width] if facts.ndim == 1 else [1] * (facts.ndim - 2) + [count, width]
    return made.to(facts.dtype).reshape(shape)


def _groups(width: int, n: int, choice: tuple, gen: torch.Generator) -> list[list[int]]:
    """Groups of `count` entries of `width` indices below n, each index column of a group
    distinct (a rule book's group pairs each input row with one output row: a kernel that
    writes each output once per group would race on a repeated one), flattened per group."""
    groups, count = choice
    out = []
    for _ in range(groups):
        columns = [torch.randperm(n, generator=gen)[:count] for _ in range(width)]
        out.append(torch.stack(columns, 1).reshape(-1).tolist())
    return out


def drafts(
    slots: list[Slot], n: int, agree: bool = False, only: list | None = None
) -> list[tuple[tuple, list]]:
    """(choice indices, arguments) of the drafts at size n, best first: the fewest steps away
    from each slot's first choice. `agree`: floating tensors hold three values only, so that
    code acting only where two values are equal (a max-pool's backward writes where the
    output equals the input) finds ties anywhere the indices lead; and each tensor tries a
    dimension more first (rows a stride steps over: the code reads only `data_ptr`). `only`:
    the choice indices wanted, in order (the others are not made)."""
    options = [_choices(s, n, wider_first=agree) for s in slots]
    out = []
    combos = (  # the wanted ones in the same order, however many steps away
        only
        if only is not None
        else itertools.islice(_by_steps([len(o) for o in options]), MAX_DRAFTS)
    )
    for combo in combos:
        gen = torch.Generator().manual_seed(SEED + n)  # the same float data in every draft
        args, floats = [], iter(_FLOATS * 8)
        for slot, opts, k in zip(slots, options, combo, strict=True):
            if slot.kind == "tensor" and slot.facts.view:
                args.append(None)  # made once the numbers its shape reads are
            elif slot.kind == "tensor":
                args.append(_drafted(slot.facts, n, opts[k], gen, agree))
            elif slot.kind == "intlists":
                args.append(_groups(slot.width, n, opts[k], gen))
            elif slot.kind == "float":
                args.append(next(floats))
            else:
                args.append(opts[k])
        for i, slot in enumerate(slots):
            if slot.kind == "product":
                args[i] = math.prod(args[f] for f in slot.factors)
        for i, (slot, opts, k) in enumerate(zip(slots, options, combo, strict=True)):
            if slot.kind == "tensor" and slot.facts.view:
                shape = [n if d[0] == "n" else d[1] if d[0] == "literal" else args[d[1]]
                         for d in slot.facts.view]  # fmt: skip
                args[i] = _drafted(slot.facts, n, opts[k], gen, agree, shape)
        for i, slot in enumerate(slots):
            if slot.kind == "count":  # as many entries as the tensor holds
                args[i] = args[slot.factors[0]].numel() // slot.width
        out.append((combo, args))
    return out


def _drafted(facts, n, choice, gen, agree, shape=None) -> torch.Tensor:
    made = _tensor(facts, n, choice, gen, shape)
    if agree and made.is_floating_point():
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


def slots_for(params: list[tuple[str, str]], texts: list[tuple[str, list[str]]]) -> list | None:
    """A slot per parameter, tensors with what `texts` (code, its names for the parameters by
    position) say of them; None when a parameter is of a kind no draft makes."""
    slots, aliases = [], {}
    for code, _ in texts:
        aliases |= type_aliases(code)  # the adapter's reading of `using` and `typedef`
    for i, (type_text, _) in enumerate(params):
        kind = param_kind(type_text)
        if kind == "str":
            named = [string_modes(code, names[i]) for code, names in texts if i < len(names)]
            modes = tuple(dict.fromkeys(m for found in named for m in found))
            if not modes:
                return None
            slots.append(Slot(kind, modes=modes))
            continue
        if kind == "intlists":  # only where the code says how wide an entry is
            widths = [group_width(code, names[i]) for code, names in texts if i < len(names)]
            width = next((w for w in widths if w), None)
            if width is None:
                return None
            slots.append(Slot(kind, width=width))
            continue
        if kind not in ("tensor", "int", "float", "bool"):
            return None
        facts = None
        if kind == "tensor":
            facts = TensorFacts()
            for code, names in texts:
                if i < len(names) and names[i]:
                    read_facts(code, names[i], facts, aliases)
        slots.append(Slot(kind, facts))
    products(slots, texts)
    views(slots, texts)
    return slots if any(s.kind == "tensor" for s in slots) else None


@cache
def _libasan() -> str:
    try:
        found = subprocess.run(
            ["g++", "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return found if found.startswith("/") and Path(found).exists() else ""


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
        done = sandbox.run(argv, COMPILE_LIMITS, cwd=Path(tmp), readable=[source.parent])
        if done.returncode != 0 or not so.is_file():
            log.info("%s does not build with ASan: %s", source.name, done.stderr[-300:])
            return None
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(so.read_bytes())
        return out


def _verdicts(module: Path, name: str, grouped: list, folder: Path) -> dict[int, str]:
    """Each draft's verdict from standalone/probe.py (`grouped`: (group, arguments), a group
    ending at its KEEP-th `ok`); those it did not reach in PROBE_LIMITS have none."""
    data = folder / "drafts.pt"
    torch.save(grouped, data)
    env = {"LD_PRELOAD": _libasan(), "ASAN_OPTIONS": ASAN_OPTIONS, "OMP_NUM_THREADS": "1"}
    out = folder / "verdicts.jsonl"
    argv = [sys.executable, str(PROBE), str(module), name, str(data), str(out), str(KEEP)]
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
    rank = max((s.facts.ndim for s in slots if s.facts), default=1)
    sizes = SIZES_BY_RANK[min(max(rank, 2), 4)]
    floats = sum(s.kind == "tensor" and s.facts.dtype.is_floating_point for s in slots)
    for agree in (False, True):  # then, where no draft wrote, floats with ties
        flat = [(n, combo, args) for n in sizes for combo, args in drafts(slots, n, agree)]
        verdicts = _verdicts_of(module, name, sizes, flat)
        held: dict = {}  # n -> the arguments of its drafts that ran ok, best first
        for k, (n, _, args) in enumerate(flat):
            if verdicts.get(k) == "ok":
                held.setdefault(n, []).append(args)
        if held or floats < 2 or "empty" not in verdicts.values():
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
            for c, a in drafts(slots, t, agree, only=_tile_combos(slots, clean, t))
            if _elements(a) <= MAX_TILE_ELEMENTS
        ]
        tile_verdicts = _verdicts_of(module, name, tiles, more)
        for k, (n, _, args) in enumerate(more):
            if tile_verdicts.get(k) == "ok":
                held.setdefault(n, []).append(args)
    # each size's best draft first (the plan's first calls), then the runners-up
    return [
        BaseCall(held[n][rank], PROBE_ORIGIN)
        for rank in range(KEEP)
        for n in (*sizes, *tiles)
        if rank < len(held.get(n, []))
    ]


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
        if slot.kind == "int":
            before, after = _choices(slot, n), _choices(slot, to)
            value = to if before[k] == n else before[k]
            k = after.index(value) if value in after else k
        out.append(k)
    return tuple(out)


def _elements(args: list) -> int:
    return sum(a.numel() for a in args if isinstance(a, torch.Tensor))


def _verdicts_of(module: Path, name: str, sizes: tuple, flat: list) -> dict[int, str]:
    with tempfile.TemporaryDirectory(prefix="kminer-probe-") as tmp:
        grouped = [(sizes.index(n), args) for n, _, args in flat]
        return _verdicts(module, name, grouped, Path(tmp))
