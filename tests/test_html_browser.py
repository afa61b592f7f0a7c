"""The HTML report in a real headless browser (Debian's chromium; .ci/run installs it).

A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe` (file descriptors 3 and 4, messages are
JSON terminated by a NUL byte) — no websocket library, no driver download. It loads the report from a file:// URL
and checks: no uncaught exception, no console.error, no error log entry, no request leaving the file (the page
works offline), the inline script ran (it marks <body data-autopar-ready=N> and logs once), one marker per front
point, clicking a marker fills the details panel, and a full-page screenshot is written to the test's tmp dir.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from autopar.report import write_report
from test_report_support import DENSE_PLANS, MOE_PLANS, dense_model, moe_model, synthetic_front

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars")
TIMEOUT_S = 60.0


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


class ChromiumPipe:
    """One headless chromium driven over the DevTools pipe."""

    def __init__(self, binary: str, profile_dir: Path, log_path: Path) -> None:
        to_browser_read, to_browser_write = os.pipe()
        from_browser_read, from_browser_write = os.pipe()

        def wire_pipes() -> None:  # in the child: the protocol wants fd 3 to read and fd 4 to write
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        self.log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, close_fds=False, preexec_fn=wire_pipes)
        os.close(to_browser_read)
        os.close(from_browser_write)
        self.writer = to_browser_write
        self.reader = from_browser_read
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.reader], [], [], remaining)
            if ready:
                chunk = os.read(self.reader, 1 << 16)
                if not chunk:
                    raise EOFError("chromium closed the DevTools pipe")
                self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self.writer, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        while True:
            event = self._read_message(deadline)
            self.events.append(event)
            if event.get("method") == method and event.get("sessionId") == session:
                return event

    def evaluate(self, expression: str, session: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        if "exceptionDetails" in result:
            raise AssertionError(f"evaluating {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, EOFError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self.writer, self.reader):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()


@pytest.fixture
def browser(tmp_path):
    binary = chromium_binary()
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run does it)")
    pipe = ChromiumPipe(binary, tmp_path / "chromium-profile", tmp_path / "chromium.log")
    try:
        yield pipe
    finally:
        pipe.close()


def open_page(browser: ChromiumPipe, path: Path) -> str:
    """Attach to the browser's page, load `path`, wait for the load event; returns the session id."""
    targets = browser.send("Target.getTargets")["targetInfos"]
    pages = [t for t in targets if t["type"] == "page"]
    target_id = pages[0]["targetId"] if pages else browser.send("Target.createTarget", {"url": "about:blank"})[
        "targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target_id, "flatten": True})["sessionId"]
    for domain in ("Runtime", "Log", "Page", "Network"):
        browser.send(f"{domain}.enable", session=session)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session)
    browser.send("Page.navigate", {"url": path.resolve().as_uri()}, session)
    browser.wait_for("Page.loadEventFired", session)
    return session


def page_errors(browser: ChromiumPipe, session: str) -> list[str]:
    errors = []
    for event in browser.events:
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(json.dumps(params["exceptionDetails"])[:500])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append("console.error: " + json.dumps(params.get("args"))[:500])
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            errors.append("log: " + params["entry"].get("text", ""))
    return errors


def console_messages(browser: ChromiumPipe, session: str) -> list[str]:
    return [" ".join(str(arg.get("value")) for arg in event["params"].get("args", []))
            for event in browser.events
            if event.get("sessionId") == session and event.get("method") == "Runtime.consoleAPICalled"]


def outside_requests(browser: ChromiumPipe, session: str) -> list[str]:
    return [event["params"]["request"]["url"] for event in browser.events
            if event.get("sessionId") == session and event.get("method") == "Network.requestWillBeSent"
            and not event["params"]["request"]["url"].startswith(("file:", "data:", "about:"))]


def screenshot(browser: ChromiumPipe, session: str, path: Path) -> Path:
    size = browser.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    data = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip},
                        session)["data"]
    path.write_bytes(base64.b64decode(data))
    return path


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_report_loads_in_headless_chromium_without_errors(browser, tmp_path, kind):
    front = (synthetic_front(dense_model(), DENSE_PLANS) if kind == "dense"
             else synthetic_front(moe_model(), MOE_PLANS, proven_optimal=False))
    report = write_report(front, tmp_path / f"front-{kind}.html")
    session = open_page(browser, report)

    assert browser.evaluate("document.body.getAttribute('data-autopar-ready')", session) == str(len(front))
    assert f"autopar report ready: {len(front)} points" in console_messages(browser, session)
    assert browser.evaluate("document.querySelectorAll('circle.point-marker').length", session) == len(front)
    ranks = browser.evaluate("Array.from(document.querySelectorAll('circle.point-marker'))"
                             ".map(c => Number(c.dataset.index)).sort((a, b) => a - b)", session)
    assert ranks == list(range(len(front)))
    # every marker is drawn inside the chart
    inside = browser.evaluate(
        "(() => { const box = document.getElementById('pareto-chart').getBoundingClientRect();"
        " return Array.from(document.querySelectorAll('circle.point-marker')).every(c => {"
        " const r = c.getBoundingClientRect(); return r.width > 0 && r.left >= box.left && r.right <= box.right"
        " && r.top >= box.top && r.bottom <= box.bottom; }); })()", session)
    assert inside is True
    # clicking a marker shows that point's details
    last = len(front) - 1
    heading = browser.evaluate(
        f"document.querySelector('circle.point-marker[data-index=\"{last}\"]')"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true}));"
        " document.querySelector('#details h3').textContent", session)
    assert heading == f"#{last}  {front[last].plan.short()}"
    assert browser.evaluate("document.querySelectorAll('#memory-bars .bar-row').length", session) == len(front)
    assert browser.evaluate("document.querySelectorAll('#time-bars .bar-row').length", session) == len(front)

    shot = screenshot(browser, session, tmp_path / f"front-{kind}.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert page_errors(browser, session) == []
    assert outside_requests(browser, session) == []


def test_a_script_in_the_model_name_is_shown_as_text_not_run(browser, tmp_path):
    name = ('<script>document.body.setAttribute("data-pwned","1")</script>'
            '<img src=x onerror="document.body.setAttribute(\'data-pwned\',\'2\')"></script><!--')
    front = synthetic_front(dense_model(name), DENSE_PLANS[:3])
    session = open_page(browser, write_report(front, tmp_path / "evil.html"))
    assert browser.evaluate("document.body.getAttribute('data-autopar-ready')", session) == "3"
    assert browser.evaluate("document.body.hasAttribute('data-pwned')", session) is False
    assert browser.evaluate("document.querySelectorAll('img').length", session) == 0
    assert browser.evaluate("document.scripts.length", session) == 2
    heading = browser.evaluate("document.querySelector('h1').textContent", session)
    assert name in heading  # the literal text, tags and all
    assert browser.evaluate("document.title", session).startswith("autopar: " + name)
    assert page_errors(browser, session) == []
    assert outside_requests(browser, session) == []
