"""benchmarks/bench_data_scale.py --smoke: the data-scale benchmark runs every code path (corpus,
`aiayn data build`, `aiayn train` on the built stores, two DDP ranks, tokens/s from the store and
from lists) at two tiny sizes, and its figures are sane."""

import json
import subprocess
import sys

from trainutil import ROOT, subprocess_env


def test_bench_data_scale_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    run = subprocess.run([sys.executable, "benchmarks/bench_data_scale.py", "--smoke", "--work",
                          str(tmp_path / "work"), "--json", str(out)],
                         cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [row["pairs"] for row in results["sizes"]] == [300, 600]
    for row in results["sizes"]:
        build, train, speed = row["build"], row["train"], row["speed"]
        assert build["counts"]["read"] == row["pairs"] and 0 < build["counts"]["kept"] <= row["pairs"]
        assert build["seconds_store"] > 0 and build["peak_rss_mib"] > 0 and build["store_mib"] > 0
        assert train["seconds_to_first_update"] > 0 and train["peak_rss_mib"] > 0
        assert speed["tokens_per_s_store"] > 0 and speed["tokens_per_s_in_memory"] > 0
    ddp = results["sizes"][0]["train_ddp"]  # two ranks: the sum over the process tree
    assert ddp["peak_rss_sum_mib"] > ddp["peak_rss_mib"]
    assert "| pairs | build s |" in run.stdout
