"""Framework helpers that a repository's reference reads only to pick its path, in plain Python.

References of framework-based repositories (OpenMMLab's `_upfirdn2d_ref` reaches
`conv2d_gradfix.conv2d`) ask their framework two kinds of questions before doing plain torch
work: is an accelerator there (`is_musa_available()`, `is_npu_available()`, `is_rocm_pytorch()`),
and is torch new enough (`digit_version(torch.__version__) >= digit_version('1.10.0')`). The
framework does not travel with a row, so the vendored reference gets these stand-ins in its
place: on the CPU, where a reference runs, no accelerator is there, and a version is compared
as its numbers (a pre-release below its release). Any other name from the framework still
makes the reference unusable.
"""

import re

PROBE = re.compile(r"^is_\w+_available$|^is_rocm_pytorch$|^is_cuda_pytorch$")
EXPORTS = ("digit_version",)
_VERSION = re.compile(r"\s*v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc|alpha|beta|dev)[-_.]?(\d*))?")


def digit_version(version_str, length=4):
    found = _VERSION.match(version_str)
    if found is None:
        raise ValueError(f"cannot read version {version_str!r}")
    numbers = [int(n) for n in found.group(1).split(".")][:length]
    numbers += [0] * (length - len(numbers))
    tag = found.group(2)
    if tag is None:
        return (*numbers, 0, 0)
    rank = {"a": -3, "alpha": -3, "b": -2, "beta": -2, "rc": -1}.get(tag, -4)
    return (*numbers, rank, int(found.group(3) or 0))


def _no_accelerator(*args, **kwargs):
    return False
