"""nbdist's live dashboard (ipywidgets + matplotlib): `nd.dashboard()` or `%dist dashboard`.

One view per module: `placement`, `reductions`, `training`, `engines`; `dashboard` puts them in
one widget that refreshes itself while cells run.
"""

from nbdist.widgets.dashboard import Dashboard, dashboard, draw_dashboard

__all__ = ["Dashboard", "dashboard", "draw_dashboard"]
