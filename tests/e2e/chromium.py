"""One headless Chromium for the browser tests (Debian's chromium + chromedriver): the
flags that keep it offline and quiet, screenshots saved where a variable says, and the
waits a server-rendered console needs (a sign-in, a form's reload, a page's refresh)."""

from __future__ import annotations

import time
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver, WebElement
from selenium.webdriver.support.ui import WebDriverWait

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
    """Save a screenshot as ``folder/name.png`` when a folder is given (else nothing);
    ``name`` may hold a subfolder."""
    if folder:
        path = Path(folder) / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))


def sign_in(driver: WebDriver, url: str, token: str) -> None:
    """A fresh console session of ``token`` at the service ``url``."""
    driver.delete_all_cookies()
    driver.get(url + "/console/signin")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "signin").click()
    assert driver.find_element(By.ID, "who")


def until_text(driver: WebDriver, element_id: str, text: str, timeout: float = 30.0) -> None:
    """Wait until ``#element_id`` reads ``text`` (a release or analysis page refreshes
    itself each second until it ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            elements = driver.find_elements(By.ID, element_id)
            if elements and elements[0].text == text:
                return
        except StaleElementReferenceException:  # the page's 1 s refresh replaced it
            pass
        time.sleep(0.2)
    raise AssertionError(f"#{element_id} never read {text!r}: {driver.page_source[:2000]}")


def reloaded(driver: WebDriver, element: WebElement, timeout: float = 10.0) -> None:
    """Wait until a click's navigation replaced ``element``. Chromium may answer a check
    on a node of the page being replaced with an inspector error ("Node with given id
    does not belong to the document") instead of a stale-element one: both mean it is
    gone (``staleness_of`` let the first escape, failing the test at random)."""

    def gone(_: WebDriver) -> bool:
        try:
            element.is_enabled()
        except (StaleElementReferenceException, WebDriverException):
            return True
        return False

    WebDriverWait(driver, timeout).until(gone)
