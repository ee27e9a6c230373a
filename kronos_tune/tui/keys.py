"""The dashboard's key bindings: one table behind the bindings, the footer, the command palette and `?`."""

from __future__ import annotations

from textual.binding import Binding

# (keys, action, footer label, what it does)
ACTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("p", "pick_preset", "Preset", "Pick a preset"),
    ("b", "benchmark('train')", "Bench", "Run the benchmark on the training workload"),
    ("B,shift+b", "benchmark('predict')", "Bench predict", "Run the benchmark on the prediction workload"),
    ("a", "autobatch", "Autobatch", "Find the largest training batch that fits the preset's memory"),
    ("t", "train", "Train", "Train with the recommended config (a cancelled training run is continued)"),
    ("c", "cancel", "Cancel", "Cancel the run at the next step boundary (finished results stay)"),
    ("e", "export", "Export", "Write report.json/csv/md and recommended.toml to a folder"),
    ("space", "pause", "Pause", "Pause or resume the live panels"),
    ("s", "sort", "Sort", "Sort the results by the next column (or click a column header)"),
    ("S,shift+s", "reverse_sort", "Reverse", "Reverse the results order"),
    ("g", "scatter", "Plot", "Plot time vs peak memory per trial"),
    ("question_mark", "help", "Help", "Show this help"),
    ("q", "quit", "Quit", "Stop any run cleanly and quit"),
)
FOOTER_KEYS = {"p", "b", "a", "t", "c", "e", "question_mark", "q"}  # all of them fit in 80 columns
KEY_NAMES = {"question_mark": "?", "B,shift+b": "B (shift+b)", "S,shift+s": "S (shift+s)"}


# The panes a finished benchmark is read through take turns at the focus (and so at ↑↓ PgUp PgDn): the results,
# the recommendation, the log. Each pane binds tab itself, so the footer names it while one has the focus.
PANE_BINDINGS = [Binding("tab", "app.next_pane(1)", "Pane", key_display="tab", tooltip="Focus the next pane"),
                 Binding("shift+tab", "app.next_pane(-1)", "Previous pane", show=False)]


def bindings() -> list[Binding]:
    """Every action's binding, plus ctrl+q going through the same clean quit."""
    return [Binding(keys, action, label, show=keys in FOOTER_KEYS, tooltip=text)
            for keys, action, label, text in ACTIONS] + [Binding("ctrl+q", "quit", "Quit", show=False)]


# Keys the focused pane answers itself (no app binding): listed in the help all the same.
TABLE_KEYS: tuple[tuple[str, str], ...] = (
    ("tab, shift+tab", "Move the focus: the results, the recommendation, the log (the focused one has a bright "
                       "border and answers the keys below)"),
    ("↑ ↓, PgUp PgDn, ctrl+Home ctrl+End", "Move through the results, or scroll the recommendation or the log "
                                           "(whichever has the focus)"),
    ("← →, Home End", "Scroll the results sideways (columns that do not fit)"),
    ("mouse wheel", "Scroll the results or the log under the pointer; shift+wheel scrolls sideways"),
    ("click a header", "Sort the results by that column (again: reverse)"),
    ("ctrl+p", "The command palette: every action by name"),
)


def help_rows() -> list[tuple[str, str]]:
    """(key as typed, what it does) for the help screen."""
    return [(KEY_NAMES.get(keys, keys), text) for keys, _, _, text in ACTIONS] + list(TABLE_KEYS)


def palette_entries() -> list[tuple[str, str, str]]:
    """(title, help, action) for the command palette."""
    return [(f"{label} ({KEY_NAMES.get(keys, keys)})", text, action) for keys, action, label, text in ACTIONS]
