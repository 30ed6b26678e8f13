"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (stdlib only) for browser tests.

Chromium reads commands from file descriptor 3 and writes replies and events to descriptor 4,
each message a JSON object followed by a NUL byte; no websocket library, no chromedriver.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run")


def find_chromium() -> str | None:
    """The Chromium/Chrome executable (``$BROWSER_PATH`` first), or None."""
    for c in (os.environ.get("BROWSER_PATH"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


class Browser:
    """A headless Chromium with one page, driven over the DevTools pipe."""

    def __init__(self, executable: str, profile: Path, width: int = 1700, height: int = 1300):
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def wire() -> None:  # in the child: the pipe ends become fds 3 and 4
            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                                      "about:blank"], pass_fds=(3, 4), preexec_fn=wire,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def _read(self, timeout: float) -> dict[str, Any]:
        end = time.time() + timeout
        while b"\0" not in self._buf:
            if time.time() > end:
                raise TimeoutError("no message from the browser")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, session: bool = False, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply (events that arrive meanwhile are kept)."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        res = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"JavaScript error: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        end = time.time() + timeout
        while time.time() < end:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"never true: {expression}")

    def open(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("document.readyState === 'complete'")

    def click(self, x: float, y: float) -> None:
        """A real left click (move, press, release) at page coordinates."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            extra = {} if kind == "mouseMoved" else {"button": "left", "clickCount": 1}
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, **extra)
            time.sleep(0.05)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._r)
        os.close(self._w)
