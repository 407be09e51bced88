"""The one JSONL reader (POPE questions and answers, captions, predictions)."""

import pytest

from keepsight.jsonl import read_jsonl


def test_objects_with_their_lines_through_bom_crlf_and_blank_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\r\n{"b": 2}\r\n')
    assert list(read_jsonl(path)) == [(f"{path}:1", {"a": 1}), (f"{path}:3", {"b": 2})]


@pytest.mark.parametrize("content, error, message", [
    (b'{"a": 1}\n{"b": \n', ValueError, r"a\.jsonl:2: not valid JSON"),
    (b'{"a": 1}\n[1, 2]\n', ValueError, r"a\.jsonl:2: expected a JSON object, got list"),
    (b'{"a": "caf\xe9"}\n', ValueError, r"a\.jsonl: not UTF-8 text \(byte 10"),
])
def test_a_bad_file_is_an_error_naming_its_line(tmp_path, content, error, message):
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    with pytest.raises(error, match=message):
        list(read_jsonl(path))
    with pytest.raises(FileNotFoundError, match="captions file not found"):
        list(read_jsonl(tmp_path / "missing.jsonl", "captions"))
