"""One headless Chromium for the browser tests (Debian's chromium + chromedriver): the
flags that keep it offline and quiet, and screenshots saved where a variable says."""

from __future__ import annotations

from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def start(profile: Path | None, height: int = 1000, extra: tuple[str, ...] = ()
          ) -> webdriver.Chrome:
    """A headless Chromium 1280 px wide (with its own profile folder if given, and any
    ``extra`` flags); its console messages are kept (``driver.get_log("browser")``) so a
    test can refuse CSP or script errors."""
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), (
        "Debian's chromium and chromium-driver are needed: apt-get install -y chromium"
        " chromium-driver (the browser test target installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profiled = () if profile is None else (f"--user-data-dir={profile}",)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--window-size=1280,{height}", *profiled, *extra):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=DriverService(CHROMEDRIVER))
    driver.implicitly_wait(5)
    return driver


def shot(driver: WebDriver, folder: str | None, name: str) -> None:
    """Save a screenshot as ``folder/name.png`` when a folder is given (else nothing)."""
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))
