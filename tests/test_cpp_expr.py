"""#if evaluation: C semantics, plus UNKNOWN for what differs between nvcc's passes."""

import pytest

from miner.cpp_expr import UNKNOWN, cuda_env, evaluate


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("defined(__CUDACC__)", 1),
        ("defined MMCV_WITH_HIP", 0),
        ("!defined(MMCV_USE_PARROTS)", 1),
        ("CUDA_VERSION >= 11000", 1),
        ("__CUDACC_VER_MAJOR__ < 12", 0),
        ("UNDEFINED_THING", 0),
        ("1 + 2 * 3 == 7", 1),
        ("(1 << 4) | 1", 17),
        ("0x10 > 15 && 010 == 8", 1),
        ("1 ? 2 : 3", 2),
        ("__cplusplus >= 201703L", 1),
    ],
)
def test_known_conditions(expr, expected):
    assert evaluate(expr, cuda_env()) == expected


@pytest.mark.parametrize(
    "expr",
    [
        "__CUDA_ARCH__ >= 530",
        "defined(__CUDA_ARCH__)",
        "!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 600",
        "SOME_FUNCTION_MACRO(3)",
        "1 +",
    ],
)
def test_pass_dependent_or_unreadable_is_unknown(expr):
    assert evaluate(expr, cuda_env()) is UNKNOWN


def test_three_valued_logic_short_circuits():
    env = cuda_env()
    assert evaluate("defined(MMCV_WITH_HIP) && __CUDA_ARCH__ >= 530", env) == 0
    assert evaluate("defined(__CUDACC__) || __CUDA_ARCH__ >= 530", env) == 1


def test_macros_expand_and_redefine():
    env = cuda_env()
    env.define("WARP", None, "32")
    env.define("HALF_WARP", None, "(WARP / 2)")
    assert evaluate("HALF_WARP == 16", env) == 1
    env.undef("WARP")
    assert evaluate("HALF_WARP == 16", env) == 0
