"""``llmgw ctl model update`` against the real REST API."""

from __future__ import annotations

import json

import pytest

from catalog.models import Model
from llmgw.cli import ctl
from tests.fleet.builders import cpu_model

pytestmark = pytest.mark.django_db


def test_ctl_model_update_reads_the_file_and_says_what_became_of_it(capsys, server, tmp_path, api):
    api.call("POST", "/models", cpu_model("tiny", cores=2))
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cpu_model("tiny", cores=3)))

    code = ctl.main(["model", "update", "--file", str(path)], transport=server)

    out = capsys.readouterr().out
    assert code == 0 and out.startswith("model tiny updated")
    assert Model.objects.get().profiles.get().cpu_cores == 3
