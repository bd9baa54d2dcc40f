"""The recorder's log: each distinct extension call once, the calls of possible references with
the extension calls they pair with, and what fits the bytes written back.

Part of `recorder.py` (a script run in the sandbox, importing only the standard library, torch
and pytest); imported beside it as a sibling.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib

try:
    from testgen.standalone.pretend_cuda import _TAG, _elsewhere
    from testgen.standalone.record_objects import _Objects, is_marker
    from testgen.standalone.record_rows import cut_call
except ImportError:
    from pretend_cuda import _TAG, _elsewhere
    from record_objects import _Objects, is_marker
    from record_rows import cut_call

MAX_CALLS_PER_FUNCTION = 64
MAX_SHAPED_CALLS_PER_FUNCTION = 256  # past the first 64, a call is kept for its new shapes
MAX_ELEMENTS = 1 << 22  # larger tensors are not worth keeping as test inputs
SAVE_BUDGET = 48 << 20  # bytes of tensors written back (the reader takes at most 64 MiB)
MAX_REF_CALLS = 16  # calls of one possible reference kept with the extension calls beside them
MAX_REF_ELEMENTS = 1 << 22  # a reference call with a larger tensor is not kept
_TOO_BIG = object()


class _Log:
    """The recorded calls, each distinct call once (a test parametrized over CPU and the
    pretended CUDA makes the same call twice); per function MAX_CALLS_PER_FUNCTION, then only
    calls with new argument shapes (up to MAX_SHAPED_CALLS_PER_FUNCTION)."""

    def __init__(self) -> None:
        self.calls: list = []
        self.refs: list = []  # calls of the repository's Python functions that may be references
        self.paused = 0  # inside `pytest.raises`: the authors' invalid inputs are not kept
        self._seen: dict = {}
        self._shapes: set = set()
        self._count: dict[str, int] = {}
        self._test: tuple[list, list] = ([], [])  # the calls and ref calls of the running test
        self._paired: dict = {}  # reference calls kept with partners, per function
        self._inline: dict = {}  # an expected value's inputs, until its statements have run
        self._op_calls: dict = {}  # per expected value, the calls of the op it is compared with
        self._dispatching = False  # inside a dispatcher run on both devices
        self.objects = _Objects(_snapshot, _TOO_BIG)  # the bound classes' objects, and steps
        # per function, the most elements of a tensor of a call not kept for its size: why an
        # op its tests do call has no calls (Swin's window ops, at 192 x 56 x 56 x 96)
        self.too_big: dict[str, int] = {}
        self._cut: set[int] = set()  # calls kept as their first rows (record_rows)

    def add(
        self, function: str, args: tuple, kwargs: dict, step: int | None = None, module: str = ""
    ) -> int | None:
        """Keep the call; its index when it is new (see `written`), else None. `step`: the
        call as a step of the objects it takes (record_objects), whose setup it keeps;
        `module`: the extension it went to (chamfer_2D and chamfer_3D both bind `forward`)."""
        count = self._count.get(function, 0)
        shapes = (function, _shapes(args), _shapes(kwargs.values()))
        if self.paused or count >= MAX_SHAPED_CALLS_PER_FUNCTION:
            return None
        if count >= MAX_CALLS_PER_FUNCTION and shapes in self._shapes:
            return None
        if step is None:
            snap = [_snapshot(a) for a in args]
            named = {k: _snapshot(v) for k, v in kwargs.items()}
            setup = []
        else:  # the step's own snapshot (taken once), and how its objects are remade
            _, snap, named = self.objects.steps[step] if step >= 0 else (None, [], {})
            setup = self.objects.setup([*snap, *named.values()], step)
            if setup is None:  # an object it takes cannot be remade: the call cannot be either
                return None
        rows_cut: list = []
        if any(x is _TOO_BIG for x in [*snap, *named.values()]):
            largest = max(_numel(v) for v in [*args, *kwargs.values()])
            self.too_big[function] = max(self.too_big.get(function, 0), largest)
            small = cut_call(args, kwargs, MAX_ELEMENTS) if step is None else None
            if small is None:
                return None
            args, kwargs, rows_cut = small
            snap = [_snapshot(a) for a in args]
            named = {k: _snapshot(v) for k, v in kwargs.items()}
            if any(x is _TOO_BIG for x in [*snap, *named.values()]):
                return None
        named_keys = tuple((k, _fingerprint(v)) for k, v in sorted(named.items()))
        key = (module, function, tuple(map(_fingerprint, snap)), named_keys)
        with contextlib.suppress(TypeError):  # unhashable: kept
            if key in self._seen:
                self._test[0].append(self._seen[key])
                return None
            self._seen[key] = len(self.calls)
        self._shapes.add(shapes)
        self._count[function] = count + 1
        self._test[0].append(len(self.calls))
        self.calls.append((function, snap, named, {}, [], setup, module, rows_cut))
        if rows_cut:  # what the whole call wrote and returned is not what the cut one would
            self._cut.add(len(self.calls) - 1)
        return len(self.calls) - 1

    def returned(self, index: int, result) -> None:
        """What the call returned on the CPU build, as [shape, dtype] per tensor: a C++
        autograd Function's backward (pytorch_spline_conv's `spline_basis_bw`, which no test
        calls) takes the gradient of the forward's output, shaped like it."""
        import torch
        from torch.utils._pytree import tree_leaves

        if index in self._cut:
            return
        self.calls[index][4][:] = [
            [list(t.shape), str(t.dtype).removeprefix("torch.")]
            for t in tree_leaves(result)
            if isinstance(t, torch.Tensor)
        ]

    def written(self, index: int, args: tuple) -> None:
        """After the call ran on the CPU build: the tensor arguments it changed (resized or
        wrote), as they are now. A forward that writes its outputs and saved statistics into
        tensors it is passed (SparseConvNet's batch norm) hands them to its backward so."""
        import torch

        if index in self._cut:
            return
        before, after = self.calls[index][1], self.calls[index][3]
        for k, (was, now) in enumerate(zip(before, args, strict=False)):
            if not isinstance(now, torch.Tensor) or not isinstance(was, torch.Tensor):
                continue
            snap = _snapshot(now)
            if snap is not _TOO_BIG and _fingerprint(snap) != _fingerprint(was):
                after[k] = snap

    def begin(self) -> None:
        """A test (or a script's statement) starts: the Python functions the last one called
        are paired with the extension calls it made, before or after them."""
        calls, refs = self._test
        for k in refs:
            mine = self._op_calls.get(tuple(self.refs[k][:2]), calls)  # an inline value's own op
            self.refs[k][5].extend(sorted(set(mine)))
            if not mine:  # nothing to pair with: not worth its bytes
                self.refs[k] = None
            else:
                self._paired[self.refs[k][:2]] = self._paired.get(self.refs[k][:2], 0) + 1
        self._test = ([], [])
        self._op_calls = {}

    @contextlib.contextmanager
    def inline_op(self, file: str, names: list):
        """Around a test's statement that calls the op an expected value computed in line is
        compared with (inline_refs.apply): the extension calls made inside are its partners."""
        start = len(self._test[0])
        try:
            yield
        finally:
            made = self._test[0][start:]
            for name in names:
                self._op_calls.setdefault((file, name), []).extend(made)

    def wants_ref(self, where: tuple, values: list) -> bool:
        """Whether a call of a possible reference is worth snapshotting."""
        if self.paused or self._paired.get(where, 0) >= MAX_REF_CALLS:
            return False
        return not any(getattr(v, "numel", int)() > MAX_REF_ELEMENTS for v in values)

    def _add_cut_ref(self, where: tuple, fn, args: tuple, kwargs: dict) -> None:
        """A possible reference called on tensors too large to keep: its call on their first
        rows (record_rows), run again for the result it gives on them."""
        import torch

        if self.paused or self._paired.get(where, 0) >= MAX_REF_CALLS:
            return
        small = cut_call(args, kwargs, MAX_REF_ELEMENTS)
        if small is None:
            return
        args, kwargs, _ = small
        snap_args = [_snapshot(a) for a in args]
        snap_kwargs = {k: _snapshot(v) for k, v in kwargs.items()}
        arrays = _numpy(list(args), kwargs)
        with torch.no_grad():
            result = fn(*args, **kwargs)
        self.add_ref(where, snap_args, snap_kwargs, result, arrays)

    def add_ref(self, where: tuple, args: list, kwargs: dict, result, arrays=()) -> None:
        out = _snapshot_result(result)
        if any(x is _TOO_BIG for x in out) or not self.wants_ref(where, out):
            return
        self._test[1].append(len(self.refs))
        self.refs.append((where[0], where[1], list(args), dict(kwargs), out, [], list(arrays)))

    def inline_args(self, file: str, name: str, args: list) -> None:
        """What an expected value computed in line reads (inline_refs.apply), as it was before
        the test's statements computed it."""
        if self.wants_ref((file, name), args):
            self._inline[(file, name)] = ([_snapshot(a) for a in args], _numpy(args, {}))

    def inline_result(self, file: str, name: str, result) -> None:
        """The value those statements computed: with what they read, one call of the function
        they are lifted into."""
        found = self._inline.pop((file, name), None)
        if found is not None:
            with contextlib.suppress(Exception):
                self.add_ref((file, name), found[0], {}, result, found[1])

    def on_both_devices(self, file: str, name: str):
        """The decorator put on a repository function that calls a possible reference: a
        wrapper that takes the extension for CUDA inputs and its PyTorch fallback for CPU ones
        (`bias_act`: `_bias_act_ref` on CPU). Called on one device, it is called again on the
        other with copies of its arguments, and the fallback's calls are paired with exactly the
        extension calls of the same arguments (not with every call of the test)."""

        def wrap(fn):
            if not callable(fn):
                return fn

            @functools.wraps(fn)
            def dispatched(*args, **kwargs):
                if self._dispatching or self.paused:
                    return fn(*args, **kwargs)
                self._dispatching = True
                try:
                    return self._twice(fn, args, kwargs)
                finally:
                    self._dispatching = False

            return dispatched

        return wrap

    def _twice(self, fn, args, kwargs):
        calls, refs = self._test
        c0, r0 = len(calls), len(refs)
        result = fn(*args, **kwargs)
        ext, fallback = calls[c0:], refs[r0:]
        if bool(ext) == bool(fallback):  # neither path taken, or both: nothing to learn
            return result
        c1, r1 = len(calls), len(refs)
        with contextlib.suppress(Exception):
            moved_args, moved_kwargs = _elsewhere((args, kwargs), to_gpu=not ext)
            fn(*moved_args, **moved_kwargs)
        cpu_refs, gpu_calls = (refs[r1:], ext) if ext else (fallback, calls[c1:])
        if not (cpu_refs and gpu_calls):
            return result
        for k in cpu_refs:
            self.refs[k][5].extend(sorted(set(gpu_calls)))
            where = self.refs[k][:2]
            self._paired[where] = self._paired.get(where, 0) + 1
        drop = set(cpu_refs)
        refs[:] = [k for k in refs if k not in drop]
        return result

    def ref_recorder(self, file: str, name: str):
        """The decorator put on a repository function that may be a reference: each call's
        arguments (as they were on entry) and result are kept."""

        def wrap(fn):
            if not callable(fn):
                return fn

            @functools.wraps(fn)
            def recorded(*args, **kwargs):
                if not self.wants_ref((file, name), [*args, *kwargs.values()]):
                    result = fn(*args, **kwargs)
                    with contextlib.suppress(Exception):  # the test's own run comes first
                        self._add_cut_ref((file, name), fn, args, kwargs)
                    return result
                snap_args = [_snapshot(a) for a in args]
                snap_kwargs = {k: _snapshot(v) for k, v in kwargs.items()}
                arrays = _numpy(list(args), kwargs)
                result = fn(*args, **kwargs)
                with contextlib.suppress(Exception):
                    self.add_ref((file, name), snap_args, snap_kwargs, result, arrays)
                return result

            return recorded

        return wrap


def _shapes(values) -> tuple:
    import torch

    return tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in values)


def _same_layout(t):
    """A dense copy whose dimensions lie in memory in the order they do in `t`: a channel-last
    view (`x.transpose(1, 2)`, even sliced out of a wider tensor) stays channel-last, which is
    how a test reaches a kernel chosen by strides (`x.stride(1) == 1`)."""
    import torch

    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d]))
    back = [order.index(d) for d in range(t.dim())]
    return t.permute(order).clone(memory_format=torch.contiguous_format).permute(back)


def _snapshot(value):
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() > MAX_ELEMENTS:
            return _TOO_BIG
        snap = _same_layout(value.detach().to("cpu"))
        snap.__dict__.pop(_TAG, None)
        return snap
    if _is_numpy(value):  # a reference written in numpy: its arrays as tensors (see _numpy)
        return _snapshot(torch.from_numpy(value.copy())) if value.dtype.kind in "biuf" else None
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        return value.item()  # a numpy scalar (torch.load with weights_only refuses one)
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in value):
        return list(value)
    if is_marker(value):  # an object (record_objects)
        return value
    if isinstance(value, (list, tuple)) and any(is_marker(v) for v in value):
        return [_snapshot(v) for v in value]  # a list holding objects
    return repr(value)


def _numel(value) -> int:
    numel = getattr(value, "numel", None)
    return numel() if callable(numel) else 0


def _is_numpy(value) -> bool:
    return type(value).__name__ == "ndarray" and type(value).__module__ == "numpy"


def _numpy(args: list, kwargs: dict) -> list:
    """Which arguments of a reference call were numpy arrays (positions, keyword names): its
    adapter hands them to the function as arrays again."""
    return [k for k, a in [*enumerate(args), *kwargs.items()] if _is_numpy(a)]


def _snapshot_result(result) -> list:
    """A reference's result as a list of outputs (tensors or None)."""
    import torch

    values = list(result) if isinstance(result, (list, tuple)) else [result]
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) or _is_numpy(v):
            out.append(_snapshot(v))
        elif isinstance(v, (bool, int, float, type(None))):
            out.append(v)
        else:
            return []  # not a result made of tensors: not a reference's
    return out


def _fingerprint(value):
    """A hashable identity of a snapshot: a tensor by dtype, shape, strides and values."""
    import torch

    if isinstance(value, torch.Tensor):
        try:
            data = value.reshape(-1).view(torch.uint8).numpy().tobytes()
        except (RuntimeError, TypeError, ValueError):  # no numpy, or a dtype without bytes
            return ("tensor", id(value))
        digest = hashlib.sha1(data).hexdigest()
        return (str(value.dtype), tuple(value.shape), value.stride(), digest)
    if isinstance(value, list):
        return tuple(value)
    return value


def _bytes(entry) -> int:
    import torch
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves(list(entry))
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _within_budget(calls: list, refs: list) -> tuple[list, list]:
    """The calls and reference calls that fit SAVE_BUDGET bytes, taken in rounds so that no
    function starves another: the smallest call of every function and the smallest call of
    every reference (with the extension calls it pairs with) first, then the second smallest
    of each, and so on (a file whose many small forward calls would fill the budget still
    gives its large update calls); partners renumbered."""
    left = SAVE_BUDGET
    kept: set[int] = set()
    size = [_bytes(c) for c in calls]
    ref_size = [_bytes(r[:5]) for r in refs]
    by_function: dict[str, list[int]] = {}
    for k in sorted(range(len(calls)), key=size.__getitem__):
        by_function.setdefault(calls[k][0], []).append(k)
    by_ref: dict[tuple, list[int]] = {}
    for i in sorted(range(len(refs)), key=ref_size.__getitem__):
        by_ref.setdefault(tuple(refs[i][:2]), []).append(i)
    taken_refs = []

    def take(k: int) -> bool:
        nonlocal left
        if k not in kept and size[k] <= left:
            kept.add(k)
            left -= size[k]
        return k in kept

    rounds = max([len(v) for v in (*by_function.values(), *by_ref.values())], default=0)
    for r in range(rounds):
        for ks in by_function.values():
            if r < len(ks):
                take(ks[r])
        for found in by_ref.values():
            i = found[r] if r < len(found) else None
            if i is None or ref_size[i] > left:
                continue
            partners = [take(k) for k in refs[i][5]]  # each tried, so all may come along
            if any(partners) and ref_size[i] <= left:
                left -= ref_size[i]
                taken_refs.append(i)
    number = {k: i for i, k in enumerate(sorted(kept))}
    out_refs = []
    for i in sorted(taken_refs):
        ref = refs[i]
        out_refs.append((*ref[:5], [number[k] for k in ref[5] if k in number], *ref[6:]))
    return [calls[k] for k in sorted(kept)], out_refs
