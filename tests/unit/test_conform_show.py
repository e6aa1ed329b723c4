"""How the conformance report shows a frame: as text, whatever its bytes."""

from multilang.conform._run import _show


def test_binary_frames_are_shown_with_escapes_not_raw_control_bytes():
    shown = _show(b"\x00\x00\x00L\x82\xa2id\x1b[2J a\r\nb\tc\x7f")
    assert shown.isprintable(), shown  # a report stays greppable text (msgpack, garbage)
    assert shown == "\\x00\\x00\\x00L\\x82\\xa2id\\x1b[2J a\\r\\nb\\tc\\x7f"


def test_json_and_unicode_are_shown_as_written():
    assert _show('{"command":"emit","tuple":["wörd ☃"]}'.encode()) == '{"command":"emit","tuple":["wörd ☃"]}'
