"""Drive the dashboard headless on this machine's real telemetry and save what it shows (SVG screenshots).

    python scripts/dashboard_snapshot.py OUT_DIR [--preset h200] [--seconds 4] [--size 160x50]

For the GPU check: the GPU panel must show the card(s) NVML reports, with live utilization and memory.
Writes OUT_DIR/dashboard-<W>x<H>.svg and OUT_DIR/dashboard-gpu-panel.txt (the GPU panel's text).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from kronos_tune.presets import resolve_preset
from kronos_tune.telemetry.sampler import Sampler
from kronos_tune.tui.app import DashboardApp


async def snapshot(out: Path, preset: str, seconds: float, width: int, height: int) -> None:
    sampler = Sampler(interval_s=0.5, capacity=600)
    app = DashboardApp(preset=resolve_preset(preset), sampler=sampler, out_dir=out / "runs")
    try:
        async with app.run_test(size=(width, height)) as pilot:
            await pilot.pause(seconds)
            app.save_screenshot(filename=f"dashboard-{width}x{height}.svg", path=str(out))
            from kronos_tune.tui.widgets.gpu import GpuPanel, NoGpuPanel

            panels = list(app.query(GpuPanel)) + list(app.query(NoGpuPanel))
            text = "\n\n".join(panel.render().plain if hasattr(panel.render(), "plain") else str(panel.render())
                               for panel in panels)
            (out / "dashboard-gpu-panel.txt").write_text(text or "no GPU panel found\n", encoding="utf-8")
    finally:
        sampler.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python scripts/dashboard_snapshot.py")
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", default="h200")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--size", default="160x50")
    args = parser.parse_args()
    width, height = (int(part) for part in args.size.split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(snapshot(args.out, args.preset, args.seconds, width, height))
    print(f"saved {args.out}/dashboard-{width}x{height}.svg and dashboard-gpu-panel.txt")


if __name__ == "__main__":
    main()
