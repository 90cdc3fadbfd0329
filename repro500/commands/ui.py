"""``repro500 ui``: start MLflow's UI on the configured tracking store."""

from __future__ import annotations

import click


@click.command(context_settings={"show_default": True})
@click.option("--port", default=5000, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option("--host", default="127.0.0.1", help="Address to bind; keep loopback unless behind a proxy (docs/team.md).")
@click.option("--backend-store-uri", help="Tracking store (default: MLFLOW_TRACKING_URI or sqlite:///mlflow.db).")
def ui(port: int, host: str, backend_store_uri: str | None) -> None:
    """Start the MLflow UI on the tracking store repro500 logs to; Ctrl-C (or SIGTERM, SIGHUP) stops it.

    Runs are grouped per recipe (experiment repro500/<recipe>); each repro500 run is a parent run
    with one nested run per repeat. Add the repro500.* tags and params as columns to compare
    repeats and reruns side by side. The address printed opens the runs table of the experiment
    holding the latest repro500 run (in MLflow's "Model training" view; a bare address opens on
    MLflow's GenAI overview).
    """
    from repro500.errors import RunFailed
    from repro500.tracking import ui as mlflow_ui

    store = backend_store_uri or mlflow_ui.default_backend_uri()

    def ready(url: str) -> None:
        click.echo(f"MLflow UI: {mlflow_ui.runs_page(url)}  (store: {mlflow_ui.redact_store(store)}; Ctrl-C to stop)")

    code = mlflow_ui.serve(backend_store_uri, host, port, on_ready=ready)
    if code != 0:
        raise RunFailed(f"the MLflow UI stopped by itself with exit code {code}")
