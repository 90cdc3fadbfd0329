"""`repro500 locate` from Python: repro500.locate.locate is the whole pipeline the command prints.

Known answers on fabricated runs (no training): two same-seed repeats that agree have nothing to
replay (exit 0, the command's --json answer exactly); two that part at a step are replayed, the
progress lines said before the replay of a recipe that trains nothing fails in one sentence.
"""

from __future__ import annotations

import json

import pytest
from helpers.rundirs import make_run
from helpers.runs import repro500

from repro500.errors import EXIT_OK, ReproError
from repro500.locate import Located, locate


def test_runs_that_do_not_part_are_the_commands_answer(tmp_path):
    root = make_run(tmp_path, "agree", values={"accuracy": [0.9, 0.9]}, torch_seeds=[3, 3])
    said: list[str] = []
    found = locate(root, progress=said.append)
    assert isinstance(found, Located) and found.exit_code == EXIT_OK and said == []
    assert found.answer["operator"] is None and found.answer["located"] is False
    assert (found.answer["a"]["repeat"], found.answer["b"]["repeat"]) == (0, 1)
    done = repro500("locate", str(root), "--json", cwd=tmp_path)
    assert done.returncode == EXIT_OK and json.loads(done.stdout) == json.loads(json.dumps(found.answer, default=str))


def test_progress_comes_before_the_replays(tmp_path):
    root = make_run(tmp_path, "fabricated", values={"accuracy": [0.9, 0.9]}, torch_seeds=[3, 3],
                    diverge={"repeat": 1, "epoch": 1, "tensor": "fc.weight"})
    said: list[str] = []
    with pytest.raises(ReproError, match="replay of A"):
        locate(root, progress=said.append)
    assert said[0].startswith("records: ") and said[1].startswith("replaying repeat 0 of A"), said
