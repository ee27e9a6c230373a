"""The `kronos-tune dashboard` Textual app: a view over telemetry, presets, the benchmark, autobatch and training.

Nothing in this package decides anything: it calls the same public functions
the CLI calls and draws what they return or report.
"""
