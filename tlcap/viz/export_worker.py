"""The child process that writes static figures (PNG/SVG/PDF) for :mod:`tlcap.viz.export`.

Started by :mod:`tlcap.viz.export_bounds` (``python -c "...runpy.run_path(THIS_FILE)..."``), it
imports plotly and kaleido only (not tlcap, not torch) and serves jobs: each line on stdin names a
JSON job file (the exporter, the Chrome path, a list of ``{fig, path, format, scale}``). Each
figure is written to ``path + '.part'`` and renamed into place (a killed export never leaves a
half-written image); stdout gets ``wrote <path>`` per figure and ``done`` per job, or one
``error: <why>`` line, after which the worker exits. With kaleido >= 1 one browser serves every
job (``kaleido.start_sync_server``). End of stdin (the parent exited, even killed) stops the
browser and the worker. The parent bounds each job's time and the memory of the worker's session.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _write(job: dict[str, Any]) -> None:
    import plotly.io as pio

    items = job["figures"]
    figs = [pio.from_json(it["fig"], skip_invalid=True) for it in items]
    paths = [it["path"] for it in items]
    if job.get("exporter") == "kaleido" and hasattr(pio, "write_images"):  # plotly >= 6.1: one call, one browser
        pio.write_images(figs, [p + ".part" for p in paths], format=[it["format"] for it in items],
                         scale=[float(it["scale"]) for it in items], validate=False)
    for fig, it in zip(figs, items):
        if not (job.get("exporter") == "kaleido" and hasattr(pio, "write_images")):
            pio.write_image(fig, it["path"] + ".part", format=it["format"], scale=float(it["scale"]), validate=False)
        os.replace(it["path"] + ".part", it["path"])
        print(f"wrote {it['path']}", flush=True)


def serve() -> None:
    """Serve jobs from stdin until it ends (see the module docstring)."""
    server = None
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            with open(line.strip(), encoding="utf-8") as fh:
                job = json.load(fh)
            if job.get("chrome"):
                os.environ.setdefault("BROWSER_PATH", job["chrome"])
            if server is None and job.get("exporter") == "kaleido":
                import kaleido

                if hasattr(kaleido, "start_sync_server"):
                    kaleido.start_sync_server(silence_warnings=True)
                    server = kaleido
            try:
                _write(job)
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which falls back to HTML
                print(f"error: {type(exc).__name__}: {' '.join(str(exc).split())}", flush=True)
                return
            print("done", flush=True)
    finally:
        if server is not None:
            server.stop_sync_server(silence_warnings=True)


if __name__ == "__main__":
    serve()
