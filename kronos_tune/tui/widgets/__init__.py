"""Dashboard widgets: each receives ready data through a `show(...)` method and only draws it."""

from kronos_tune.tui.widgets.answer import AnswerPanel
from kronos_tune.tui.widgets.gpu import GpuPanel, NoGpuPanel
from kronos_tune.tui.widgets.host import HostPanel
from kronos_tune.tui.widgets.results import ResultsTable, columns
from kronos_tune.tui.widgets.run import RunPanel
from kronos_tune.tui.widgets.status import LogPane, StatusBar

__all__ = ["AnswerPanel", "GpuPanel", "HostPanel", "LogPane", "NoGpuPanel", "ResultsTable", "RunPanel", "StatusBar", "columns"]
