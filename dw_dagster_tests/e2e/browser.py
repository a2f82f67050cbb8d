"""Helpers for the browser test: the Dagster UI shows the pending change set, then the receipt, on the asset's page.

Headless Debian Chromium (``/usr/bin/chromium`` driven through ``/usr/bin/chromedriver`` by
Selenium; ``make test`` installs both with apt, nothing downloads a browser) opens
``/assets/store_sales_line?view=events`` (Assets → store_sales_line → Events) in the webserver of
the real ``dagster dev`` that :mod:`dw_dagster_tests.e2e.test_daemon_e2e` runs on SQLite storage, at two
moments: when the diagnosis has proposed the change set, and after the repair wrote its receipt.
Each visit selects the observation (``&time=<ms>``, what clicking its row in the events list
does), waits for the React app to render its description, opens its ``[Show Markdown]`` entry,
and saves two PNG screenshots (the event, the markdown); ``test_browser_asset_page_shows_pending_change_set_then_receipt`` (in
:mod:`.test_daemon_e2e`, so the loop it looks at runs once) copies them into its ``tmp_path``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ASSET_EVENTS_PATH = "/assets/store_sales_line?view=events"  # Assets → store_sales_line → Events


class PageCheckError(AssertionError):
    """The page did not show what it must; the message says what it showed instead."""


@dataclass
class PageSeen:
    """What one visit of the asset page found."""

    moment: str
    url: str
    expected: list[str]
    screenshot: Path
    event_text: str = ""
    markdown_text: str = ""
    markdown_screenshot: Path | None = None
    seconds: float = 0.0
    clicked_rows: int = 0


def chrome(log_dir: Path):
    """Headless Chromium through the system chromedriver (no Selenium Manager, no download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        raise PageCheckError(f"{', '.join(missing)} missing: `make browser-deps` installs Debian's chromium and chromium-driver")
    opts = Options()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1600,1200", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(log_dir / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_page_load_timeout(60)
    return driver


def _body(driver) -> str:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        return driver.find_element(By.TAG_NAME, "body").text
    except WebDriverException:
        return ""


def _skip_newsletter(base_url: str) -> None:
    """What the newsletter dialog's "Skip" sends (``setNuxSeen``): on loopback the UI opens that
    dialog a second or two after the first page load, over whatever the screenshot should show."""
    import httpx

    r = httpx.post(f"{base_url}/graphql", json={"query": "mutation { setNuxSeen }"}, timeout=30)
    r.raise_for_status()


def _dismiss_dialogs(driver) -> None:
    """Close the UI's first-visit newsletter dialog ("Skip", which also tells the server not to show it again)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    for b in driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
        try:
            b.click()
        except WebDriverException:
            pass


def check_asset_page(base_url: str, expected: list[str], screenshot: Path, moment: str,
                     event_time_ms: int | None = None, markdown_key: str | None = None,
                     markdown_expected: list[str] = (), timeout: float = 90) -> PageSeen:
    """Open the asset's events, find the observation showing every text of ``expected``, screenshot it.

    With ``markdown_key`` (e.g. ``dw/receipt_md``), its ``[Show Markdown]`` link is clicked too; the
    dialog must show ``markdown_expected`` and gets its own screenshot (``<name>_markdown.png``).

    ``event_time_ms`` (the event's timestamp in ms, what the UI puts in ``&time=`` when a row of
    the list is clicked) selects that event; without it the list selects the newest one. When the
    texts do not show, the observation rows are clicked newest first, then the page is loaded
    again. Raises :class:`PageCheckError` (after saving the screenshot) on timeout.
    """
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    screenshot.parent.mkdir(parents=True, exist_ok=True)
    _skip_newsletter(base_url)
    url = base_url + ASSET_EVENTS_PATH + (f"&time={event_time_ms}" if event_time_ms else "")
    seen = PageSeen(moment=moment, url=url, expected=expected, screenshot=screenshot)
    t0 = time.monotonic()
    driver = chrome(screenshot.parent)

    def shown() -> bool:
        _dismiss_dialogs(driver)
        body = _body(driver)
        return all(t in body for t in expected)

    try:
        driver.get(url)
        loaded, found = time.monotonic(), False
        while not (found := shown()) and time.monotonic() < t0 + timeout:
            if time.monotonic() - loaded < 15:
                time.sleep(0.5)  # the React app renders, then fetches the events
                continue
            for row in driver.find_elements(By.XPATH, "//div[@data-index][.//*[@aria-label='observation']]")[:12]:
                try:
                    row.click()
                    seen.clicked_rows += 1
                except WebDriverException:
                    continue
                time.sleep(0.5)
                if found := shown():
                    break
            if found:
                break
            driver.get(url)  # the event may have landed after the first render
            loaded = time.monotonic()
        _dismiss_dialogs(driver)
        time.sleep(0.3)
        seen.event_text = _body(driver)
        driver.save_screenshot(str(screenshot))
        seen.seconds = time.monotonic() - t0
        if not found:
            raise PageCheckError(f"{moment}: {url} did not show {expected} within {timeout:.0f} s; "
                                 f"page text:\n{seen.event_text[-3000:]}")
        if markdown_key:
            _show_markdown(driver, seen, markdown_key, list(markdown_expected), deadline=time.monotonic() + 30)
        seen.seconds = time.monotonic() - t0
        return seen
    finally:
        driver.quit()


def _show_markdown(driver, seen: PageSeen, key: str, expected: list[str], deadline: float) -> None:
    """Open the markdown metadata entry ``key`` of the selected event; check and screenshot the dialog."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    link = f"//tr[.//*[normalize-space(text())='{key}']]//*[normalize-space(text())='[Show Markdown]']"
    while time.monotonic() < deadline:
        _dismiss_dialogs(driver)  # the newsletter dialog may pop up late and cover the link
        try:
            if not any(key in d.text for d in driver.find_elements(By.XPATH, "//*[@role='dialog']")):
                driver.find_element(By.XPATH, link).click()
                time.sleep(1.0)
            dialogs = [d for d in driver.find_elements(By.XPATH, "//*[@role='dialog']") if key in d.text]
            seen.markdown_text = dialogs[-1].text if dialogs else ""
        except WebDriverException:
            seen.markdown_text = ""
        if seen.markdown_text and all(t in seen.markdown_text for t in expected):
            break
        time.sleep(1.0)
    driver.execute_script("document.querySelectorAll('*').forEach(e => { if (e.scrollTop) e.scrollTop = 0; }); window.scrollTo(0, 0);")
    time.sleep(0.3)
    seen.markdown_screenshot = seen.screenshot.with_name(seen.screenshot.stem + "_markdown.png")
    driver.save_screenshot(str(seen.markdown_screenshot))
    if not all(t in seen.markdown_text for t in expected):
        raise PageCheckError(f"{seen.moment}: [Show Markdown] of {key} did not show {expected}; "
                             f"dialog text:\n{seen.markdown_text[:3000]}")
