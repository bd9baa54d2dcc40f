"""Which function a repository registers for an op on each device: the link between an op's
CUDA function and its CPU one when their names say nothing of it.

Two spellings are read. mmcv's own registry, `REGISTER_DEVICE_IMPL(key, CPU, fn)`. And
PyTorch's dispatcher, as torchvision, torchaudio and pyg-lib use it:

    TORCH_LIBRARY_IMPL(pyg, CPU, m) {
      m.impl(TORCH_SELECTIVE_NAME("pyg::grid_cluster"), TORCH_FN(grid_cluster_kernel));
    }

beside the same op registered for CUDA with `grid_cluster_cuda` (pyg-lib's `scatter_sum_kernel`
is the name of both sides: which one is the CPU function is told by where it is defined). The
key is the op's qualified name (`pyg::grid_cluster`), the device the dispatch key upper-cased.
"""

from __future__ import annotations

import re

from miner.textprep import bracket_end, split_top

_REGISTER = re.compile(r"\bREGISTER_\w*IMPL\w*\s*\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)")
_LIBRARY_IMPL = re.compile(r"\bTORCH_LIBRARY_IMPL\s*\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)\s*\{")
_NAME = re.compile(r'^(?:TORCH_SELECTIVE_NAME\s*\(\s*)?"([\w:.]+)"\s*\)?$')
_FUNCTION = re.compile(r"^(?:TORCH_FN\s*\(\s*)?&?\s*((?:\w+::)*\w+)\s*\)?$")
_HANDLE_IMPL = r"\b{}\s*\.\s*impl\s*\("


def registrations(code: str, text: str) -> list[tuple[str, str, str]]:
    """(op key, device, function name) of each registration in a file: `code` with comments
    and literals blanked (a registration commented out is none), `text` as written (the op's
    name is a string), of the same length."""
    found = [(m[1], m[2].upper(), m[3]) for m in _REGISTER.finditer(code)]
    for block in _LIBRARY_IMPL.finditer(code):
        namespace, device, handle = block[1], block[2].upper(), block[3]
        end = bracket_end(code, block.end() - 1, "{", "}") or len(code)
        impl = re.compile(_HANDLE_IMPL.format(re.escape(handle)))
        for call in impl.finditer(code, block.end(), end):  # this block's calls only
            close = bracket_end(code, call.end() - 1, "(", ")")
            args = split_top(text[call.end() : close - 1]) if close else []
            if len(args) != 2:
                continue
            name, function = _NAME.match(args[0].strip()), _FUNCTION.match(args[1].strip())
            if name and function:
                op = name[1] if "::" in name[1] else f"{namespace}::{name[1]}"
                found.append((op, device, function[1].split("::")[-1]))
    return found
