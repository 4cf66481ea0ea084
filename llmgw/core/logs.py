"""Structured log lines: decisions are logged once with their figures as fields."""

import json
import logging
import re

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
# What could start a line, or move a terminal's cursor, inside one: C0 and C1 controls, DEL,
# and Unicode's line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """`text` with every control character written as its escape (a newline as \\n)."""
    return _CONTROL.sub(lambda m: _NAMED.get(m[0]) or m[0].encode("unicode_escape").decode(), text)


class TextFormatter(logging.Formatter):
    """One line per record: a control character in the message, such as a newline in a
    field an agent sent, is written as its escape, so no one can forge a line of the log
    or move a terminal's cursor over one. A traceback follows on lines of its own."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)
