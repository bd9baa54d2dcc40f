"""testgen/pysources.py: each Python file read and parsed once, again once it changes."""

from __future__ import annotations

import os

from testgen import pysources


def test_a_file_is_parsed_once_and_again_after_it_changes(tmp_path):
    path = tmp_path / "ops.py"
    path.write_text("def roi_align_ref(x):\n    return x\n")
    first = pysources.tree(path)
    assert first is not None and first.body[0].name == "roi_align_ref"
    assert pysources.tree(path) is first  # the same tree: not parsed twice
    assert pysources.text(path) == path.read_text()
    path.write_text("def nms_ref(boxes):\n    return boxes[:1]\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a later change
    again = pysources.tree(path)
    assert again is not first and again.body[0].name == "nms_ref"


def test_unreadable_or_not_python_gives_none(tmp_path):
    broken = tmp_path / "py2.py"
    broken.write_text("print 'hello'\n")
    assert pysources.tree(broken) is None and pysources.text(broken) == "print 'hello'\n"
    assert pysources.tree(tmp_path / "missing.py") is None
    assert pysources.text(tmp_path / "missing.py") is None
    assert pysources.parse("x = (") is None and pysources.parse("x = 1") is not None
