"""docs/make_results.py: ablation rows copied from an earlier report say where they were scored."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_make_results():
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "docs" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_copied_ablations_keep_their_origin(tmp_path):
    mr = load_make_results()
    report = json.loads((ROOT / "docs" / "results.json").read_text())
    report["date"], report["aiayn_commit"], report["ablation_avg"] = "2026-01-02", "abc1234", 7
    first = tmp_path / "first.json"
    first.write_text(json.dumps(report))
    rows, avg = mr.copied_ablations(first)
    assert avg == 7 and len(rows) == len(report["ablations"]) > 0
    assert all(r["scored_at"] == "abc1234" and r["scored_on"] == "2026-01-02" for r in rows)
    # copied again from a later report: the first origin stays
    second = tmp_path / "second.json"
    second.write_text(json.dumps(dict(report, ablations=rows, date="2026-03-04", aiayn_commit="def5678")))
    again, _ = mr.copied_ablations(second)
    assert [r["scored_at"] for r in again] == ["abc1234"] * len(rows)
    doc = mr.results_doc(dict(report, ablations=again))
    assert "Scored on 2026-01-02 at commit abc1234" in doc
    assert "def5678" not in doc
