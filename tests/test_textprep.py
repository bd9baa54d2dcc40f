"""Offset-preserving text views: the foundation every span and line number rests on."""

from miner.textprep import LineIndex, Rewrite, blank_comments_and_strings, decode, readable


def test_blank_keeps_length_and_newlines_and_code():
    text = 'int a; // __global__ here\n/* __global__\n x */ const char* s = "__global__";\nint b;'
    code = blank_comments_and_strings(text)
    assert len(code) == len(text)
    assert code.count("\n") == text.count("\n")
    assert "__global__" not in code
    assert code.startswith("int a;") and code.endswith("int b;")


def test_raw_strings_and_digit_separators():
    text = 'auto src = R"(extern "C" __global__ void k() {})"; int n = 1\'000; char c = \'x\';'
    code = blank_comments_and_strings(text)
    assert "__global__" not in code
    assert "1'000" in code
    assert len(code) == len(text)


def test_latin1_view_round_trips_invalid_utf8():
    raw = b"// caf\xc3\xa9 \xff\xfe\n__global__ void k() {}\n"
    text = decode(raw)
    assert text.encode("latin-1") == raw
    assert text.index("__global__") == raw.index(b"__global__")
    assert "\ufffd" in readable(text)


def test_rewrite_maps_offsets_back():
    text = "GLOBAL void k(int* x) { HD(); }"
    rw = Rewrite(text, [(0, 6, "__global__"), (24, 26, "hd_function_name")]).apply()
    assert rw.text.startswith("__global__ void k(")
    new_k = rw.text.index("k(")
    assert rw.to_original(new_k) == text.index("k(")
    assert rw.to_original(0) == 0
    assert rw.to_original(len(rw.text)) == len(text)
    assert rw.to_original(rw.text.index("();")) == text.index("();")


def test_line_index():
    lines = LineIndex("a\nbb\nccc")
    assert [lines.line(i) for i in (0, 1, 2, 4, 5, 7)] == [1, 1, 2, 2, 3, 3]
