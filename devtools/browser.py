"""Headless Chromium for the browser tests: Debian's chromium and chromium-driver, driven
by Selenium. Nothing is downloaded at run time: the driver's path is given explicitly, so
Selenium Manager (which would fetch browsers and drivers) has no reason to run, and
``chromium()`` makes sure it never does.

The browser may talk to loopback and the test cluster's bridge only: every other request
goes to a proxy on 127.0.0.1:9 that refuses it, and host names other than localhost do not
resolve (Chromium's own background traffic - updates, safe browsing, metrics - has nowhere
to go even where a flag below misses some of it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CHROMIUM = os.environ.get("GPUSPAWNER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("GPUSPAWNER_CHROMEDRIVER", "/usr/bin/chromedriver")

_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # the tests run as root
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--metrics-recording-only",
    # Bootstrap scrolls smoothly unless motion is reduced: Selenium would click an element
    # that is still on its way into view.
    "--force-prefers-reduced-motion",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=127.0.0.1;10.213.77.0/24",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
)


def unavailable_reason() -> str | None:
    """Why no browser test can run here (None: they can)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} not found (apt-get install {package})"
    try:
        import selenium  # noqa: F401, PLC0415
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


def _no_selenium_manager(*_args, **_kwargs):
    raise RuntimeError("Selenium Manager must not run: the browser and driver are Debian's, given by path")


class Browser:
    """A headless Chromium session in a profile of its own (cookies are per browser)."""

    def __init__(self, width: int = 1200, height: int = 900, javascript: bool = True):
        from selenium import webdriver  # noqa: PLC0415
        from selenium.webdriver.chrome.service import Service  # noqa: PLC0415
        from selenium.webdriver.common import selenium_manager  # noqa: PLC0415

        selenium_manager.SeleniumManager.binary_paths = _no_selenium_manager
        self.profile = Path(tempfile.mkdtemp(prefix="gpuspawner-chromium-"))
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in _FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self.profile}")
        options.add_argument(f"--window-size={max(width, 500)},{height}")
        if width < 500:
            # Headless windows are at least 500 px wide: narrower (phone) widths are emulated.
            options.add_experimental_option(
                "mobileEmulation", {"deviceMetrics": {"width": width, "height": height, "pixelRatio": 1}}
            )
        if not javascript:
            options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
        try:
            self.driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        except BaseException:
            shutil.rmtree(self.profile, ignore_errors=True)
            raise
        self.driver.set_page_load_timeout(120)

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
