"""Open ``report.html`` in real headless Chromium over the DevTools protocol: check it, or screenshot it.

    python tools/report_browser.py check REPORT.html [--expect-version cv-...]
    python tools/report_browser.py screenshot REPORT.html OUT.png [--width 1280]

Chromium is Debian's ``chromium`` package (``$CHROMIUM`` names another binary). It runs offline as root:
no sandbox, no GPU, no network services, a fresh profile that is removed afterwards. ``check`` loads the page
and reports every image that did not load, every console error or uncaught exception, and whether the summary
names the config version; it exits 1 on any problem. ``screenshot`` writes the whole page as one PNG.

Non-goals: a general browser driver (only what the report's test and ``make report-screenshot`` need).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import websocket

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)


def chromium_binary() -> str | None:
    named = os.environ.get("CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageCheck:
    images: list[tuple[str, bool]] = field(default_factory=list)  # (name, loaded)
    console_errors: list[str] = field(default_factory=list)
    summary_text: str = ""
    network_requests: list[str] = field(default_factory=list)  # anything not data: or the page itself

    def problems(self, expect_version: str | None = None) -> list[str]:
        out = [f"image {name} did not load" for name, ok in self.images if not ok]
        if not self.images:
            out.append("the page has no image")
        out += [f"console: {text}" for text in self.console_errors]
        out += [f"network request: {url}" for url in self.network_requests]
        if expect_version is not None and expect_version not in self.summary_text:
            out.append(f"the summary does not name config version {expect_version}")
        return out


class Chromium:
    """One headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, *, width: int = 1280, height: int = 900, timeout_s: float = 60.0) -> None:
        binary = chromium_binary()
        if binary is None:
            raise RuntimeError("no chromium on PATH (Debian: apt-get install -y chromium; or set $CHROMIUM)")
        self.binary, self.width, self.height, self.timeout_s = binary, width, height, timeout_s
        self._profile = Path(tempfile.mkdtemp(prefix="report-chromium-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: websocket.WebSocket | None = None
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        command = [self.binary, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={self.width},{self.height}"]
        self._process = subprocess.Popen([*command, "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if self._process.poll() is not None:
                error = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
                raise RuntimeError(f"chromium exited with {self._process.returncode}: {error[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        page = next(t for t in targets if t.get("type") == "page")
        self._socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=self.timeout_s)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._socket is not None:
            self._socket.close()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            if self._process.stderr is not None:
                self._process.stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command; events that arrive meanwhile are kept in ``events``."""
        assert self._socket is not None
        self._next_id += 1
        ident = self._next_id
        self._socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if "method" in message:
                self.events.append(message)

    def wait_for(self, event: str) -> dict[str, Any]:
        assert self._socket is not None
        for seen in self.events:
            if seen["method"] == event:
                return seen
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            message: dict[str, Any] = json.loads(self._socket.recv())
            if "method" in message:
                self.events.append(message)
                if message["method"] == event:
                    return message
        raise RuntimeError(f"no {event} within {self.timeout_s:g} s")

    def open(self, path: Path) -> None:
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"page script failed: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def check(self, path: Path) -> PageCheck:
        self.open(path)
        # Images decode asynchronously: wait for each to finish (or fail) before reading its state.
        images = self.evaluate(
            "Promise.all(Array.from(document.images).map(i => i.decode().then(() => true, () => false)"
            ".then(ok => [i.dataset.name || i.getAttribute('src').slice(0, 60), ok && i.naturalWidth > 0])))"
        )
        result = PageCheck(images=[(str(n), bool(ok)) for n, ok in images])
        result.summary_text = str(self.evaluate("(document.getElementById('summary') || {}).innerText || ''"))
        page_url = path.resolve().as_uri()
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                words = (str(a.get("value", a.get("description"))) for a in params["args"])
                result.console_errors.append(" ".join(words))
            elif method == "Runtime.exceptionThrown":
                result.console_errors.append(str(params["exceptionDetails"].get("text")))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                result.console_errors.append(str(params["entry"].get("text")))
            elif method == "Network.requestWillBeSent":
                url = str(params["request"]["url"])
                if not url.startswith("data:") and url != page_url:
                    result.network_requests.append(url)
        return result

    def screenshot(self, path: Path, out: Path) -> None:
        self.open(path)
        self.evaluate("Promise.all(Array.from(document.images).map(i => i.decode().catch(() => null)))")
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": self.width, "height": size["height"], "scale": 1},
        )
        out.write_bytes(base64.b64decode(shot["data"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="load the report; exit 1 on a broken image or a console error")
    check.add_argument("report", type=Path)
    check.add_argument("--expect-version", help="the config version the summary must name")
    shot = commands.add_parser("screenshot", help="write the whole page as one PNG")
    shot.add_argument("report", type=Path)
    shot.add_argument("out", type=Path)
    shot.add_argument("--width", type=int, default=1280)
    args = parser.parse_args(argv)
    if args.command == "check":
        with Chromium() as browser:
            found = browser.check(args.report)
        problems = found.problems(args.expect_version)
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{len(found.images)} images, {len(problems)} problems")
        return 1 if problems else 0
    with Chromium(width=args.width) as browser:
        browser.screenshot(args.report, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
