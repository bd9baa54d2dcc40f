"""A binding whose result the repository's own Python sorts has no order along its last
dimension (pytorch3d's knn_points sorts what _C.knn_points_idx returns)."""

from conftest import write_tree

from testgen.caller_sorts import caller_sorts


def test_a_result_sorted_by_its_caller_is_found_and_nothing_else(tmp_path):
    repo = write_tree(
        tmp_path / "repo",
        {
            "pkg/__init__.py": "",
            "pkg/ops.py": (
                "from pkg import _C\n\n"
                "def knn(p1, p2, K):\n"
                "    idx, dists = _C.knn_idx(p1, p2, K)\n"
                "    dists, order = dists.sort(dim=2)\n"
                "    return dists, idx.gather(2, order)\n\n"
                "def other(x):\n"
                "    y = _C.other_op(x)\n"
                "    z = _C.third_op(x)\n"
                "    return y\n\n"
                "def resorted(x):\n"
                "    z = torch.sort(x)\n"
                "    z = _C.late_op(x)\n"  # sorted before this call: says nothing of it
                "    return z\n"
            ),
            "tests/test_ops.py": "def test_a(x):\n    v = _C.from_test(x)\n    v.sort()\n",
        },
    )
    reason = caller_sorts(repo, ["unknown", "knn_idx"])
    assert reason == "the repository's `knn` (pkg/ops.py:4) sorts what `knn_idx` returns"
    assert caller_sorts(repo, ["other_op"]) == "" and caller_sorts(repo, ["third_op"]) == ""
    assert caller_sorts(repo, ["late_op"]) == ""
    assert caller_sorts(repo, ["from_test"]) == ""  # a test's own sorting is no contract


def test_a_result_the_repositorys_tests_compare_as_a_set_is_compared_sorted(tmp_path):
    """pytorch_cluster's tests compare `radius(x, y, r)` as `to_set(edge_index)`: its CPU build
    lists each query's neighbours nearest first, its CUDA kernel in index order, and the
    repository accepts both. A result the tests compare element by element says nothing."""
    repo = write_tree(
        tmp_path / "repo",
        {
            "pkg/radius.py": (
                "import torch\n\n"
                "def radius(x, y, r):\n"
                "    if x.numel() == 0:\n"
                "        return torch.empty(2, 0)\n"
                "    return torch.ops.pkg.radius(x, y, r)\n\n"
                "def grid(pos, size):\n"
                "    return torch.ops.pkg.grid(pos, size)\n"
            ),
            "test/test_radius.py": (
                "from pkg.radius import radius, grid\n\n"
                "def to_set(edge_index):\n"
                "    return set([(i, j) for i, j in edge_index.t().tolist()])\n\n"
                "def test_radius(x, y):\n"
                "    edge_index = radius(x, y, 2)\n"
                "    assert to_set(edge_index) == {(0, 0), (0, 1)}\n"
                "    cluster = grid(x, 2)\n"
                "    assert cluster.tolist() == [0, 1]\n"
            ),
        },
    )
    assert caller_sorts(repo, ["radius"]) == (
        "the repository's test `test_radius` (test/test_radius.py:7) compares what `radius` "
        "returns as a set"
    )
    assert caller_sorts(repo, ["grid"]) == ""


def test_a_result_compared_as_sets_row_by_row_after_conversions_is_found(tmp_path):
    """torch-points-kernels' test takes `ball_query(...)[0].detach().numpy()` and asserts
    `set(res_cpu[i][j]) == set(res_cuda[i][j])` per row: the value is still `ball_query`'s
    result through the indexing and the conversions. A value a function makes of it (`.sum()`)
    is not."""
    repo = write_tree(
        tmp_path / "repo",
        {
            "pkg/ops.py": (
                "def ball_query(r, n, x, y):\n    return ball_query_dense(r, n, x, y)\n\n"
                "def ball_query_dense(r, n, x, y):\n    return ext.ball_query_dense(x, y, r, n)\n\n"
                "def total(x):\n    return ext.total(x)\n"
            ),
            "test/test_ball.py": (
                "from pkg.ops import ball_query, total\n\n"
                "def test_equal(a, b):\n"
                "    res = ball_query(1, 500, a, b)[0].detach().numpy()\n"
                "    other = total(a).sum()\n"
                "    for i in range(3):\n"
                "        assert set(res[i][0]) == set(other[i])\n"
            ),
        },
    )
    assert caller_sorts(repo, ["ball_query_dense"]) == (
        "the repository's test `test_equal` (test/test_ball.py:4) compares what `ball_query` "
        "returns as a set"
    )
    assert caller_sorts(repo, ["total"]) == ""
