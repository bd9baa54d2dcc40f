"""What the code says of each parameter of a host function the probe drafts calls for.

A draft is only as good as what the code around a call tells it: the dtype a tensor's data is
read as (through the code's own type names: SparseConvNet's `Int`), the dimensions it reads,
checks and views it in, a literal row width, a string's modes, how wide an entry of a list of
index groups is, and the numbers the code computes from others (a stride checked to be a
product of sizes, a count checked against an index tensor's entries). The launcher's text and
its reference's are read alike, each under its own names for the parameters, so what either
says is known (testgen/probe_inputs.py drafts from it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from miner.textprep import split_top
from testgen.llm_inputs import param_kind
from testgen.made_inputs import C_DTYPES
from testgen.passed_rows import DATA as _DATA
from testgen.passed_rows import data_macros, passed_row, row_widths, single_width
from wrappers.adapter import aliases as type_aliases

_DTYPES = {  # made_inputs' C types, and those only a probe meets (flags, bytes, unsigned)
    **C_DTYPES, "unsigned": torch.int32, "uint32_t": torch.int32, "Half": torch.float16,
    "bool": torch.bool, "uint8_t": torch.uint8, "int8_t": torch.int8, "int16_t": torch.int16,
    "short": torch.int16, "uint": torch.int32, "ushort": torch.int16,
}  # fmt: skip
_SCALAR_NAMES = {
    "Int": torch.int32, "Long": torch.int64, "Float": torch.float32, "Double": torch.float64,
    "Half": torch.float16, "Bool": torch.bool, "Byte": torch.uint8,
}  # fmt: skip
_VIEWED = r"(?:view|reshape)\s*\(\s*\{([^{}]*)\}"  # a view of its data in {dims}
_RANKED_OPS = {"bmm": 3, "baddbmm": 3, "mm": 2, "addmm": 2}  # ATen ops taking only that rank


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
    resized: bool = False  # the code resizes it (an output it sizes itself)
    counted: int | None = None  # slot of the number a row's width exceeds by one, where each
    # row starts with the count of the indices that follow it
    coordinates: bool = False  # rows of grid coordinates, as wide as the dimensions a list of
    # numbers gives (never negative: no -1 means "none" in a grid cell's address)

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
    member = rf"\b{n}\s*(?:\.\s*value\s*\(\s*\)\s*)?(?:\.|->)\s*"  # an optional's too
    for m in re.finditer(member + _DATA + r"\s*<([^<>()]+)>", code):
        _note(facts, _dtype_of(m[1], aliases), m[1])
    row_step = r"\s*<[^<>()]+>\s*\(\s*\)\s*\+\s*(?:\w+\s*\*\s*(\d+)|(\d+)\s*\*\s*\w+)\b(?!\s*[*(])"
    for m in re.finditer(member + _DATA + row_step, code):
        if 1 < int(m[1] or m[2]) <= 64:
            facts.row = int(m[1] or m[2])
    # or a pointer to its data, stepped or indexed by rows of a literal width: OpenPCDet's
    # `const float *boxes_a = boxes_a_tensor.data<float>();` ... `boxes_a + i * 7`
    alias = rf"(?:const\s+)?[\w:]+\s*\*\s*(?:const\s+)?([A-Za-z_]\w*)\s*=\s*{member}{_DATA}\s*<"
    for a in {m[1] for m in re.finditer(alias, code)}:
        facts.row = single_width(row_widths(code, a, code)) or facts.row
    if facts.row is None:  # or by the function its data is handed to
        facts.row = passed_row(code, name)
    for m in re.finditer(member + r"\w*accessor\w*\s*<\s*([^,<>]+?)\s*,\s*(\d+)", code):
        _note(facts, _dtype_of(m[1], aliases), m[1])
        facts.rank = max(facts.rank, int(m[2]))
    for m in re.finditer(member + r"size\s*\(\s*(-?)\s*(\d+)\s*\)", code):  # size(-2): two
        facts.rank = max(facts.rank, int(m[2]) + (0 if m[1] else 1))  # dims at least
    for m in re.finditer(member + r"stride\s*\(\s*(\d+)\s*\)", code):  # steps over dim k
        facts.rank = max(facts.rank, int(m[1]) + 2)  # to reach dim k + 1 (a row's stride)
    if re.search(member + r"eq\s*\(\s*0\s*\)\s*\.\s*all\s*\(", code):
        facts.zeros = True
    if re.search(member + r"resize_(?:as_)?\s*\(", code):
        facts.resized = True
    for m in re.finditer(member + _VIEWED, code):  # a view of its data as k dims; the unit
        dims = [d for d in split_top(m[1]) if d.strip() != "1"]  # dims a view adds are not its
        facts.rank = max(facts.rank, len(dims) or 1)  # own (`S.view({1, 1, K})`: K numbers)
    unsqueezed = r"unsqueeze\s*\(\s*-?\d+\s*\)\s*\.\s*expand\s*\(\s*\{([^{}]*)\}"
    for m in re.finditer(member + unsqueezed, code):  # a dim more, then k: k - 1 of its own
        facts.rank = max(facts.rank, len(split_top(m[1])) - 1)
    for op, rank in _RANKED_OPS.items():  # a batched or plain matrix product: exactly so many
        as_arg = rf"\b(?:at|torch)::{op}\s*\(\s*(?:{n}\s*,|[^(),;]+,\s*{n}\s*\))"
        if re.search(rf"{as_arg}|{member}{op}\s*\(|\.\s*{op}\s*\(\s*{n}\s*\)", code):
            facts.fixed_rank = rank
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
    # a typed view: `tv::torch2tv<const int>(x)`, of k dims: `devicetensor<scalar_t, 3>(x)`
    typed = rf"\b\w+\s*<\s*(?:const\s+)?([A-Za-z_][\w:]*)\s*(?:,\s*(\d+)\s*)?>\s*\(\s*{n}\s*\)"
    for m in re.finditer(typed + r"(\s*\.\s*subview\s*\(([^()]*)\))?", code):
        _note(facts, _dtype_of(m[1], aliases), m[1])
        if m[2]:
            facts.rank = max(facts.rank, int(m[2]))
        if m[3]:  # a view k indices into it has k dimensions more than the one it gives
            facts.rank = max(facts.rank, len(split_top(m[4])) + 1)
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
    width: int = 1  # of a list of index groups: the indices one entry of a group takes; of
    # a list of numbers (one a spatial dimension): how many it holds
    factors: tuple = ()  # of a number the code checks to be their product: their slots
    first: int | None = None  # of a list of numbers: the value tried first (None: the size n)


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


def _view_dim(text: str, index: dict, slots: list[Slot]) -> tuple | None:
    if text == "-1":
        return ("n",)
    if text.isdigit() and 0 < int(text) <= 64:
        return ("literal", int(text))
    k = index.get(text)
    return ("slot", k) if k is not None and slots[k].kind in ("int", "product") else None


def counted_rows(slots: list[Slot], texts: list[tuple[str, list[str]]]) -> None:
    """Tables of rows each starting with the count of the indices that follow, a row of a
    width one more than a number the code takes (SparseConvNet's active pooling: `const Int *r
    = &rules[0][outSite * (maxActive + 1)]; Int nActive = *r++;`, each row a sample's sites):
    drafted in rows of that width, each count at most the number, every index once in the
    table (a kernel that writes the indexed rows plainly would race on a repeated one)."""
    for code, names in texts:
        index = {n: i for i, n in enumerate(names) if i < len(slots) and n}
        for name, i in index.items():
            if slots[i].kind != "tensor" or slots[i].facts.counted is not None:
                continue
            n = re.escape(name)
            row = (  # `r = &rules[0][k * (width + 1)]`, `r = &rules[k * (width + 1)]`
                rf"(\w+)\s*=\s*&\s*{n}\s*(?:\[\s*0\s*\]\s*)?"
                r"\[\s*\w+\s*\*\s*\(\s*(\w+)\s*\+\s*1\s*\)\s*\]"
            )
            for m in re.finditer(row, code):
                width = index.get(m[2])
                count = rf"\b\w+\s+\w+\s*=\s*\*\s*{re.escape(m[1])}\s*\+\+"
                if (
                    width is not None
                    and slots[width].kind == "int"
                    and re.search(count, code[m.end() :])
                ):
                    slots[i].facts.counted = width
                    break


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


_PER_DIMENSION = (  # a convolution's numbers per spatial dimension, as the field names them:
    # the usual 3-wide kernel at stride 1, padded by 1, undilated; shapes and sizes are n
    (re.compile(r"kernel|ksize|filter", re.I), 3),
    (re.compile(r"stride|dilat|pad", re.I), 1),
)


def _length_checks(code: str, name: str) -> tuple[int | None, tuple | None]:
    """(length, link) of the list of numbers `name` as the code checks its size: a literal
    (`ksize.size() == 3`), or a tensor's dimension less a number, directly or through a local
    (`coorDim = indices.size(1) - 1; ... kernelSize.size() == coorDim`): link (tensor name,
    dimension, the number)."""
    n = re.escape(name)
    sized = rf"\b{n}\s*\.\s*size\s*\(\s*\)\s*==\s*"
    m = re.search(sized + r"(\d+)\b", code)
    if m and 0 < int(m[1]) <= 8:
        return int(m[1]), None
    dim = r"([A-Za-z_]\w*)\s*\.\s*size\s*\(\s*(\d)\s*\)\s*(?:-\s*(\d)\b)?"
    m = re.search(sized + dim + r"\s*[,)]", code)
    if m:
        return None, (m[1], int(m[2]), int(m[3] or 0))
    for m in re.finditer(sized + r"([A-Za-z_]\w*)\s*[,)]", code):
        local = re.search(rf"\b{re.escape(m[1])}\s*=\s*{dim}\s*;", code)
        if local:
            return None, (local[1], int(local[2]), int(local[3] or 0))
    return None, None


def per_dimension(slots: list[Slot], params, texts: list[tuple[str, list[str]]]) -> None:
    """Lists of numbers, one per spatial dimension (a sparse convolution's kernel size,
    stride, padding, dilation and output shape as `std::vector<int64_t>`): as long as the code
    checks, else as the bound instantiation's number (`&f<3>`: NDim), else 3; a tensor the
    code checks a list's length against (`indices.size(1) - 1`: one column a dimension after
    the batch's) drafted that wide, as coordinates; and each list first at the value its name
    gives (a shape's, n only: a grid smaller than the coordinates is addressed out of bounds
    inside the code's own buffers, where AddressSanitizer's fences are not)."""
    lists = [i for i, s in enumerate(slots) if s.kind == "ints"]
    if not lists:
        return
    lengths, links = {}, {}
    for code, names in texts:
        index = {n: i for i, n in enumerate(names) if i < len(slots) and n}
        for i in lists:
            if i < len(names) and names[i]:
                length, link = _length_checks(code, names[i])
                if length and i not in lengths:
                    lengths[i] = length
                if link and link[0] in index and i not in links:
                    links[i] = (index[link[0]], *link[1:])
    bound = [re.search(r"&\s*[\w:]+\s*<\s*(\d)\s*>\s*\)", code) for code, _ in texts]
    common = next(iter(lengths.values()), None) or next((int(b[1]) for b in bound if b), 3)
    for i in lists:
        slot = slots[i]
        slot.width = lengths.get(i, common)
        name = params[i][1] or ""
        slot.first = next((v for pattern, v in _PER_DIMENSION if pattern.search(name)), None)
        if i in links and slots[links[i][0]].kind == "tensor":
            tensor, dim, less = links[i]
            facts = slots[tensor].facts
            facts.fixed_dims[dim] = slot.width + less
            facts.rank = max(facts.rank, dim + 1)
            facts.coordinates = not facts.dtype.is_floating_point


def int_flags(slots: list[Slot], texts: list[tuple[str, list[str]]]) -> None:
    """Integers the code only asks "not zero?" of (`bool subM = _subM != 0;`: a mode passed as
    an int64 through torch.ops) are flags, drafted off, then on: drafted as sizes, every draft
    kept would ask for one mode."""
    for code, names in texts:
        for i, name in enumerate(names[: len(slots)]):
            if not name or slots[i].kind != "int":
                continue
            n = re.escape(name)
            asked = rf"\bbool\s+\w+\s*=\s*(?:{n}\s*!=\s*0|\(\s*{n}\s*!=\s*0\s*\)|{n})\s*;"
            if re.search(asked, code):
                slots[i] = Slot("flag")


_ENUM = re.compile(r"\benum\s+(?:class\s+|struct\s+)?(\w+)\s*(?::\s*[\w\s]+?)?\{([^{}]*)\}")


def enum_values(code: str, type_text: str) -> tuple[int, ...]:
    """The values of the enum a parameter's type names, as the code declares it (inplace_abn's
    `enum class Activation { LeakyReLU, ELU, Identity }`: 0, 1, 2), () when the code declares
    none or one valued otherwise than by literals. The binding takes it as an integer."""
    name = re.sub(r"\b(?:const|volatile)\b|&", " ", type_text).split()
    name = name[-1].split("::")[-1] if name else ""
    for found in _ENUM.finditer(code):
        if found.group(1) != name:
            continue
        values, nxt = [], 0
        for item in filter(None, (x.strip() for x in found.group(2).split(","))):
            _, eq, value = item.partition("=")
            if eq:
                try:
                    nxt = int(value.strip(), 0)
                except ValueError:
                    return ()
            values.append(nxt)
            nxt += 1
        return tuple(dict.fromkeys(values))
    return ()


def slots_for(params: list[tuple[str, str]], texts: list[tuple[str, list[str]]]) -> list | None:
    """A slot per parameter, tensors with what `texts` (code, its names for the parameters by
    position) say of them; None when a parameter is of a kind no draft makes."""
    slots, aliases = [], {}
    texts = [(data_macros(code), names) for code, names in texts]
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
        if kind == "ints":  # numbers, one per spatial dimension (probe_slots.per_dimension)
            slots.append(Slot(kind))
            continue
        if kind == "any":  # an enum the code declares: each of its values, as a mode
            modes = next((v for code, _ in texts if (v := enum_values(code, type_text))), ())
            if not modes:
                return None
            slots.append(Slot("enum", modes=modes))
            continue
        if kind == "tensor?":  # drafted present: the code that reads it runs (sampled_op's
            kind = "tensor"  # left_index), where absent it would only be skipped
        if kind not in ("tensor", "int", "float", "bool"):
            return None
        facts = None
        if kind == "tensor":
            facts = TensorFacts()
            for code, names in texts:
                if i < len(names) and names[i]:
                    read_facts(code, names[i], facts, aliases)
        slots.append(Slot(kind, facts))
    int_flags(slots, texts)
    products(slots, texts)
    per_dimension(slots, params, texts)
    views(slots, texts)
    counted_rows(slots, texts)
    return slots if any(s.kind == "tensor" for s in slots) else None
