"""The annotation page in a real browser: headless Chromium driven by Selenium through the
system's chromedriver (`scripts/setup.sh --dev` installs both), from the file system, with no
server. Skips, naming the binary, where either is absent."""

from __future__ import annotations

import csv
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from harness.cli.commands import main
from results.human import read_sets
from results.run.store import RunStore
from tests.fake_run import write_rows

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
NASTY = 'says </script><script>alert("x")</script> & <!-- "quoted" \'too\'\x01\x07 tab\there\u2028é'


def fake_set(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A run of 2 pairs × 2 methods (no model), its set of 4 items in SET; text → job id."""
    rows, texts = [], {}
    for method in ("lidao-min", "uddia"):
        for p in range(4):
            group = ("female", "male")[p % 2]
            text = NASTY if (method, p) == ("lidao-min", 0) else f" {method[:1]} text {p}"
            job = f"job-{method}-{p}"
            texts[text] = job
            rows.append(
                dict(
                    job_id=job,
                    method=method,
                    prompt_id=f"{group}:{p // 2:05d}",
                    pair_id=f"{p // 2:05d}",
                    prompt_group=group,
                    prompt=f"Prompt {p}",
                    continuation=text,
                )  # fmt: skip
            )
    write_rows(str(tmp_path / "run"), rows)
    out = tmp_path / "set"
    args = ["human", "sample", str(tmp_path / "run"), "--method", "lidao-min", "--vs", "uddia"]
    assert main([*args, "--fraction", "1", "--out", str(out)]) == 0
    return tmp_path / "run", out, texts


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not Path(binary).exists():
            pytest.skip(
                f"no {binary} (scripts/setup.sh --dev installs chromium and chromium-driver)"
            )
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium-manager must not look for drivers online
    monkeypatch.setenv("SE_CACHE_PATH", str(tmp_path / "se-cache"))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900"):  # fmt: skip
        options.add_argument(flag)
    downloads = tmp_path / "downloads"
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    home = tmp_path / "home"  # Chromium's crash database and dconf go under HOME, not ours
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    service = Service(
        CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"), env={**os.environ, **env}
    )
    driver = webdriver.Chrome(options=options, service=service)
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


def press(driver: Any, key: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(key).perform()


def shown(driver: Any) -> dict[str, Any]:
    return dict(driver.execute_script(
        "const t = id => document.getElementById(id).textContent;"
        "return {counter: t('counter'), progress: t('progress'), a: t('text_a'), b: t('text_b'),"
        " done: !document.getElementById('done').hidden,"
        " on: Array.from(document.querySelectorAll('button.on')).map(b => b.dataset.choice)};"
    ))  # fmt: skip


def test_page_answers_by_keyboard_survives_a_reload_exports_and_the_export_imports(
    tmp_path: Path, browser: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    run, out, texts = fake_set(tmp_path)
    key = read_sets(RunStore(str(run))).popitem()[1].key
    browser.get((out / "annotate.html").as_uri())
    browser.find_element(By.ID, "annotator").send_keys('Ann O\'Tator, "PhD"')
    browser.find_element(By.TAG_NAME, "body").click()  # leave the name field: keys answer again
    # Item 1: texts exactly as generated (the escaping held), then A for fluency, B for friendliness.
    data = browser.execute_script(
        "return [document.scripts.length, JSON.parse(document.getElementById('data').textContent)]"
    )
    assert data[0] == 2  # the data and the code: no text opened a script of its own
    embedded = [(i["id"], i["prompt"], i["a"], i["b"]) for i in data[1]["items"]]
    assert embedded == key.select("item_id", "prompt", "text_a", "text_b").rows()
    assert NASTY in {t for row in embedded for t in row}
    first = shown(browser)
    assert first["counter"] == "Item 1 of 4" and first["progress"] == "0 of 4 answered"
    # each criterion says what it means, beside its buttons
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#criteria .crit")]
    assert [r.split("\n")[0] for r in rows] == ["fluency", "friendliness"]
    assert "natural, grammatical text" in rows[0] and "kinder and more respectful" in rows[1]
    item = key.row(0, named=True)
    assert (first["a"], first["b"]) == (item["text_a"], item["text_b"])
    press(browser, "a")
    press(browser, "b")
    assert shown(browser)["counter"] == "Item 2 of 4"  # both criteria answered: the next item
    press(browser, "t")
    press(browser, "t")
    browser.refresh()  # answers and the position are kept across reloads
    again = shown(browser)
    assert again["counter"] == "Item 3 of 4" and again["progress"] == "2 of 4 answered"
    press(browser, Keys.ARROW_LEFT)
    assert shown(browser)["on"] == ["tie", "tie"]  # going back shows what was answered
    press(browser, "b")  # ... and changes it (fluency B, friendliness A), then items 3 and 4
    press(browser, "a")
    for keys in ("ab", "bt"):
        for k in keys:
            press(browser, k)
    final = shown(browser)
    assert final["progress"] == "4 of 4 answered" and final["done"]
    browser.find_element(By.ID, "export").click()
    exported = browser.downloads / "choices.csv"
    deadline = time.monotonic() + 20
    while not exported.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert exported.exists(), "no choices.csv was downloaded"
    rows = list(csv.DictReader(exported.open(newline="", encoding="utf-8")))
    got = {(r["item_id"], r["criterion"]): r["choice"] for r in rows}
    answers = {1: ("A", "B"), 2: ("B", "A"), 3: ("A", "B"), 4: ("B", "tie")}  # item 2 changed
    expected = {
        (item_id, criterion): answers[n][j]
        for n, item_id in enumerate(key["item_id"].to_list(), 1)
        for j, criterion in enumerate(("fluency", "friendliness"))
    }
    assert got == expected and {r["annotator"] for r in rows} == {'Ann O\'Tator, "PhD"'}
    # The export imports: un-blinded by the key.
    shutil.copy(exported, tmp_path / "ann.csv")
    assert main(["human", "import", str(run), str(tmp_path / "ann.csv")]) == 0
    assert "8 answers of" in capsys.readouterr().out
    stored = RunStore(str(run))
    from results.human.files import read_choices

    answers = read_choices(stored, read_sets(stored))
    assert answers.height == 8
    side = dict(zip(key["item_id"], key["method_side"]))
    for r in answers.iter_rows(named=True):
        want_pref = (
            "tie"
            if r["choice"] == "tie"
            else "method"
            if r["choice"] == side[r["item_id"]]
            else "reference"
        )
        assert r["preferred"] == want_pref
