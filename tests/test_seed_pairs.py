"""scripts/seed_pairs.py: α is chosen on val only (per pair and over all pairs); each test decoding
runs once; test2017 and the cased BLEU and chrF at the recipe's α are reported beside test2016."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_seed_pairs():
    sys.path.insert(0, str(ROOT / "scripts"))  # the script imports make_results from its own folder
    try:
        spec = importlib.util.spec_from_file_location("seed_pairs", ROOT / "scripts" / "seed_pairs.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return module


def test_alphas_chosen_on_val_and_tests_decoded_once(tmp_path):
    sp = load_seed_pairs()
    runs = []
    for s in (1, 2, 3):
        run = tmp_path / f"m{s}"
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"train": {"seed": s}}))
        runs.append(run)
    # val: pair (1, 2) prefers α=1.0, the others α=2.0, and α=2.0 has the best mean val;
    # test2016 prefers α=0.6, where nothing may be chosen
    val = {("m1", "m2"): {0.6: 40.0, 1.0: 42.0, 2.0: 41.0},
           ("m1", "m3"): {0.6: 40.0, 1.0: 40.5, 2.0: 41.5},
           ("m2", "m3"): {0.6: 40.0, 1.0: 40.5, 2.0: 41.5}}

    class StubScorer:
        calls = []

        def score(self, dirs, split, beam, alpha):
            key = tuple(d.name for d in dirs)
            self.calls.append((key, split, alpha))
            test = 45.0 if split == "test_2016_flickr" else 35.0
            b = val[key][alpha] if split == "val" else test - alpha
            return {"bleu_lc": b, "bleu": b - 0.5, "chrf": 60.0 + b / 10}

    scorer = StubScorer()
    rows, pooled = sp.score_pairs(scorer, runs, {r: r for r in runs}, [0.6, 1.0, 2.0], 1.0, 5)
    assert pooled == 2.0
    assert [r["seeds"] for r in rows] == [[1, 2], [1, 3], [2, 3]]
    assert [r["alpha"] for r in rows] == [1.0, 2.0, 2.0]
    assert rows[0]["test2016"] == rows[0]["test2016_recipe_alpha"] == 44.0
    assert rows[0]["test2016_pooled_alpha"] == 43.0 and rows[1]["test2016_recipe_alpha"] == 44.0
    assert rows[1]["test2017"] == 33.0 and rows[1]["test2017_recipe_alpha"] == 34.0
    assert rows[1]["recipe_alpha_scores"]["test2017"] == {"bleu_lc": 34.0, "bleu": 33.5, "chrf": 63.4}
    tests = [c for c in scorer.calls if c[1] != "val"]
    # test2016 at each pair's α, the recipe's 1.0 and the pooled 2.0; test2017 at the pair's and the
    # recipe's: for pair (1, 2), whose own α is the recipe's, 2 + 1; for the others 2 + 2; once each
    assert len(tests) == len(set(tests)) == 11
    assert all(a != 0.6 for _, _, a in tests)
    md = sp.report_md({"date": "d", "hardware": "h", "torch": "t", "avg": 10, "beam": 5,
                       "alphas": [0.6, 1.0, 2.0], "recipe_alpha": 1.0, "pooled_alpha": pooled,
                       "models": [{"run": str(r), "seed": i + 1, "val": 40.0, "test2016": 39.0,
                                   "test2017": 32.0}
                                  for i, r in enumerate(runs)], "pairs": rows}, 43.5)
    assert "α=1.0: mean 44.00" in md and "3 of 3 reach 43.5" in md
    assert "α=2.0 (chosen on val for all pairs): mean 43.00" in md and "0 of 3 reach 43.5" in md
    assert "test2017 of the 3 pairs, α=1.0: mean 34.00" in md
    assert "test2016 44.00 / 43.50 / 64.40; test2017 34.00 / 33.50 / 63.40" in md
