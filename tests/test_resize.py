"""Fewer rows of a recorded call: new shapes that stay valid calls, or none."""

from __future__ import annotations

import torch

from testgen.cases import BaseCall, plan, shape_key
from testgen.resize import row_subsets


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


def test_plan_adds_row_cases_as_new_shapes():
    base = [BaseCall([torch.rand(6, 4), torch.rand(6), 0.5], "tests/test_nms.py")]
    p = plan(base, ["float32"], ["boxes", "scores", "thr"])
    rows = [c for c in p.cases if c["id"].startswith("rows")]
    assert [c["id"] for c in rows] == ["rows1_of_0", "rows4_of_0"]
    assert [p.base[c["base"]].rows for c in rows] == [1, 4]
    assert p.shapes == 3 and len({shape_key(b.args) for b in p.base}) == 3
    assert base[0] is p.base[0] and len(base) == 1  # the caller's list is not changed
