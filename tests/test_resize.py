"""Fewer rows of a recorded call: new shapes that stay valid calls, or none."""

from __future__ import annotations

import torch

from testgen.cases import BaseCall, plan, shape_key
from testgen.index_rows import index_subsets
from testgen.resize import more_rows, row_evidence, row_subsets
from testgen.segments import more_segments, segment_subsets


def test_nms_call_keeps_boxes_and_scores_together():
    boxes, scores = torch.rand(4, 4), torch.rand(4)
    out = row_subsets([boxes, scores, 0.3, 0], ["boxes", "scores", "iou_threshold", "offset"])
    assert [m for m, _ in out] == [1, 3]
    _, (b, s, thr, off) = out[1]
    assert b.equal(boxes[:3]) and s.equal(scores[:3]) and (thr, off) == (0.3, 0)


def test_a_sort_order_stays_the_sort_of_the_rows_kept():
    torch.manual_seed(0)
    dets, scores = torch.rand(7, 5), torch.rand(7)
    order = scores.sort(descending=True).indices
    names = ["dets", "scores", "order", "dets_sorted", "iou_threshold", "multi_label"]
    for m, (d, s, o, ds, *_) in row_subsets([dets, scores, order, dets[order], 0.5, True], names):
        assert d.equal(dets[:m]) and s.equal(scores[:m])
        assert o.equal(s.sort(descending=True).indices)  # still the descending order
        assert ds.equal(d[o])  # still the boxes in that order


def test_count_arguments_follow_and_window_sizes_do_not_block():
    data, out = torch.rand(4, 16, 8, 8), torch.zeros(4, 64, 8, 8)
    args = [0, data, out, 4, 8, 8, 4, 4, 1, 1]
    names = ["psa_type", "input", "output", "num_", "h_feature", "w_feature", "h_mask", "w_mask"]
    names += ["half_h", "half_w"]
    subsets = dict(row_subsets(args, names))
    assert sorted(subsets) == [1, 3]
    assert subsets[3][3] == 3 and subsets[3][6:8] == [4, 4]  # num_ follows, h_mask stays
    assert subsets[3][2].shape == (3, 64, 8, 8)
    names[6] = "h"  # an unnamed size equal to the count might be the count: no subsets
    assert row_subsets(args, names) == []


def test_calls_that_may_not_survive_fewer_rows_get_none():
    a, b = torch.rand(3, 5), torch.rand(3, 5)
    # ious of N x M boxes, flattened: an output sized from the rows that no rule can resize
    assert row_subsets([a, b, torch.zeros(9), 0, False], ["b1", "b2", "ious", "mode"]) == []
    # the same call aligned: the output is one of the rows and is cut with them
    assert [m for m, _ in row_subsets([a, b, torch.zeros(3), 0, True])] == [1, 2]
    # an integer tensor outside the rows with values below the count may index them
    feats, idx = torch.rand(5, 2), torch.tensor([0, 4, 2])
    assert row_subsets([feats, idx]) == []
    # the count as a size elsewhere (a 5 x 5 matrix is no list of five items)
    assert row_subsets([torch.rand(5, 3), torch.rand(2, 5)]) == []
    assert row_subsets([torch.rand(1, 3)]) == []  # one row: nothing smaller
    # a CSR indptr ends at the count: cutting the rows would leave it pointing past them
    src, indptr = torch.arange(6.0), torch.tensor([0, 2, 5, 5, 6])
    assert row_subsets([src, indptr, None, "sum"], ["src", "indptr", "out", "reduce"]) == []
    # im2col columns: channels x kernel_h x kernel_w rows (1 x 2 x 2), a size, not items
    cols, offset = torch.rand(4, 8), torch.rand(2, 8, 2, 2)
    args = [cols, offset, 1, 3, 3, 2, 2, 0, 0, 1, 1, 1, 1, 2, 1]
    names = ["data_col", "data_offset", "channels", "height", "width", "ksize_h", "ksize_w"]
    assert row_subsets(args, names) == []


def test_plan_adds_row_cases_as_new_shapes():
    base = [BaseCall([torch.rand(6, 4), torch.rand(6), 0.5], "tests/test_nms.py")]
    p = plan(base, ["float32"], ["boxes", "scores", "thr"])
    rows = [c for c in p.cases if c["id"].startswith("rows")]
    assert [c["id"] for c in rows] == ["rows1_of_0", "rows4_of_0"]
    assert [p.base[c["base"]].rows for c in rows] == [1, 4]
    (drawn,) = [c for c in p.cases if c["id"].startswith("random_rows")]
    assert drawn["id"] == "random_rows157_of_0" and p.base[drawn["base"]].more
    assert p.shapes == 4 and len({shape_key(b.args) for b in p.base}) == 4
    assert base[0] is p.base[0] and len(base) == 1  # the caller's list is not changed


def test_more_rows_draws_noisy_copies_and_sorts_again():
    torch.manual_seed(1)  # an order that is no swap of rows (those are refused)
    boxes = torch.rand(6, 4) * 10
    boxes[:, 2:] += boxes[:, :2] + 1  # x2 > x1, y2 > y1
    scores = torch.rand(6)
    order = scores.sort(descending=True).indices
    args = [boxes, scores, order, boxes[order], 0.5, 6, torch.zeros(3)]
    names = ["dets", "scores", "order", "dets_sorted", "thr", "num_boxes", "unused"]
    m, (b, s, o, bs, thr, num, z) = more_rows(args, names)
    assert m == 157 and m % 2 == 1 and num == m and thr == 0.5 and z.equal(torch.zeros(3))
    assert b.shape == (m, 4) and s.shape == (m,) and b[:6].equal(boxes) and s[:6].equal(scores)
    assert ((b[:, 2:] - b[:, :2]) > 0).all()  # still boxes
    assert not b[6:].equal(b[6:].round())  # drawn rows are moved, not only copied
    spread = (b[6:].unsqueeze(1) - boxes.unsqueeze(0)).abs().amax(-1).amin(1)
    assert (spread < 0.2 * boxes.std(0).max()).all()  # each drawn box near a recorded one
    assert o.equal(s.sort(descending=True).indices) and bs.equal(b[o])
    _, again = more_rows(args, names)  # deterministic
    assert all(
        x.equal(y) if hasattr(x, "equal") else x == y
        for x, y in zip(again, [b, s, o, bs, thr, num, z], strict=True)
    )


def test_more_rows_keeps_whole_number_columns_and_respects_the_size_cap():
    rois = torch.tensor([[0.0, 1.5, 1.5, 4.2, 4.2], [1.0, 2.1, 0.5, 6.3, 3.3]])
    feats = torch.rand(2, 3, 8, 8)
    m, (r, f) = more_rows([rois, feats], ["rois", "features"])
    assert m == 157 and r.shape == (m, 5) and f.shape == (m, 3, 8, 8)
    assert set(r[:, 0].tolist()) == {0.0, 1.0}  # the batch index column is copied, not moved
    assert more_rows([rois, feats], ["rois", "features"], max_elements=2 * 197) is None


def test_more_rows_keeps_a_sorted_index_sorted():
    """pyg-lib's segment_coo sizes its output by the last index: rows drawn in random order
    left it too small and the CPU reference wrote past it (a heap corruption on the GPU box)."""
    src = torch.arange(96.0).reshape(32, 3) + 0.5  # rows far apart: a drawn row's origin is clear
    index = torch.tensor([0] * 5 + [1] * 7 + [3] * 12 + [5] * 8)
    m, (s, i) = more_rows([src, index], ["src", "index"])
    assert m == 157 and i.shape == (m,) and s.shape == (m, 3)
    assert (i[1:] >= i[:-1]).all() and set(i.tolist()) == {0, 1, 3, 5}
    origin = (s.unsqueeze(1) - src.unsqueeze(0)).abs().amax(-1).argmin(1)
    assert index[origin].equal(i)  # each row keeps its own index
    kept = (s.unsqueeze(1) == src.unsqueeze(0)).all(-1).any(1)
    assert kept.sum() >= 32 and not kept.all()  # the recorded rows as they were, the rest moved
    shuffled = index[torch.randperm(32, generator=torch.Generator().manual_seed(3))]
    _, (_, j) = more_rows([src, shuffled], ["src", "index"])
    assert not (j[1:] >= j[:-1]).all()  # an index in no order is drawn at random as before


def test_conv_resize_follows_the_output_size_and_keeps_weights():
    """mmcv's deform_conv_forward as its test calls it: input (10,1,3,3), a 2x2 kernel, offset
    and output at the 2x2 output size; the weight (1,1,2,2) also ends in 2x2 and must stay."""
    from testgen.resize import conv_resize

    args = [torch.rand(10, 1, 3, 3), torch.rand(1, 1, 2, 2), torch.rand(10, 8, 2, 2)]
    args += [torch.zeros(10, 1, 2, 2), torch.zeros(0), torch.zeros(0), 2, 2, 1, 1, 0, 0, 1, 1]
    args += [1, 1, 2]
    names = ["input", "weight", "offset", "output", "columns", "ones", "kW", "kH", "dW", "dH"]
    names += ["padW", "padH", "dilationW", "dilationH", "group", "deformable_group"]
    names += ["im2col_step"]
    out = conv_resize(args, names)
    assert [label for label, _ in out] == ["taller input 7x5", "larger input 11x9"]
    new = out[0][1]
    shapes = [tuple(a.shape) for a in new[:4]]
    assert shapes == [(10, 1, 7, 5), (1, 1, 2, 2), (10, 8, 6, 4), (10, 1, 6, 4)]
    assert new[1] is args[1] and not new[3].any() and new[16] == 2
    assert abs(float(new[2].mean()) - float(args[2].mean())) < 0.5  # values like the recorded
    # padding 1 with a 3x3 kernel keeps the size at every size: in and out both follow
    same = [torch.rand(2, 4, 5, 5), torch.zeros(2, 4, 5, 5), 3, 3, 1, 1]
    assert len(conv_resize(same, ["x", "y", "kernel_h", "kernel_w", "pad_h", "pad_w"])) == 2
    # no kernel size by name: not a convolution
    assert conv_resize([*args[:6], 2, 2], [*names[:6], "a", "b"]) == []
    # an integer tensor at the input size may index it: no call
    idx = torch.zeros(10, 1, 3, 3, dtype=torch.long)
    assert conv_resize([args[0], idx, 2, 2], ["x", "i", "kH", "kW"]) == []


def test_a_large_call_also_gets_a_small_count_below_any_output_cap():
    # mmcv's voxelization: 800 points, at most 50 voxels; 1 and 401 points give only one
    # comparable shape beside the recorded ones, 13 points stay below the cap
    points, voxels = torch.rand(800, 4), torch.zeros(50, 10, 4)
    args = [points, voxels, torch.zeros(50, 3, dtype=torch.int32), [0.5] * 3, 10, 50, 3]
    names = ["points", "voxels", "coors", "voxel_size", "max_points", "max_voxels", "NDim"]
    subsets = dict(row_subsets(args, names))
    assert sorted(subsets) == [1, 13, 401]
    assert subsets[13][0].equal(points[:13]) and subsets[13][1] is voxels  # outputs keep the cap


def _spmm(rowptr, col, value, mat):
    """Sum-reduced CSR x dense, row by row: what pytorch_sparse's spmm computes."""
    out = torch.zeros(rowptr.numel() - 1, mat.shape[1], dtype=mat.dtype)
    for r in range(rowptr.numel() - 1):
        for e in range(int(rowptr[r]), int(rowptr[r + 1])):
            out[r] += value[e] * mat[col[e]]
    return out


def test_a_csr_call_is_cut_to_its_first_segments_and_stays_the_same_matrix_rows():
    gen = torch.Generator().manual_seed(3)
    rowptr = torch.tensor([0, 2, 3, 3, 6, 8])  # 5 rows, 8 entries, an empty row
    col = torch.tensor([0, 6, 2, 1, 3, 5, 4, 6])
    value = torch.randn(8, generator=gen)
    mat = torch.randn(7, 4, generator=gen)  # indexed by col: never cut
    full = _spmm(rowptr, col, value, mat)
    cuts = segment_subsets([rowptr, col, value, mat, "sum"])
    assert [m for m, _ in cuts] == [1, 3]
    for m, (p, c, v, x, reduce) in cuts:
        assert p.tolist() == rowptr[: m + 1].tolist() and c.numel() == v.numel() == int(p[-1])
        assert x is mat and reduce == "sum"
        assert torch.equal(_spmm(p, c, v, x), full[:m])  # the same rows of the same product
    # the total count as an argument follows the cut (ptr2ind(rowptr, E))
    assert [a[1] for _, a in segment_subsets([rowptr, 8])] == [2, 3]
    sparse = torch.tensor([0, 0, 0, 2, 2, 3, 5, 6, 6])  # more rows than entries, empty rows
    assert [(m, a[0].tolist(), a[1]) for m, a in segment_subsets([sparse, 6])] == [
        (5, [0, 0, 0, 2, 2, 3], 3)
    ]  # the first row holds no entry: no call of one row
    # data with one row per segment may be the matrix the entries index: no cut
    assert segment_subsets([rowptr, col, value, torch.randn(5, 4), "sum"]) == []
    # an output buffer of one row per segment (all zero) is cut with them
    (_, args), *_ = segment_subsets([rowptr, value, torch.zeros(5, 3)])
    assert args[2].shape == (1, 3)
    # no pointer: not from 0, decreasing, or not ending at another tensor's length
    for ptr in ([1, 2, 3, 3, 6, 8], [0, 3, 2, 6, 8], [0, 2, 3, 3, 6, 9]):
        assert segment_subsets([torch.tensor(ptr), col, value, mat]) == []


def test_more_segments_are_recorded_segments_drawn_again():
    gen = torch.Generator().manual_seed(5)
    rowptr = torch.tensor([0, 2, 3, 3, 6, 8])
    col = torch.tensor([0, 6, 2, 1, 3, 5, 4, 6])
    value, mat = torch.randn(8, generator=gen), torch.randn(7, 4, generator=gen)
    m, (p, c, v, x, reduce) = more_segments([rowptr, col, value, mat, "sum"])
    assert m == 157 and p.numel() == m + 1 and p[0] == 0 and bool((p[1:] >= p[:-1]).all())
    assert c.numel() == v.numel() == int(p[-1]) and x is mat and reduce == "sum"
    assert torch.equal(p[:6], rowptr) and torch.equal(c[:8], col)  # the recorded ones first
    pairs = {(int(a), float(b)) for a, b in zip(col, value, strict=True)}
    for r in range(m):  # each new row is one recorded row, entries in their order
        row = [(int(c[e]), float(v[e])) for e in range(int(p[r]), int(p[r + 1]))]
        assert set(row) <= pairs and row in [
            [(int(col[e]), float(value[e])) for e in range(int(rowptr[j]), int(rowptr[j + 1]))]
            for j in range(5)
        ]
    (_, (p, count)) = more_segments([rowptr, 8])
    assert count == int(p[-1])  # the count follows
    assert more_segments([rowptr, col, value, torch.randn(5, 4), "sum"]) is None


def test_an_index_only_call_is_cut_to_its_first_entries():
    """pytorch_sparse's non_diag_mask(row, col, M, N, k): no floating data, two recorded calls.
    The COO entries are cut together (1, 2 and 3 of 4); the sizes M, N and the offset k stay."""
    row, col = torch.tensor([0, 0, 9, 9]), torch.tensor([0, 1, 0, 1])
    cut = index_subsets([row, col, 10, 2, -1], ["row", "col", "M", "N", "k"])
    assert [m for m, _ in cut] == [1, 2, 3]
    _, args = cut[-1]
    assert args[0].tolist() == [0, 0, 9] and args[1].tolist() == [0, 1, 0]
    assert args[2:] == [10, 2, -1]
    p = plan([BaseCall([row, col, 10, 2, -1], "r")], [], ["row", "col", "M", "N", "k"])
    assert [c["id"] for c in p.cases] == ["recorded_0", "rows1_of_0", "rows2_of_0", "rows3_of_0"]
    named = index_subsets([torch.arange(5), 5], ["keys", "num"])
    assert [a[1] for _, a in named] == [1, 2, 3]  # a count argument follows the cut


def test_index_calls_whose_values_are_structure_get_no_cuts():
    ptr = torch.tensor([0, 2, 2, 5, 6])
    assert index_subsets([ptr, 6]) == []  # ptr2ind(ptr, E): E is what the offsets add up to
    assert index_subsets([ptr, torch.arange(6)]) == []  # a CSR pointer over 6 items
    src = torch.tensor([5, 7, 1, 2])  # integer data gathered through a pointer over its rows
    assert index_subsets([src, torch.tensor([0, 1, 3, 4]), None]) == []
    assert index_subsets([src, torch.tensor([0, 1, 3, 4, 4]), None]) == []
    assert index_subsets([src, torch.tensor([0, 2, 5, 6, 9]), None]) == []  # one per row + 1
    ind = torch.tensor([0, 1, 1, 3, 4])
    assert index_subsets([ind, 4]) == []  # 4 is the largest index: a total of the values
    assert index_subsets([torch.tensor([2, 1, 3, 1]), 7]) == []  # lengths adding up to 7
    assert index_subsets([ind, 5], ["ind", "M"]) == []  # the row count, not named as one
    assert index_subsets([torch.tensor([[0, 1, 2], [1, 2, 0]])]) == []  # (2, E): a layout
    assert index_subsets([ind, torch.zeros(3, 5)]) == []  # floating data: testgen.resize's
    assert index_subsets([ind, torch.zeros(5, dtype=torch.long), 7]) != []
    assert index_subsets([ind, torch.zeros(2, 5, dtype=torch.long), 7]) == []  # 5 elsewhere


def test_counts_that_collide_by_chance_are_told_apart_by_the_other_calls():
    """Two edges of two channels, then four edges of four basis functions: alone, each call's
    count is also another size; together they say which sizes move with it."""
    c0 = [torch.rand(2, 2), torch.rand(4, 2, 1), torch.rand(2, 4), torch.randint(0, 4, (2, 4))]
    c1 = [torch.rand(4, 2), torch.rand(25, 2, 4), torch.rand(4, 4), torch.randint(0, 25, (4, 4))]
    names = ["x", "weight", "basis", "weight_index"]
    evidence = row_evidence([c0, c1])
    assert evidence == {(0, 0), (2, 0), (3, 0)}
    assert row_subsets(c1, names) == [] and more_rows(c1, names) is None
    subsets = dict(row_subsets(c1, names, evidence))
    assert sorted(subsets) == [1, 3]
    x, w, b, wi = subsets[3]
    assert (x.shape, b.shape, wi.shape) == ((3, 2), (3, 4), (3, 4)) and w.equal(c1[1])
    m, (x, w, b, wi) = more_rows(c1, names, evidence=evidence)
    assert x.shape[0] == b.shape[0] == wi.shape[0] == m > 4 and w.shape == (25, 2, 4)
    # one count only, or calls of different layouts: no evidence
    assert row_evidence([c0, [a.clone() for a in c0]]) is None
    assert row_evidence([c0, c1[:3]]) is None
    # a size that moves with the count at a second dimension still stops the resize
    sq0, sq1 = [torch.rand(2, 2)], [torch.rand(3, 3)]
    assert row_subsets(sq1, ["a"], row_evidence([sq0, sq1])) == []


def test_a_call_of_one_sample_gets_its_rows_within_the_sample():
    """mmcv's points in boxes: (1, 15, 3) points, (1, 2, 7) boxes, a (1, 15, 2) output and the
    counts `boxes_num`, `pts_num`; the rows are the points (the boxes' two rows are also the
    output's last dimension), counted by `pts_num`."""
    boxes, points, out = torch.rand(1, 2, 7), torch.rand(1, 15, 3), torch.zeros(1, 15, 2)
    args, names = [1, 2, 15, boxes, points, out], ["batch_size", "boxes_num", "pts_num"]
    cuts = row_subsets(args, names)
    assert [m for m, _ in cuts] == [1, 8]
    m, cut = cuts[1]
    assert cut[2] == 8 and cut[3] is not boxes and cut[3].equal(boxes)  # the boxes unchanged
    assert cut[4].shape == (1, 8, 3) and cut[4].equal(points[:, :8])
    assert cut[5].shape == (1, 8, 2) and cut[:2] == [1, 2]
    m, more = more_rows(args, names)
    assert m == 157 and more[2] == 157 and more[4].shape == (1, 157, 3)
    assert more[4][:, :15].equal(points)  # every recorded point stays, the others drawn
    # two samples: their rows are not cut apart (a batch of two is no list of points)
    two = [2, 2, 15, torch.rand(2, 2, 7), torch.rand(2, 15, 3), torch.zeros(2, 15, 2)]
    assert row_subsets(two, names) == []
