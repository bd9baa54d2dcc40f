"""The cases of a kernel's test: the repository's own calls, carried down to the label's launcher
(testgen/carry.py), and the cases derived from them.

From those base calls the plan derives the rest of the cases: every dtype the label instantiates
(its AT_DISPATCH macro), and edge values (zeros, negatives, large magnitudes) in the first
floating tensor, which is the op's data by the convention every launcher we met follows (past a
list of regions that leads with a batch index: `edge_arg`); index and geometry tensors are never
touched, so a derived case stays valid, but for an index tensor's absent entries (-1), which one
case fills with indices it holds (testgen/sentinels.py).
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from dataclasses import dataclass, field

from miner.candidate import Candidate
from testgen.carry import bind_call, carry_down
from testgen.index_rows import index_subsets
from testgen.inputs import RecordedCall
from testgen.interp import Unmappable
from testgen.rank_variants import MAX_RANK_BASES, rank_variants
from testgen.resize import COUNT_NAME, conv_resize, more_rows, row_evidence, row_subsets
from testgen.segments import more_segments, segment_subsets
from testgen.sentinels import filled_calls, zero_positions
from testgen.shape_selectors import resized

MIN_CASES, MIN_SHAPES = 5, 3  # below this a test is kept, and the shortfall is said
MAX_BASE_CALLS = 8
MAX_ROW_CALLS = 4  # calls derived by keeping fewer rows (new shapes for a test recorded at one)
MAX_BINDING_CALLS = 4  # calls derived at the binding, then carried down (binding_variants)
MAX_ELEMENTS = 1 << 20  # per call: larger recorded inputs are left out of the test file
MAX_FLAG_FLIPS = 3  # calls with a boolean argument the recorded calls never vary, flipped
MAX_MODE_CROSSES = 4  # calls with a string mode at a kind of shape it was never recorded with
MAX_MODE_EDGES = 6  # modes (scalar arguments) whose first call also gets a x LARGE case
MAX_SELECTED_CALLS = 4  # base calls (one per shape) run again with a kernel-selecting value
_HALF = re.compile(r"AT_DISPATCH_FLOATING_TYPES_AND_HALF|AT_DISPATCH_FLOATING_TYPES_AND2?\s*\(")
_FLOATING = re.compile(r"AT_DISPATCH_FLOATING_TYPES|AT_DISPATCH_ALL_TYPES")


@dataclass
class BaseCall:
    args: list  # in the launcher's parameter order
    origin: str  # the repository test file it was recorded from
    rows_of: int | None = None  # derived: the first `rows` rows of this base call
    rows: int = 0
    more: bool = False  # derived: `rows` rows drawn from those of base call `rows_of`
    call: RecordedCall | None = None  # the repository's call it was carried down from
    derived: str = ""  # how the binding call was changed before it was carried down
    selects: bool = False  # derived: an argument set to the value that launches the kernel
    filled: str = ""  # derived: what was filled that the recorded calls leave empty (sentinels)
    edges: tuple | None = None  # the edge values its reference runs clean (None: not checked)

    def allows(self, edge: str) -> bool:
        return self.edges is None or edge in self.edges


@dataclass
class CasePlan:
    base: list[BaseCall] = field(default_factory=list)
    cases: list[dict] = field(default_factory=list)  # {"id", "base", "dtype", "edge", "made"...}
    dtypes: list[str] = field(default_factory=list)
    shapes: int = 0


def _size(args: list) -> int:
    return sum(int(a.numel()) for a in args if hasattr(a, "numel"))


def _smallest_cut(calls: list[BaseCall], recorded: int) -> int | None:
    """The smallest call made from fewer rows of a recorded one (a binding's or a row cut),
    which also gets the random values of the inputs zeros in every recorded call. pytorch3d's
    recorded meshes hold 72 faces whose corners repeat a vertex: there the GPU's fused
    multiply-add, divided by max(norm, 1e-6), moves the face normals' gradient by 1e3, so the
    case on the whole mesh was left out as outside the contract and three wrong signs in the
    terms the gradient scales passed; the 13-face cut holds no such face."""
    cuts = [
        i
        for i in range(recorded, len(calls))
        if calls[i].rows_of is not None
        and not calls[i].more
        and _size(calls[i].args) < _size(calls[calls[i].rows_of].args)
    ]
    return min(cuts, key=lambda i: (_size(calls[i].args), i)) if cuts else None


def _signature(args: list) -> str:
    import torch

    buf = io.BytesIO()
    torch.save([a for a in args], buf)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def shape_key(args: list) -> tuple:
    """The call's shapes; a tensor laid out otherwise than row-major also by its dimensions'
    order in memory (a channel-last call is another case than the channel-first one)."""
    return tuple(_layout(a) for a in args)


def _layout(a) -> tuple:
    if not hasattr(a, "shape"):
        return ()
    if a.is_contiguous():
        return tuple(a.shape)
    return (tuple(a.shape), tuple(sorted(range(a.dim()), key=lambda d: -a.stride(d))))


def base_calls(
    cand: Candidate, calls: list[RecordedCall], refs
) -> tuple[list[BaseCall], list[str]]:
    """Distinct launcher calls (most distinct shapes first, MAX_BASE_CALLS at most), and why
    the others could not be used. A call over MAX_ELEMENTS comes over as many of its first rows
    as fit (mmcv's dynamic scatter test: 200000 points), a call kminer made."""
    found: list[BaseCall] = []
    why: list[str] = []
    seen: set[str] = set()
    required = _required_tensors(cand, refs)
    exposed = (cand.wrapper.functions or [cand.wrapper.launcher])[0]
    names = refs.params_of(exposed)
    for call in calls:
        not_count = _cut_not_a_count(call, refs)
        if not_count:
            why.append(not_count)
            continue
        try:
            args = carry_down(call, cand, refs)
        except Unmappable as e:
            why.append(str(e))
            continue
        if any(i < len(args) and args[i] is None for i in required):
            why.append("a recorded call passes None where the launcher takes a tensor")
            continue  # (made from a result the recording could not compute)
        rows, fitted = embeddable(args, names)
        derived = f"the first {rows} rows of a recorded call too large to embed" if rows else ""
        if call.rows_cut:
            n, r = call.rows_cut[:2]
            derived = f"the first {rows or r} of {n} rows of a test's call too large to record"
        if fitted is None and (fitted := cropped(args)) is not None:
            derived = "a corner of a recorded call too large to embed"
        if fitted is None:
            why.append("a recorded call is too large to embed")
            continue
        sig = _signature(fitted)
        if sig not in seen:
            seen.add(sig)
            found.append(BaseCall(fitted, call.test_file, call=call, derived=derived))
    return _diverse(found), why


def _cut_not_a_count(call: RecordedCall, refs) -> str:
    """Why a call the recorder kept as its first rows cannot stand for the test's call: an
    integer argument it set from the row count to the rows kept is not named as a count (it
    may be a size of something else that happened to equal it); "" when it can."""
    if not call.rows_cut:
        return ""
    n, r, where = call.rows_cut
    try:
        params, _ = bind_call(call, refs)
    except Unmappable as e:
        return str(e)
    names = [params[k] if isinstance(k, int) and k < len(params) else str(k) for k in where]
    wrong = [name for name in names if not COUNT_NAME.match(name)]
    if wrong:
        return (
            f"a test's call too large to record has {n} rows, as its `{wrong[0]}`, which is not "
            f"named as a count: its first {r} rows cannot stand for it"
        )
    return ""


def cropped(args: list) -> list | None:
    """A corner of a call too large to embed whose one tensor is a grid of data (an image, a
    volume: a float tensor of two or more dimensions over 1; torchmcubes' 128^3 field): each
    dimension halved, the largest first, until it fits. None where an integer argument equals
    one of its sizes (a size the kernel is told as well, which a crop would contradict)."""
    tensors = [i for i, a in enumerate(args) if hasattr(a, "shape")]
    if len(tensors) != 1:
        return None
    grid = args[tensors[0]]
    if not grid.is_floating_point() or sum(int(d) > 1 for d in grid.shape) < 2:
        return None
    sizes = {int(d) for d in grid.shape if d > 1}
    if any(isinstance(a, int) and not isinstance(a, bool) and a in sizes for a in args):
        return None
    shape = [int(d) for d in grid.shape]
    while math.prod(shape) > MAX_ELEMENTS:
        k = max(range(len(shape)), key=lambda d: shape[d])
        shape[k] = (shape[k] + 1) // 2
    out = list(args)
    out[tensors[0]] = grid[tuple(slice(0, n) for n in shape)].clone()
    return out


def embeddable(args: list, names: list[str] | None) -> tuple[int, list | None]:
    """(0, the call) when it fits in a test file; else (m, its first m rows) for the most rows
    that fit, where its rows can be cut (testgen.resize); (0, None) when neither."""
    if _size(args) <= MAX_ELEMENTS:
        return 0, args
    fits = [(m, a) for m, a in row_subsets(args, names) if _size(a) <= MAX_ELEMENTS]
    return max(fits, key=lambda f: f[0]) if fits else (0, None)


def _required_tensors(cand: Candidate, refs) -> set[int]:
    """Positions of the exposed function's parameters that must be tensors (`at::Tensor`,
    `const torch::Tensor &`; not an optional one), which no call may fill with None."""
    exposed = (cand.wrapper.functions or [cand.wrapper.launcher])[0]
    item = refs.definition(exposed)
    sig = refs.signature(item) if item is not None else None
    if sig is None:
        return set()
    return {
        i
        for i, (typ, _) in enumerate(sig.params)
        if re.search(r"\bTensor\b", typ) and not re.search(r"optional|\*", typ)
    }


def binding_variants(base: list[BaseCall], cand: Candidate, refs) -> list[BaseCall]:
    """New shapes made where the repository makes its calls: a recorded binding call with fewer
    rows or, for a convolution, a larger input (testgen.resize), carried down like any recorded
    call, so whatever the launcher gets from them (buffers, counts, output sizes) is computed by
    the repository's own host code. MAX_BINDING_CALLS at most, each of a new launcher shape."""
    shapes = {shape_key(b.args) for b in base}
    out: list[BaseCall] = []
    for i, b in enumerate(base):
        if b.call is None:
            continue
        try:
            params, bound = bind_call(b.call, refs)
        except Unmappable:
            continue
        args = [bound[p] for p in params]
        tries = [(f"the first {m} rows", a) for m, a in row_subsets(args, params)]
        tries += [(f"the first {m} segments", a) for m, a in segment_subsets(args)]
        tries += conv_resize(args, params)
        for how, new in tries:
            if len(out) >= MAX_BINDING_CALLS:
                return out
            call = RecordedCall(b.call.function, new, {}, b.call.test_file)
            try:
                launched = carry_down(call, cand, refs)
            except (Unmappable, ValueError, RuntimeError, IndexError):
                continue
            if shape_key(launched) in shapes or _size(launched) > MAX_ELEMENTS:
                continue
            shapes.add(shape_key(launched))
            out.append(BaseCall(launched, b.origin, rows_of=i, call=call, derived=how))
    return out


def mode_key(args: list) -> tuple:
    """The call's scalar arguments by position: the mode it runs in (a reduction, a type of
    mask). An optional argument given or left out (None) is no other mode, nor is a count
    (an integer above 1 that is the size of one of the call's tensors)."""
    dims = {int(d) for a in args if hasattr(a, "shape") for d in a.shape}
    return tuple(
        (i, repr(a))
        for i, a in enumerate(args)
        if not hasattr(a, "shape")
        and a is not None
        and not (isinstance(a, int) and not isinstance(a, bool) and a > 1 and a in dims)
    )


def _spread(queue: list[BaseCall]) -> list[BaseCall]:
    """A mode's first call (its typical case), then its other shapes spread evenly from the
    smallest to the largest: a launcher that picks its kernel by a size (`channels > 1024`)
    gets calls on each side of its thresholds, not only the first sizes a test lists."""
    first, distinct, again = queue[0], {}, []
    for b in queue[1:]:
        key = shape_key(b.args)
        if key in distinct or key == shape_key(first.args):
            again.append(b)
        else:
            distinct[key] = b
    by_size = sorted(distinct.values(), key=lambda b: _size(b.args))
    n, k = len(by_size), min(MAX_BASE_CALLS - 1, len(by_size))
    picks = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0][:k]
    rest = [b for i, b in enumerate(by_size) if i not in picks]
    return [first, *(by_size[i] for i in picks), *rest, *again]


def _diverse(found: list[BaseCall]) -> list[BaseCall]:
    """MAX_BASE_CALLS of the calls, round robin over modes, each turn taking a shape not taken
    yet where the mode has one: a kernel that only one mode launches (scatter's arg kernel: min
    and max) gets its calls even when the repository's tests call the other modes far more."""
    modes: dict[tuple, list[BaseCall]] = {}
    for b in found:
        modes.setdefault(mode_key(b.args), []).append(b)
    modes = {m: _spread(queue) for m, queue in modes.items()}
    ordered: list[BaseCall] = []
    shapes: set[tuple] = set()
    while len(ordered) < min(MAX_BASE_CALLS, len(found)):
        for queue in modes.values():  # each mode in turn: a shape not taken yet, if it has one
            if not queue or len(ordered) >= MAX_BASE_CALLS:
                continue
            at = next((i for i, b in enumerate(queue) if shape_key(b.args) not in shapes), 0)
            pick = queue.pop(at)
            ordered.append(pick)
            shapes.add(shape_key(pick.args))
    return ordered


def label_dtypes(label_text: str) -> list[str]:
    """The floating dtypes the label instantiates, by its dispatch macro."""
    if _HALF.search(label_text):
        return ["float32", "float64", "float16"]
    if _FLOATING.search(label_text):
        return ["float32", "float64"]
    return ["float32"]


def first_float(args: list) -> int | None:
    for i, a in enumerate(args):
        if getattr(a, "is_floating_point", lambda: False)():
            return i
    return None


EDGES = ("zeros", "negative", "large")
LARGE = 1000.0


def with_edge(args: list, edge: str) -> list:
    """`args` with the edge values in its data (`edge_arg`), as the test's `_prepare` puts them."""
    d = edge_arg(args)
    out = [a.clone() if hasattr(a, "clone") else a for a in args]
    if d is None:
        return out
    if edge == "zeros":
        out[d].zero_()
    elif edge == "negative":
        out[d].neg_()
    else:
        out[d].mul_(LARGE)
    return out


def edge_arg(args: list) -> int | None:
    """The tensor that gets the edge values: the first floating one, unless it is a list of
    regions whose first column is a batch index (rois (K, 5) as `[b, x1, y1, x2, y2]`) and a
    later floating tensor is not. Negated or enlarged, that column indexes outside the batch:
    the reference and the kernel read and write outside their buffers (PyTorch-Encoding's
    RoIAlign backward ran its 8 cases, then died at exit of the heap its CPU twin corrupted)."""
    floats = [i for i, a in enumerate(args) if getattr(a, "is_floating_point", lambda: False)()]
    data = [i for i in floats if not _batch_column(args[i], args)]
    return (data or floats or [None])[0]


def _batch_column(t, args: list) -> bool:
    """Whether column 0 of a box-like tensor holds batch indices: whole numbers from 0, each
    below a batch size the call states (an integer argument, or dim 0 of a >= 3-D tensor)."""
    if not _box_like(t) or not t.numel():
        return False
    col = t[:, 0].double()
    if not bool(((col >= 0) & (col == col.round())).all()):
        return False
    top = int(col.max())
    sizes = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    sizes += [int(a.shape[0]) for a in args if hasattr(a, "dim") and a.dim() >= 3]
    return any(top < n for n in sizes)


def _box_like(t) -> bool:
    """A list of boxes or polygons (K, 4..9): zeroing it makes every box degenerate, where
    the op (an IoU, an NMS) is undefined, so it gets no `zeros` edge case."""
    return t.dim() == 2 and 4 <= t.shape[1] <= 9


def tile_times(elements: int, at_least: int = 4096) -> list[int]:
    """How many copies of the channels to try: 3 and 37, and for data so small that 37 copies
    stay under `at_least` elements (3 values of a bias-act row) an odd count that passes it, so
    a kernel's loop over several blocks or several items per thread is reached at all."""
    times = [3, 37]
    if 0 < elements * 37 < at_least:
        times.append(-(-at_least // elements) | 1)
    return times


def channel_tiling(
    args: list, names: list[str] | None = None, loose: bool = False
) -> list[int] | None:
    """The tensors to repeat along dim 1 to widen the data's channels, or None when that may
    not be valid: the data (first floating tensor) must be >= 3-D with C channels (or 2-D
    beside a 1-D tensor of C values, which says its dim 1 is channels); every >= 3-D
    tensor with C at dim 1 goes along (outputs, gradients), and so does a 1-D tensor of C
    values when C > 1 (a per-channel bias or scale; an integer one, such as a kernel size per
    coordinate of (E, D) points, says dim 1 is not channels); no integer argument may be C (it
    could be the channel count; with C = 1, only one whose name says channels counts, as 1 is
    every flag's value) and no tensor may have a multiple of C at dim 1 (a layout that
    mixes channels with something else). Every size is a multiple of C = 1, so that rule says
    nothing then; `loose` drops it for C = 1 (a last resort for a call of too few shapes: a wrong
    guess makes the test fail the right kernel, never pass a wrong one)."""
    d = first_float(args)
    if d is None or args[d].dim() < 2:
        return None
    c = int(args[d].shape[1])
    per_channel = [
        i
        for i, a in enumerate(args)
        if hasattr(a, "dim") and a.dim() == 1 and c > 1 and int(a.shape[0]) == c and i != d
    ]
    if args[d].dim() < 3 and not per_channel:  # 2-D data: its dim 1 is channels only beside
        return None  # a vector of one value per channel
    if any(not (args[i].is_floating_point() or args[i].is_complex()) for i in per_channel):
        return None  # integers per entry (spline_conv's kernel_size per pseudo dimension): axes
    low = min(3, args[d].dim())
    names = names or [""] * len(args)
    for a, name in zip(args, names, strict=False):
        named = re.search(r"chan|^c$|^C$|planes|dim", name or "c")
        if isinstance(a, int) and not isinstance(a, bool) and a == c and (c > 1 or named):
            return None
    picked = []
    for i, a in enumerate(args):
        if i in per_channel:
            picked.append(i)  # one value per channel (a bias, a scale): widened with them
        elif hasattr(a, "dim") and a.dim() >= 2 and a.numel():
            dim1 = int(a.shape[1])
            if a.dim() >= low and dim1 == c:
                picked.append(i)
            elif dim1 != c and dim1 % c == 0 and a.dim() >= low and not (loose and c == 1):
                return None
    return picked


def _widenings(
    base: list[BaseCall], names: list[str] | None, largest: int, d: int, loose: bool
) -> list[tuple[int, int, list[int]]]:
    """(copies, base call, tensors repeated) of each channel-widening case: from the largest
    recorded call whose widened tensors stay within MAX_ELEMENTS, else the next largest shape.
    37 copies of a large call are minutes of a CPU reference that compares every pair
    (ChamferDistancePytorch's 32 x 2000 points became 74000 a cloud: the test ran out of time)."""
    shapes = _distinct_shapes(base)
    bigger_first = sorted(shapes, key=lambda k: (k != largest, -_size(base[k].args)))
    tilings = []
    for k in bigger_first:
        tiled = channel_tiling(base[k].args, names)
        if not tiled and loose:
            tiled = channel_tiling(base[k].args, names, loose=True)
        if tiled:
            tilings.append((k, tiled))
    out = []
    for times in tile_times(base[largest].args[d].numel()):
        for k, tiled in tilings:
            added = sum(int(base[k].args[i].numel()) for i in tiled) * (times - 1)
            if _size(base[k].args) + added <= MAX_ELEMENTS:
                out.append((times, k, tiled))
                break
    return out


_NO_MODE = re.compile(r"verbose|debug|print|log|check|profil|sync|timing", re.IGNORECASE)


def _modes(base: list[BaseCall], names: list[str] | None, kind: type) -> list[int]:
    """Positions of the arguments of type `kind` in every base call that may choose a mode:
    not one whose name says it only sets how much to print or check."""
    names = names or [""] * len(base[0].args)
    return [
        i
        for i, a in enumerate(base[0].args)
        if isinstance(a, kind)
        and not _NO_MODE.search((names[i] if i < len(names) else "") or "")
        and all(i < len(b.args) and isinstance(b.args[i], kind) for b in base)
    ]


def flag_flips(
    base: list[BaseCall], names: list[str] | None = None
) -> list[tuple[int, list, bool]]:
    """(argument, args, value it had): the first call with one boolean argument flipped, for
    each boolean the recorded calls never vary (a kernel launched only in the mode they never
    ask for, as batch norm's inference pass under a training script, is reached at all). The
    reference gets the same flag: a mode it refuses is invalid."""
    out = []
    for i in _modes(base, names, bool):
        a = base[0].args[i]
        if all(b.args[i] is a for b in base):
            args = [*base[0].args]
            args[i] = not a
            out.append((i, args, a))
    return out[:MAX_FLAG_FLIPS]


def _ranks(args: list, skip: int) -> tuple:
    """The kind of shape a call has: each argument's rank (None where it is left out)."""
    return tuple(
        (a.dim() if hasattr(a, "dim") else "None" if a is None else "")
        for k, a in enumerate(args)
        if k != skip
    )


def _full(args: list, dtypes: list[str]) -> str | None:
    """The dtype a mode's case runs in: full precision where the recorded call's data is
    half (a half case leaves integer outputs unjudged when only they differ, and the mode's
    kernel may write nothing else, as scatter's argmin/argmax); None keeps the recorded one."""
    d = first_float(args)
    if d is None or str(args[d].dtype) not in ("torch.float16", "torch.bfloat16"):
        return None
    return next((dt for dt in dtypes if dt in ("float32", "float64")), None)


def _rank_sum(args: list) -> int:
    return sum(len(a.shape) for a in args if hasattr(a, "shape"))


def mode_crosses(
    base: list[BaseCall], names: list[str] | None = None
) -> list[tuple[int, int, list, str]]:
    """(argument, base call, args, value it had) for a string mode the recorded calls vary
    (`reduce` of "sum", "mean", "min", "max") set on a call whose kind of shape (the ranks of
    its arguments) was never recorded with it: scatter's min/max over a broadcast row runs a
    kernel of its own, yet the tests ask for min/max on flat rows only. Per mode, the call of
    highest rank that is new to it."""
    out = []
    for i in _modes(base, names, str):
        values = list(dict.fromkeys(b.args[i] for b in base))
        if len(values) < 2:
            continue
        for v in values:
            seen = {_ranks(b.args, i) for b in base if b.args[i] == v}
            new = [k for k, b in enumerate(base) if _ranks(b.args, i) not in seen]
            if not new:
                continue
            k = max(new, key=lambda j: (_rank_sum(base[j].args), -j))
            args = [*base[k].args]
            args[i] = v
            out.append((i, k, args, base[k].args[i]))
    return out[:MAX_MODE_CROSSES]


def _row_evidence(base: list[BaseCall]) -> list:
    """Per base call, what the calls of its layout say about which sizes are its row count
    (testgen.resize.row_evidence)."""
    groups: dict[tuple, list[int]] = {}
    for i, b in enumerate(base):
        kinds = tuple(a.dim() if hasattr(a, "dim") else type(a).__name__ for a in b.args)
        groups.setdefault(kinds, []).append(i)
    out = [None] * len(base)
    for members in groups.values():
        found = row_evidence([base[i].args for i in members])
        for i in members:
            out[i] = found
    return out


def _distinct_shapes(base: list[BaseCall]) -> list[int]:
    """The first base call of each shape."""
    firsts: dict = {}
    for i, b in enumerate(base):
        firsts.setdefault(shape_key(b.args), i)
    return list(firsts.values())


def plan(
    base: list[BaseCall],
    dtypes: list[str],
    names: list[str] | None = None,
    derived: list[BaseCall] = (),
    made: bool = False,
    selectors: list[tuple[int, int]] = (),
    sized: list[tuple[int, int, int]] = (),
    whole: bool = False,
    ranks: dict[int, set[int]] | None = None,
) -> CasePlan:
    """Every base call as recorded, fewer rows of them where that gives new shapes, and a
    larger random one drawn from the rows of the largest (testgen.resize); then, on the first
    base call (the typical case), edge values (large values also on the first call of each other
    mode), wider channels (new shapes, sizes off any block multiple) and each other dtype. The
    first and the largest base call come again with what no recorded call holds: an index
    tensor's absent entries filled, the inputs that are zeros in every call drawn at random
    (testgen/sentinels.py).

    `whole`: the calls are valid only as they are (probed ones: the CPU implementation ran each
    exactly so, and a cut of rows leaves indices into rows that are gone, which crashed
    torchsparse's voxelize backward reference), so no rows are cut or drawn, no flag flipped,
    no mode crossed and no channels widened: only values and dtypes change."""
    out = CasePlan(base=list(base), dtypes=[])
    if not base:
        return out

    def add(cid, b, dtype=None, edge=None, tile=None, flag=None, was=None, as_recorded=False):
        case = {"id": cid, "base": b, "dtype": dtype, "edge": edge, "tile": tile}
        case["made"] = not as_recorded  # inputs kminer made or changed (rows, values, dtype...)
        out.cases.append(case | ({"flag": flag, "was": was} if flag is not None else {}))

    for i, b in enumerate(base):
        kminer_made = made or b.derived or (b.call is not None and b.call.made)
        add(f"{'generated' if made else 'recorded'}_{i}", i, as_recorded=not kminer_made)
    shapes = {shape_key(b.args) for b in base}
    for k, b in enumerate(derived):  # made at the binding (binding_variants)
        if shape_key(b.args) not in shapes:
            shapes.add(shape_key(b.args))
            out.base.append(b)
            add(f"binding_{k}_of_{b.rows_of}", len(out.base) - 1)
    evidence = _row_evidence(base)
    for i, b in enumerate([] if whole else base):
        cuts = row_subsets(b.args, names, evidence[i]) + segment_subsets(b.args)
        for m, args in cuts or index_subsets(b.args, names):
            if shape_key(args) in shapes or len(out.base) - len(base) >= MAX_ROW_CALLS:
                continue
            shapes.add(shape_key(args))
            out.base.append(BaseCall(args, b.origin, rows_of=i, rows=m))
            add(f"rows{m}_of_{i}", len(out.base) - 1)
    largest = max(range(len(base)), key=lambda i: _size(base[i].args))
    more = []
    if not whole:
        more = [more_rows(base[largest].args, names, MAX_ELEMENTS // 2, evidence[largest])]
    if more and more[0] is None:  # segments of a CSR pointer; two sizes where nothing varies
        more = [more_segments(base[largest].args, MAX_ELEMENTS // 2)]
        if more[0] is not None and first_float(base[0].args) is None:
            more.append(more_segments(base[largest].args, MAX_ELEMENTS // 2, at_least=1031))
    for m, args in filter(None, more):
        if shape_key(args) in shapes:
            continue
        shapes.add(shape_key(args))
        out.base.append(BaseCall(args, base[largest].origin, rows_of=largest, rows=m, more=True))
        add(f"random_rows{m}_of_{largest}", len(out.base) - 1)
    for i, args, was in [] if whole else flag_flips(base, names):
        out.base.append(BaseCall(args, base[0].origin, rows_of=0, derived=f"argument {i} flipped"))
        add(f"flag{i}_flipped_of_0", len(out.base) - 1, _full(args, dtypes), flag=i, was=was)
    for i, k, args, was in [] if whole else mode_crosses(base, names):
        derived = f"argument {i} set to {args[i]!r}"
        out.base.append(BaseCall(args, base[k].origin, rows_of=k, derived=derived))
        value = re.sub(r"\W", "_", args[i])[:20]
        dtype = _full(args, dtypes)
        add(f"mode{i}_{value}_of_{k}", len(out.base) - 1, dtype, flag=i, was=was)

    def selecting(cid, k, args, how):  # a call base call k became to reach this kernel
        out.base.append(BaseCall(args, base[k].origin, rows_of=k, derived=how, selects=True))
        shapes.add(shape_key(args))
        add(cid, len(out.base) - 1)

    for i, value in selectors:  # the value that makes the host code launch this kernel
        for k in _distinct_shapes(base)[:MAX_SELECTED_CALLS]:
            args = [*base[k].args]
            args[i] = value
            how = f"argument {i} set to {value}, which launches the kernel"
            selecting(f"select{i}_{value}_of_{k}", k, args, how)
    for i, dim, size in sized:  # the size of a dimension that makes it launch this kernel
        calls = [
            (k, resized(base[k].args, i, dim, size, MAX_ELEMENTS)) for k in _distinct_shapes(base)
        ]
        calls = [(k, args) for k, args in calls if args is not None]
        if calls:
            k, args = max(calls, key=lambda c: int(base[c[0]].args[i].shape[dim]))
            how = f"dimension {dim} of argument {i} set to {size}, which launches the kernel"
            selecting(f"select{i}_dim{dim}_{size}_of_{k}", k, args, how)
    recorded = range(min(len(base), MAX_RANK_BASES)) if ranks else ()
    for k in recorded:  # each recorded call: its modes may reach another specialization
        for n, (how, args) in enumerate(rank_variants(base[k].args, ranks)):
            selecting(f"rank{n}_of_{k}", k, args, how)
    zeros = zero_positions([b.args for b in base])
    small = _smallest_cut(out.base, len(base)) if zeros and not whole else None
    for k in [] if whole else sorted({0, largest}):  # what no recorded call holds (sentinels)
        for i, args in filled_calls(base[k].args, seed=k):
            what = f"argument {i}'s absent entries (-1) filled with indices it holds elsewhere"
            out.base.append(BaseCall(args, base[k].origin, rows_of=k, filled=what))
            add(f"filled{i}_of_{k}", len(out.base) - 1)
        if zeros:
            add(f"nonzero{'_'.join(map(str, zeros))}_of_{k}", k)
            out.cases[-1]["nonzero"] = zeros
    if small is not None:  # its few rows may hold none of what makes the whole call ill-posed
        add(f"nonzero{'_'.join(map(str, zeros))}_of_{small}", small)
        out.cases[-1]["nonzero"] = zeros
    d = edge_arg(base[0].args)
    if d is not None:
        for edge in EDGES:
            if not base[0].allows(edge):
                continue  # its reference wrote out of bounds there (a drafted call's indices)
            if edge != "zeros" or not _box_like(base[0].args[d]):
                add(f"edge_{edge}", 0, edge=edge)
                out.cases[-1]["edge_arg"] = d
        firsts = {}
        for i, b in enumerate(base):
            firsts.setdefault(mode_key(b.args), i)
        for i in list(firsts.values())[1:MAX_MODE_EDGES]:  # each other mode's values, x LARGE
            if (e := edge_arg(base[i].args)) is not None and base[i].allows("large"):
                add(f"edge_large_{i}", i, edge="large")
                out.cases[-1]["edge_arg"] = e
        widened = [] if whole else _widenings(base, names, largest, d, len(shapes) < MIN_SHAPES)
        for times, k, tiled in widened:
            add(f"channels_x{times}", k, tile={"args": tiled, "times": times})
            shapes.add((shape_key(base[k].args), times))
        recorded = str(base[0].args[d].dtype).removeprefix("torch.")
        for dt in [dt for dt in dtypes if dt != recorded]:  # float32 too, for half data
            add(f"typical_{dt}", 0, dtype=dt)
            if largest != 0:
                add(f"large_{dt}", largest, dtype=dt)
        out.dtypes = list(dtypes)
    out.shapes = len(shapes)
    return out
