"""scripts/make_results.py: ablation rows copied from an earlier report say where they were scored."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_make_results():
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_copied_ablations_keep_their_origin(tmp_path):
    mr = load_make_results()
    report = json.loads((ROOT / "docs" / "experiments" / "multi30k_en_de.json").read_text())
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


def test_count_and_alpha_are_chosen_on_val_only(tmp_path, monkeypatch):
    """--avg 10 20: the number of checkpoints averaged and α are chosen together on val; the test
    sets are scored only with the choice."""
    mr = load_make_results()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    monkeypatch.setattr(mr, "averaged", lambda r, n: r / f"avg{n}")
    monkeypatch.setattr(mr, "ensemble_info", lambda runs: {
        "updates": 100, "epochs": 1, "wall_s": 60.0, "tokens_per_s_median": 1000.0})
    monkeypatch.setattr(mr, "count_parameters", lambda dirs: 1)
    val = {("avg10", 0.6): 40.0, ("avg10", 1.0): 41.0, ("avg20", 0.6): 41.5, ("avg20", 1.0): 40.5}

    class StubScorer:
        bf16_row, calls = False, []

        def score(self, dirs, split, beam, alpha):
            self.calls.append((dirs[0].name, split, alpha))
            # on the test sets avg10 would win: a choice made there would differ
            if split == "val":
                b = val.get((dirs[0].name, alpha), 30.0)
            else:
                b = 45.0 if dirs[0].name == "avg10" else 30.0
            return {"bleu_lc": b, "bleu": b, "chrf": 50.0, "alpha": alpha, "hyps": ["h"] * 1000,
                    "bleu_signature": "s", "bleu_lc_signature": "s", "chrf_signature": "s"}

        def test_set(self, meta, split):
            return ["s"] * 1000, ["r"] * 1000

    scorer = StubScorer()
    m = mr.main_run(scorer, [run], [10, 20], 5, [0.6, 1.0])
    assert (m["avg"], m["alpha"]) == (20, 0.6)
    assert m["rows"][m["headline"]]["weights"] == "average of last 20"
    assert [c[1] for c in scorer.calls[:4]] == ["val"] * 4
    assert {c[0] for c in scorer.calls[4:]} == {"run", "avg20"}  # avg10 never decoded again
    assert "α=0.6 and the number of checkpoints averaged, 20, were chosen together" in mr._tuning_sentence(m)
    assert "last 20, α=0.6: BLEU-lc 41.50" in mr.results_doc(
        {"main": m, "ablations": [], "beam": 5, "command": "c", "hardware": "h", "threads": "t",
         "torch": "2", "date": "d"})
    # one count: the sentence of the earlier reports
    one = mr.main_run(StubScorer(), [run], [10], 5, [0.6, 1.0])
    assert mr._tuning_sentence(one) == "The length penalty α=1.0 was chosen on val from 0.6, 1.0."
