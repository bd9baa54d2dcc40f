"""kminer's stand-in for einops gives what einops gives on the patterns references write,
and refuses what it does not take."""

import einops
import pytest
import torch

from testgen import einops_lite

CASES = [
    ("rearrange", (2, 3, 4), "b d l -> b l d", {}),
    ("rearrange", (2, 3, 4), "b d l -> (b l) d", {}),
    ("rearrange", (8, 3), "(b l) d -> b d l", {"l": 4}),
    ("rearrange", (6, 8), "(b l) (n two) -> b 1 n (l two)", {"l": 3, "two": 2}),
    ("rearrange", (2, 1, 4, 3), "b 1 n l -> (b l) n", {}),
    ("rearrange", (5,), "d -> d 1", {}),
    ("rearrange", (5, 1, 3), "d 1 w -> d w", {}),
    ("rearrange", (2, 3, 8), "... (L two) -> ... L two", {"two": 2}),
    ("rearrange", (4, 6), "... (L two) -> ... L two", {"two": 2}),
    ("rearrange", (2, 3, 4, 5), "b ... c -> b c ...", {}),
    ("rearrange", (2, 3, 4, 5), "b h ... -> b (h ...)", {}),
    ("rearrange", (2, 3), "a b -> a () b", {}),
    ("rearrange", (6, 4), "(h w) c -> c h w", {"h": 2}),
    ("repeat", (2, 1, 3, 4), "B G N L -> B (G H) N L", {"H": 3}),
    ("repeat", (3,), "d -> b d", {"b": 2}),
    ("repeat", (2, 3), "b n -> b n 4", {}),
    ("repeat", (2, 3), "b n -> (r b) n", {"r": 2}),
    ("repeat", (2, 3), "b n -> b (n r)", {"r": 2}),
]


@pytest.mark.parametrize(("fn", "shape", "pattern", "lengths"), CASES)
def test_the_stand_in_gives_what_einops_gives(fn, shape, pattern, lengths):
    x = torch.randn(*shape)
    want = getattr(einops, fn)(x, pattern, **lengths)
    got = getattr(einops_lite, fn)(x, pattern, **lengths)
    assert got.shape == want.shape
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("fn", "shape", "pattern", "lengths"),
    [
        ("rearrange", (2, 3), "a b c -> a b c", {}),  # three names, two dims
        ("rearrange", (7, 2), "(a b) c -> a b c", {"a": 2}),  # 7 does not split by 2
        ("rearrange", (2, 3), "a b -> a", {}),  # an axis dropped
        ("rearrange", (2, 3), "a b -> a b c", {"c": 2}),  # a new axis: repeat's, not rearrange's
        ("repeat", (2, 3), "a b -> a b c", {}),  # a new axis of no length
        ("rearrange", (2, 3), "a b", {}),  # no arrow
    ],
)
def test_what_einops_refuses_the_stand_in_refuses(fn, shape, pattern, lengths):
    x = torch.randn(*shape)
    with pytest.raises(Exception):  # noqa: B017 - einops raises its own EinopsError
        getattr(einops, fn)(x, pattern, **lengths)
    with pytest.raises(ValueError):
        getattr(einops_lite, fn)(x, pattern, **lengths)


def test_a_reference_using_einops_is_vendored_with_the_stand_in(tmp_path):
    """mamba's selective_scan_ref shape: `from einops import rearrange, repeat` at the top of
    its module; the vendored source runs without einops and gives what the original gives."""
    from testgen.vendor import vendor_function

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ops.py").write_text(
        "import torch\n"
        "from einops import rearrange, repeat as rep\n\n\n"
        "def scan_ref(u, D, groups):\n"
        "    y = u * rearrange(D, 'd -> d 1')\n"
        "    return rep(y, 'b d l -> b (d g) l', g=groups)\n"
    )
    source = vendor_function(tmp_path, "pkg/ops.py", "scan_ref")
    assert not source.startswith("!")
    assert "from einops" not in source and "import einops" not in source
    namespace: dict = {}
    exec(compile(source, "vendored", "exec"), namespace)
    u, D = torch.randn(2, 3, 5), torch.randn(3)
    want = einops.repeat(u * einops.rearrange(D, "d -> d 1"), "b d l -> b (d g) l", g=2)
    assert torch.equal(namespace["scan_ref"](u, D, 2), want)
    (tmp_path / "pkg" / "other.py").write_text(
        "from einops import reduce\n\n\ndef f(x):\n    return reduce(x, 'a b -> a', 'sum')\n"
    )
    refused = vendor_function(tmp_path, "pkg/other.py", "f")
    assert refused.startswith("!") and "einops.reduce" in refused
