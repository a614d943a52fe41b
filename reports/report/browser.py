"""Open a page in headless Chromium and record what a reader's browser does with it: every request
it makes, every console message and uncaught exception, and a screenshot.

Chromium is driven over the DevTools protocol through `--remote-debugging-pipe` (JSON messages
separated by NUL bytes on file descriptors 3 and 4): no port, no websocket library, nothing to
install beyond Debian's `chromium` package.
"""

from __future__ import annotations

import base64
import io
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Flags for a quiet, reproducible headless run: nothing but the page may touch the network.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # CI containers run as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)
SETTLE_S = 0.5  # after the load event, wait this long for late requests or messages
# Chromium reads DevTools commands from fd 3 and writes replies to fd 4. This launcher moves the two pipe
# ends there (through fds >= 10, so that neither overwrites the other) and becomes Chromium.
_PIPE_LAUNCHER = """
import fcntl, os, sys
given = [int(fd) for fd in sys.argv[1:3]]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in given]
for fd in given:
    os.close(fd)
for target, fd in zip((3, 4), high):
    os.dup2(fd, target)
    os.close(fd)
os.execv(sys.argv[3], sys.argv[3:])
"""


class BrowserError(RuntimeError):
    """Chromium could not be started or stopped answering."""


@dataclass(frozen=True)
class ConsoleMessage:
    level: str  # "error", "warning", "info", ...
    source: str  # "console", "exception", or the Log domain's source (network, security, ...)
    text: str


@dataclass(frozen=True)
class PageVisit:
    url: str
    requested_urls: tuple[str, ...]
    messages: tuple[ConsoleMessage, ...]
    script_elements: int  # <script> elements in the DOM after load
    title: str
    screenshot_png: bytes
    probe_values: tuple[Any, ...] = ()  # what each probe expression gave, in order

    @property
    def errors(self) -> tuple[ConsoleMessage, ...]:
        return tuple(m for m in self.messages if m.level == "error")

    @property
    def foreign_requests(self) -> tuple[str, ...]:
        """Every request other than the page itself."""
        return tuple(url for url in self.requested_urls if url != self.url)


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def visit_page(
    page: Path,
    chromium: str,
    timeout_s: float = 60.0,
    window: tuple[int, int] = (1280, 1800),
    probes: Sequence[str] = (),
) -> PageVisit:
    """Load `page` (a local file) in a fresh headless Chromium profile and record what happened.

    `probes` are JavaScript expressions the test harness evaluates through DevTools, in order, after
    the page's own scripts were counted and the screenshot taken (the page itself runs none): what a
    reader's browser lays out (element positions, the page's height), or a reader's action (opening
    every <details>) followed by what it changes."""
    url = page.resolve().as_uri()
    with (
        tempfile.TemporaryDirectory(prefix="twinfer-chromium-") as profile,
        _Chromium(chromium, profile, window, timeout_s) as browser,
    ):
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            browser.call(f"{domain}.enable", session=session)
        browser.call("Page.navigate", {"url": url}, session=session)
        browser.wait_for_event("Page.loadEventFired", session)
        browser.pump(SETTLE_S)
        scripts = _evaluate(browser, session, "document.scripts.length")
        title = _evaluate(browser, session, "document.title")
        shot = browser.call("Page.captureScreenshot", {"format": "png"}, session)
        values = tuple(_evaluate(browser, session, expression) for expression in probes)
        events = [e for e in browser.events if e.get("sessionId") == session]
    return PageVisit(
        url=url,
        requested_urls=tuple(
            e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"
        ),
        messages=tuple(_messages(events)),
        script_elements=int(scripts),
        title=str(title),
        screenshot_png=base64.b64decode(shot["data"]),
        probe_values=values,
    )


def _evaluate(browser: _Chromium, session: str, expression: str) -> Any:
    reply = browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
    if "exceptionDetails" in reply:
        raise BrowserError(f"{expression!r} raised: {reply['exceptionDetails'].get('text', '')}")
    return reply["result"].get("value")


def pixel_variety(png: bytes) -> tuple[int, float]:
    """(distinct colours, fraction of pixels that differ from the most common colour) of a PNG."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=image.width * image.height) or []
    most_common = max(count for count, _ in colours)
    return len(colours), 1.0 - most_common / (image.width * image.height)


def _messages(events: list[dict[str, Any]]):
    for event in events:
        method, params = event["method"], event["params"]
        if method == "Runtime.consoleAPICalled":
            level = {"assert": "error", "warning": "warning"}.get(params["type"], params["type"])
            text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
            yield ConsoleMessage(level, "console", text)
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            yield ConsoleMessage(
                "error", "exception", details.get("exception", {}).get("description") or details.get("text", "")
            )
        elif method == "Log.entryAdded":
            entry = params["entry"]
            yield ConsoleMessage(entry["level"], entry["source"], entry.get("text", ""))


@dataclass
class _Chromium:
    """A headless Chromium process and its DevTools pipe (commands out on fd 3, replies in on fd 4)."""

    executable: str
    profile: str
    window: tuple[int, int]
    timeout_s: float
    events: list[dict[str, Any]] = field(default_factory=list)

    def __enter__(self) -> _Chromium:
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        flags = [*CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", f"--window-size={self.window[0]},{self.window[1]}"]
        # Chromium's own log goes to a file: a full stderr pipe would block it.
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _PIPE_LAUNCHER,
                str(to_browser_read),
                str(from_browser_write),
                self.executable,
                *flags,
                "about:blank",
            ],
            pass_fds=(to_browser_read, from_browser_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._pending: list[dict[str, Any]] = []
        self._next_id = 0
        self._deadline = time.monotonic() + self.timeout_s
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._process.poll() is None:
                try:
                    self._send("Browser.close", {}, None)
                    self._process.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    self._process.kill()  # our own child, by its handle
                    self._process.wait(timeout=10)
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            self._log.close()

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        message_id = self._send(method, params or {}, session)
        reply = self._next_matching(lambda message: message.get("id") == message_id)
        if "error" in reply:
            raise BrowserError(f"{method} failed: {reply['error']}")
        return reply.get("result", {})

    def wait_for_event(self, method: str, session: str) -> dict[str, Any]:
        return self._next_matching(lambda m: m.get("method") == method and m.get("sessionId") == session)

    def pump(self, seconds: float) -> None:
        """Keep reading for `seconds`: requests or messages that come after the load event are kept too."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            self._read_some(left)

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _next_matching(self, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        while True:
            for index, message in enumerate(self._pending):
                if wanted(message):
                    return self._pending.pop(index)
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout_s:.0f} s")
            self._read_some(left)

    def _read_some(self, wait_s: float) -> None:
        ready, _, _ = select.select([self._from_browser], [], [], wait_s)
        if not ready:
            return
        chunk = os.read(self._from_browser, 1 << 20)
        if not chunk:
            self._log.seek(0)
            log = self._log.read().decode(errors="replace")[-1000:]
            raise BrowserError(f"Chromium closed its DevTools pipe (exit status {self._process.poll()}): {log}")
        self._buffer += chunk
        while b"\0" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\0", 1)
            message = json.loads(raw)
            if "method" in message:
                self.events.append(message)
            self._pending.append(message)
