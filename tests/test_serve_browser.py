"""The page of `xmatch serve` in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`) driven by Selenium. Type a query, see the expected file first, open its
alignment, and check the screenshot is not blank; at a phone's width nothing overflows.
Skipped where Selenium, Chromium or its driver is missing."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest

from test_serve_api import NAMES, QUERY, expected_order, live, picture_index, pixel_model  # noqa: F401 - fixtures

pytest.importorskip("fastapi")
webdriver = pytest.importorskip("selenium.webdriver")
Image = pytest.importorskip("PIL.Image")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if CHROMIUM is None or DRIVER is None:
    pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
                allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ready  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from xmatch.serve.service import open_service  # noqa: E402

#: the longest the browser waits for the page to show something (a bound, not a measurement)
PATIENCE = 60


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


def not_blank(png: bytes) -> bool:
    grey = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)
    return grey.std() > 10


def test_a_query_shows_the_expected_file_first_and_its_alignment(browser, picture_index, pixel_model, tmp_path):
    idx, photos = picture_index
    with live(open_service(idx, photos)) as client:
        browser.set_window_size(1280, 900)
        browser.get(str(client.base_url))
        wait = WebDriverWait(browser, PATIENCE)
        wait.until(ready.text_to_be_present_in_element((By.ID, "card"), f"{len(NAMES)} images"))
        assert browser.find_element(By.ID, "rerank-switch").is_displayed()  # the model has a verifier
        box = browser.find_element(By.ID, "text")
        box.send_keys(QUERY + " qqzzxq")
        browser.find_element(By.ID, "go").click()
        first = wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "#results .hit")))
        assert first.get_attribute("data-id") == expected_order(pixel_model, photos, QUERY + " qqzzxq")[0]
        assert "qqzzxq" in browser.find_element(By.ID, "unknown").text
        wait.until(lambda b: b.execute_script(
            "const i = document.querySelector('#results .hit img'); return i && i.complete && i.naturalWidth > 0"))
        first.click()
        wait.until(lambda b: b.execute_script(
            "const i = document.getElementById('alignment-picture'); return i.complete && i.naturalWidth > 0"))
        wait.until(lambda b: b.find_element(By.ID, "overlay").is_displayed())
        assert len(browser.find_elements(By.CSS_SELECTOR, "#legend li")) == len(QUERY.split()) + 1
        shot = browser.get_screenshot_as_png()
        (tmp_path / "page.png").write_bytes(shot)
        assert not_blank(shot)


def test_the_page_fits_a_phone_width(browser, picture_index):
    idx, photos = picture_index
    with live(open_service(idx, photos)) as client:
        browser.set_window_size(390, 844)
        browser.get(str(client.base_url))
        wait = WebDriverWait(browser, PATIENCE)
        wait.until(ready.text_to_be_present_in_element((By.ID, "card"), "images"))
        browser.find_element(By.ID, "text").send_keys(QUERY)
        browser.find_element(By.ID, "go").click()
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#results .hit")) == len(NAMES))
        overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        columns = browser.execute_script(
            "return getComputedStyle(document.getElementById('results')).gridTemplateColumns.split(' ').length")
        assert overflow <= 0 and columns == 2
