"""View definitions as code: ``views/*.yaml`` -> View -> CompiledView (docs/views.md)."""

from features.views.compile import CompiledView, compile_view
from features.views.model import View, ViewSource
from features.views.parse import load_views, parse_view

__all__ = ["CompiledView", "View", "ViewSource", "compile_view", "load_views", "parse_view"]
