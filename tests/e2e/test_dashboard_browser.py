"""optuna-dashboard in a real browser (Debian's Chromium, headless) on a study the tuner made:
the Pareto-front view and a trial's note render.  Screenshots are kept in test-artifacts/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from ..conftest import REPO, free_port, run_cli, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        if os.environ.get("TUNER_REQUIRE_SERVICES") == "1":
            pytest.fail("Chromium is not installed: .ci/services.sh up failed")
        pytest.skip("no Chromium/chromedriver (Debian packages chromium, chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    # Background networking off: this machine's network is closed, and Chromium would keep retrying.
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    drv = webdriver.Chrome(service=Service(driver), options=options)
    yield drv
    drv.quit()


def _page_text(drv, url: str, needle: str, timeout: float = 30) -> str:
    from selenium.webdriver.common.by import By

    drv.get(url)
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = drv.find_element(By.TAG_NAME, "body").text
        if needle in text:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} not on {url}:\n{text[:2000]}")


def test_pareto_front_and_a_trial_note_render(tmp_path, browser):
    config = write_config(tmp_path, space="speculative_num_steps = { choices = [1, 3] }\nmem_fraction_static = { choices = [0.86, 0.88] }")
    result = run_cli("--trials", "4", "--config", str(config), "--seed", "2")
    assert result.returncode == 0, result.stderr
    port = free_port()
    dashboard = subprocess.Popen([sys.executable, "-m", "tuner.dashboard", "--config", str(config), "--port", str(port)],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = dashboard.stdout.readline()
        assert f"http://127.0.0.1:{port}/dashboard/" in first
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/api/studies", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        ARTIFACTS.mkdir(exist_ok=True)
        text = _page_text(browser, f"http://127.0.0.1:{port}/dashboard/studies/1", "Pareto Front")
        assert "single_tps" in text and "concurrent_tps" in text
        browser.save_screenshot(str(ARTIFACTS / "dashboard-pareto-front.png"))
        text = _page_text(browser, f"http://127.0.0.1:{port}/dashboard/studies/1/trials", "steady window")
        assert "--speculative-num-steps" in text  # the launch command, in the note
        browser.save_screenshot(str(ARTIFACTS / "dashboard-trial-note.png"))
        assert (ARTIFACTS / "dashboard-pareto-front.png").stat().st_size > 10_000
    finally:
        dashboard.terminate()
        dashboard.wait()
