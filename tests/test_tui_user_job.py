"""`kronos-tune dashboard --config FILE` for real: the dashboard's benchmark measures the user's own finetune (an
upstream finetune_csv YAML on a CSV the test writes, tiny weights saved as folders), not a preset's synthetic job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kronos_tune.benchmark import BenchmarkOptions
from kronos_tune.benchmark.user_job import user_preset
from kronos_tune.tui.app import DashboardApp
from test_tui_canned import log_text, until
from test_tui_jobs import FAST, _start
from test_upstream_config import tiny_weights, upstream_yaml, write_csv

pytestmark = [pytest.mark.usefixtures("steady_dashboard", "one_thread"), pytest.mark.slow]


@pytest.mark.asyncio
async def test_the_dashboard_benchmarks_the_users_finetune_on_their_data(tmp_path: Path) -> None:
    predictor, tokenizer = tiny_weights(tmp_path)
    data = write_csv(tmp_path)
    source = upstream_yaml(tmp_path, data, predictor, tokenizer)
    preset, plan = user_preset(source, None, None)  # what `dashboard --config` hands the app
    assert any(line.startswith("workload: ") and str(source) in line for line in plan)
    options = BenchmarkOptions(**FAST, only=("accumulation",), skip=("baseline-repeat",))
    out = tmp_path / "out"
    app = DashboardApp(preset=preset, out_dir=out, benchmark_options=options)
    async with app.run_test(size=(160, 50)) as pilot:
        assert f"preset {preset.name}: the finetune of {source}" in log_text(app)
        await _start(pilot, app, "b")
        await until(pilot, lambda: not app.busy, "the benchmark finished", 300.0)
        await pilot.pause()
        assert app.run_state.phase == "done", app.run_state.outcome
        (run,) = [folder for folder in (out / "benchmark").iterdir() if folder.is_dir()]
        report = json.loads((run / "report.json").read_text())
        assert report["job"]["source"] == str(source) and report["job"]["data"] == [str(data.absolute())]
        trials = [trial for trial in report["trials"] if trial["status"] == "ok"]
        assert {"baseline", "accumulation"} <= {trial["name"] for trial in trials}
        for trial in trials:  # every trial trained on the saved copy of the user's series, with their windows
            assert trial["config"]["data"] == [str(run / "data")] and trial["config"]["lookback_window"] == 16
        await pilot.press("q")
