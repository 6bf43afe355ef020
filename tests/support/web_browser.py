"""The status page's tests in a real browser: headless Debian chromium through its chromedriver
(Selenium), skipped on a developer machine that lacks them and a failure under CI; a viewport of
an exact width; whether the page scrolls sideways; a screenshot kept in docs/."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import IN_CI

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: set to 1 to write the docs' screenshots again (else each is written only when missing)
UPDATE_SCREENSHOTS = "ANARCHON_UPDATE_SCREENSHOT"


@pytest.fixture
def browser():
    """Headless Debian chromium through its chromedriver, a 1200x800 window."""
    try:
        from selenium import webdriver
    except ImportError as error:       # skipped on a developer machine, a failure under CI
        message = f"selenium is not installed ({error}): pip install -e '.[test]'"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    from selenium.webdriver.chrome.service import Service
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        message = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,800", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def viewport(driver, width: int, height: int) -> None:
    """Make the page's viewport exactly ``width`` CSS pixels wide and about ``height`` high (the
    window is larger by its frame, whatever that is here; the screen may hold less height)."""
    driver.set_window_size(width, height)
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight];")
    driver.set_window_size(2 * width - inner[0], 2 * height - inner[1])
    inner = driver.execute_script("return window.innerWidth;")
    assert inner == width, f"the viewport is {inner} px wide, not {width}"


def sideways(driver) -> tuple[int, int]:
    """``(scrollWidth, clientWidth)`` of the document: the page scrolls sideways when the first
    is larger."""
    return tuple(driver.execute_script(
        "var d = document.documentElement; return [d.scrollWidth, d.clientWidth];"))


def keep_screenshot(driver, tmp: Path, target: Path) -> Path:
    """Save the viewport's screenshot in ``tmp`` (every run) and copy it to ``target`` (in
    docs/) when that file is missing or ``ANARCHON_UPDATE_SCREENSHOT=1``. Returns the copy in
    ``tmp``."""
    shot = tmp / target.name
    driver.save_screenshot(str(shot))
    if not target.exists() or os.environ.get(UPDATE_SCREENSHOTS) == "1":
        shutil.copyfile(shot, target)
    return shot
