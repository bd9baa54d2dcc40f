"""Pretended CUDA for the recorder: tests take their CUDA paths while every tensor stays on the
CPU (a tag says which tensors pass for CUDA ones), and a call can be repeated on the other device.

Part of `recorder.py` (a script run in the sandbox, importing only the standard library, torch
and pytest); imported beside it as a sibling.
"""

from __future__ import annotations

import contextlib

_TAG = "_kminer_cuda"


def _on_cuda(device) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)  # a CUDA device index


def _tagged(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.__dict__.get(_TAG, False)


def _tag(value):
    import torch
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            leaf.__dict__[_TAG] = True
    return value


def _pretend_cuda_mode():
    """A torch function mode under which CPU tensors pass for CUDA tensors: what a CUDA device
    would create (`device='cuda'`, `.cuda()`, `.to('cuda')`) is a CPU tensor tagged as on the
    GPU, what is computed from a tagged tensor is tagged, and a tagged tensor says `is_cuda`,
    `device` cuda:0, `get_device()` 0. Wrappers that take their CUDA path only for CUDA inputs
    (`if x.is_cuda: ext.op(...) else: <pure PyTorch>`) call the extension."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    tensor = torch.Tensor
    is_cuda, device = torch._C.TensorBase.is_cuda, torch._C.TensorBase.device
    uninitialized = {torch.empty, torch.empty_like, torch.empty_strided, tensor.new_empty}

    def on_cpu(kwargs):
        if _on_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
            return True
        return False

    def copy_to(self, *args, **kwargs):
        """Tensor.to: (device, dtype, ...), (dtype, ...), (tensor, ...) or device=..."""
        args = list(args)
        target = kwargs.get("device")
        if args and isinstance(args[0], tensor):
            other = args.pop(0)
            target = "cuda" if _tagged(other) else other.device
            kwargs.setdefault("dtype", other.dtype)
        elif args and (isinstance(args[0], (str, torch.device)) or type(args[0]) is int):
            target = args.pop(0)
        kwargs.pop("device", None)
        if target is None:
            out = tensor.to(self, *args, **kwargs)
            return _tag(out) if _tagged(self) else out
        gpu = _on_cuda(target)
        out = tensor.to(self, "cpu" if gpu else target, *args, **kwargs)
        if out is self and gpu != _tagged(self):  # a move between "devices" copies
            out = self.clone()
        return _tag(out) if gpu else out

    class PretendCuda(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            owner = getattr(func, "__self__", None)
            if owner is is_cuda:
                return _tagged(args[0]) or func(*args)
            if owner is device:
                return torch.device("cuda", 0) if _tagged(args[0]) else func(*args)
            if func is tensor.get_device and _tagged(args[0]):
                return 0
            if func is tensor.cuda:
                return args[0] if _tagged(args[0]) else _tag(args[0].clone())
            if func is tensor.cpu:
                return args[0].clone() if _tagged(args[0]) else func(*args, **kwargs)
            if func is tensor.to:
                return copy_to(*args, **kwargs)
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            created = on_cpu(kwargs)  # torch.zeros(..., device='cuda'), x.new_ones(..., device=)
            out = func(*args, **kwargs)
            if func in uninitialized and isinstance(out, tensor):
                out.zero_()  # output buffers record the same in every run (and dedupe)
            leaves = tree_leaves((args, kwargs))
            if created or any(_tagged(x) for x in leaves):
                cpu_inputs = {id(x) for x in leaves if isinstance(x, tensor) and not _tagged(x)}
                for leaf in tree_leaves(out):
                    if isinstance(leaf, tensor) and id(leaf) not in cpu_inputs:
                        leaf.__dict__[_TAG] = True
            return out

    return PretendCuda()


def _fake_cuda(stub_class) -> contextlib.AbstractContextManager:
    """Pretend a CUDA device while every tensor stays on the CPU, so the tests' CUDA cases (most
    of them) run and make their calls: `torch.cuda` says a device is there, and the returned
    mode (active while the tests run) places CUDA tensors on the CPU."""
    import torch

    cuda = torch.cuda
    torch.version.cuda = torch.version.cuda or "12.1"
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_name = lambda *a, **k: "kminer pretended CUDA"
    cuda.get_device_capability = lambda *a, **k: (8, 0)
    cuda.device = lambda *a, **k: contextlib.nullcontext()
    cuda.current_stream = cuda.default_stream = lambda *a, **k: stub_class("torch.cuda.Stream")()
    for name in (
        "synchronize empty_cache set_device manual_seed manual_seed_all seed seed_all init "
        "ipc_collect reset_peak_memory_stats"
    ).split():
        setattr(cuda, name, lambda *a, **k: None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved"):
        setattr(cuda, name, lambda *a, **k: 0)

    class autocast(torch.amp.autocast):  # CUDA autocast casts CPU tensors like CUDA would
        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                device_type, dtype = "cpu", dtype or torch.float16
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def cuda_autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
        return autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    torch.autocast = torch.amp.autocast = autocast
    cuda.amp.autocast = cuda_autocast
    _legacy_constructors(torch)
    return _pretend_cuda_mode()


# the typed constructors of torch < 0.4 that tests of that era still use on the GPU
# (`Variable(torch.cuda.DoubleTensor(B, N, K).uniform_(-0.5, 0.5), requires_grad=True)`)
_LEGACY_TYPES = {
    "FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16", "LongTensor": "int64", "IntTensor": "int32",
    "ShortTensor": "int16", "CharTensor": "int8", "ByteTensor": "uint8", "BoolTensor": "bool",
}  # fmt: skip


def _legacy_constructors(torch) -> None:
    """`torch.cuda.FloatTensor(...)` and its kin make tagged CPU tensors (and are what
    `isinstance` asks of them), and `Variable(x)` keeps the tag of the tensor it wraps."""

    def typed(name: str, dtype):
        make = getattr(torch, name)

        class Meta(type):
            def __instancecheck__(cls, obj) -> bool:
                return _tagged(obj) and obj.dtype == dtype

        return Meta(name, (), {"__new__": lambda cls, *a, **k: _tag(make(*a, **k))})

    for name, dtype in _LEGACY_TYPES.items():
        setattr(torch.cuda, name, typed(name, getattr(torch, dtype)))
    made = torch.autograd.Variable

    class Kept(type):
        def __instancecheck__(cls, obj) -> bool:
            return isinstance(obj, torch.Tensor)

    def variable(cls, data, *args, **kwargs):
        out = made(data, *args, **kwargs)
        return _tag(out) if _tagged(data) else out

    torch.autograd.Variable = Kept("Variable", (), {"__new__": variable})


def _elsewhere(value, to_gpu: bool):
    """The tensors of `value` copied to the other device (the pretended GPU, or the CPU),
    keeping which ones require grad."""
    import torch
    from torch.utils._pytree import tree_map

    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        moved = t.detach().cuda() if to_gpu else t.detach().cpu()
        if moved is t or moved.data_ptr() == t.data_ptr():
            moved = moved.clone()
        if t.requires_grad and (moved.is_floating_point() or moved.is_complex()):
            moved.requires_grad_(True)
        return moved

    return tree_map(move, value)
