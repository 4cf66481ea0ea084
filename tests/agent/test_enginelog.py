"""Reading an engine's log back: whole lines, printable, bounded."""

from fleet.agent.enginelog import (
    FAILURE_BYTES,
    FAILURE_LINES,
    MAX_LINE_CHARS,
    clean,
    failure_tail,
    tail_lines,
)


def test_colour_codes_and_control_characters_go_and_newlines_and_tabs_stay():
    text = "\x1b[31merror:\x1b[0m bad\x07 file\x00\n\tat main\x1b]0;title\x07\n"
    assert clean(text) == "error: bad file\n\tat main\n"


def test_a_carriage_return_ends_a_line_as_a_progress_bar_redraws():
    assert clean("loading 10%\rloading 90%\r\ndone\n") == "loading 10%\nloading 90%\ndone\n"


def test_the_last_lines_are_whole_lines(tmp_path):
    log = tmp_path / "s1.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail_lines(log, 3) == ["line 97", "line 98", "line 99"]


def test_a_tail_that_starts_inside_a_line_drops_that_part(tmp_path):
    log = tmp_path / "s1.log"
    log.write_bytes(b"x" * 300_000 + b"\nkept one\nkept two\n")
    assert tail_lines(log, 1000) == ["kept one", "kept two"]


def test_a_tail_is_cut_to_its_bytes_from_the_oldest_line(tmp_path):
    log = tmp_path / "s1.log"
    log.write_text("".join(f"{i:04d} " + "y" * 95 + "\n" for i in range(50)))
    got = tail_lines(log, 50, max_bytes=1000)
    assert len(got) == 9  # 101 bytes a line with its newline
    assert got[-1].startswith("0049 ")
    assert sum(len(line) + 1 for line in got) <= 1000


def test_bytes_that_are_not_utf8_are_replaced_not_refused(tmp_path):
    log = tmp_path / "s1.log"
    log.write_bytes(b"bad \xff\xfe byte\n")
    assert tail_lines(log, 5) == ["bad \ufffd\ufffd byte"]


def test_a_very_long_line_is_cut_where_it_starts(tmp_path):
    log = tmp_path / "s1.log"
    log.write_text("error: " + "z" * 5000 + "\n")
    [line] = tail_lines(log, 5)
    assert line.startswith("error: zzz") and len(line) == MAX_LINE_CHARS


def test_no_log_is_none_and_an_empty_log_is_no_lines(tmp_path):
    assert tail_lines(tmp_path / "missing.log", 10) is None
    (tmp_path / "empty.log").write_text("")
    assert tail_lines(tmp_path / "empty.log", 10) == []
    assert failure_tail(tmp_path / "missing.log") == ""
    assert failure_tail(None) == ""


def test_a_failures_tail_is_at_most_twenty_lines_and_four_kib(tmp_path):
    log = tmp_path / "s1.log"
    log.write_text("".join(f"{i} " + "w" * 300 + "\n" for i in range(40)))
    tail = failure_tail(log)
    assert len(tail.encode()) <= FAILURE_BYTES
    assert len(tail.splitlines()) <= FAILURE_LINES
    assert tail.splitlines()[-1].startswith("39 ")
    short = tmp_path / "short.log"
    short.write_text("".join(f"line {i}\n" for i in range(40)))
    assert failure_tail(short).splitlines() == [f"line {i}" for i in range(20, 40)]
