"""Discovery against hand-checked fixture repositories full of extractor traps."""

from __future__ import annotations

import pytest
from conftest import expected, kernel


@pytest.mark.parametrize("name", ["traps", "sample-repo"])
def test_exactly_the_expected_kernels(name, traps, sample):
    disc = traps if name == "traps" else sample
    want = {(r["file"], r["kernel"], int(r["line"])) for r in expected(name)}
    got = [(k.file, k.kdef.name, k.line) for k in disc.kernels]
    assert len(got) == len(set(got)), "a kernel was reported twice"
    assert set(got) == want


@pytest.mark.parametrize("name", ["traps", "sample-repo"])
def test_flags_match_expectations(name, traps, sample):
    disc = traps if name == "traps" else sample
    rows = {(r["file"], r["kernel"], int(r["line"])): r for r in expected(name)}
    for k in disc.kernels:
        row = rows[(k.file, k.kdef.name, k.line)]
        launched = bool(disc.launches[id(k.kdef)])
        assert launched == (row["launched"] == "y"), k.kdef.name
        assert k.kdef.specialization == row["specialization"], k.kdef.name
        assert k.from_macro == row["from_macro"], k.kdef.name
        templated = bool(k.kdef.template_params) or bool(k.kdef.specialization)
        assert templated == (row["templated"] == "y"), k.kdef.name


def test_backend_mirrors_are_skipped_and_counted(traps):
    skipped = dict(traps.inventory.skipped)
    assert skipped["src/musa/scale_musa.mu"].value == "non_cuda_backend"
    assert skipped["src/musa/templates_musa.muh"].value == "non_cuda_backend"
    assert skipped["src/mlu/scale_mlu.mlu"].value == "non_cuda_backend"
    assert skipped["src/hip/gather_hip.cpp"].value == "backend_dir"
    assert not any("musa" in k.kdef.name for k in traps.kernels)


def test_declarations_and_instantiations_are_not_kernels(traps):
    assert traps.declarations == 1  # decl_only in kernels/decl.cuh
    assert traps.instantiations == 1  # template __global__ void scale_kernel<float>
    assert [k.file for k in traps.kernels if k.kdef.name == "decl_only"] == ["src/context_cuda.cu"]


def test_signature_template_params_and_qualifiers(traps):
    k = kernel(traps, "vec_copy_kernel")
    assert [(p["kind"], p["name"], p["default"]) for p in k.kdef.template_params] == [
        ("type", "T", ""),
        ("value", "N", "4"),
    ]
    assert [p[1] for p in k.kdef.params][:2] == ["src", "dst"] or len(k.kdef.params) >= 2
    bounded = kernel(traps, "bounded_min_blocks_kernel")
    assert any("__launch_bounds__(128, 2)" in q for q in bounded.kdef.qualifiers)
    assert any(q == "static" for q in kernel(traps, "static_second_kernel").kdef.qualifiers)


def test_alias_kernel_points_at_the_alias_token(traps):
    k = kernel(traps, "aliased_kernel")
    line = k.source.splitlines()[0] if k.source.lstrip().startswith("GLOBAL") else ""
    assert "GLOBAL" in line and "__global__" not in k.source


def test_macro_kernels_are_expanded(traps):
    k = kernel(traps, "act_relu_kernel")
    assert k.from_macro == "DEFINE_ACT"
    assert "__global__ void act_relu_kernel(" in k.source
    assert "##" not in k.source


def test_launch_sites_kinds(traps):
    sites = traps.launches
    assert {s.kind for s in sites[id(kernel(traps, "ptr_kernel").kdef)]} >= {"address"}
    assert {s.kind for s in sites[id(kernel(traps, "addr_kernel").kdef)]} == {"address"}
    chevrons = [s for s in sites[id(kernel(traps, "block_sum_kernel").kdef)] if s.kind == "chevron"]
    assert chevrons and chevrons[0].caller and chevrons[0].config
    assert sites[id(kernel(traps, "legacy_norm_kernel").kdef)] == []


def test_unparseable_kernels_are_read_by_token_scan(tmp_path):
    """#if branches that split braces defeat tree-sitter; the token scan still finds both."""
    from miner.discover import discover

    (tmp_path / "broken.cu").write_text(
        "template <typename T> __global__ void split_if_kernel(T* x, int n) {\n"
        "#if WIDE > 1\n  if (n) {\n#else\n  if (!n) {\n#endif\n    x[0] = 1;\n  }\n}\n"
        "__global__ void split_body_kernel(float* x, int n)\n"
        "#ifdef FAST\n{ x[0] = 0; }\n#else\n{ x[0] = 1; }\n#endif\n"
        "__global__ void fine_kernel(float* x) { x[0] = 1; }\n"
    )
    disc = discover(tmp_path)
    names = {k.kdef.name: k for k in disc.kernels}
    assert set(names) == {"split_if_kernel", "split_body_kernel", "fine_kernel"}
    assert names["split_if_kernel"].parse_fallback and names["split_body_kernel"].parse_fallback
    assert (names["split_if_kernel"].start_line, names["split_if_kernel"].end_line) == (1, 9)
    assert "x[0] = 1;" in names["split_body_kernel"].source
