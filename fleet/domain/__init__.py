"""The fleet's rules as pure functions over frozen dataclasses: no Django, no clock, no I/O."""
