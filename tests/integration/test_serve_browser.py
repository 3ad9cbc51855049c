"""The page at ``/`` of ``mtkit serve``, in a real headless browser (Debian's chromium and
chromium-driver through Selenium, both installed by .ci/run; no driver is downloaded at run time):
typing a sentence and pressing Translate shows ``mtkit translate``'s translation and a confidence, and
hovering a word lights up the words aligned with it;
the OpenAPI docs at ``/docs`` render. The browser resolves no host name but the server's address,
so a page that needed a CDN would fail here.
"""

from __future__ import annotations

import shutil

import pytest
from test_serve import ENV, Server, mtkit_translate, sentences

pytest.importorskip("fastapi")
selenium = pytest.importorskip("selenium")

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 "--user-data-dir=" + str(tmp_path_factory.mktemp("chrome"))):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, env=ENV), options=options)
    yield driver
    driver.quit()


def test_the_page_translates_what_is_typed(reverse_run, tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    line = sentences(1, seed=11)[0]
    expected = mtkit_translate("-m", reverse_run, lines=[line])[0]
    server = Server(tmp_path, "-m", reverse_run)
    try:
        browser.get(f"http://127.0.0.1:{server.port}/")
        wait = WebDriverWait(browser, 120)  # a bound on a hung page, not a timing assertion
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#pair option"))  # the models are listed
        assert "en → de" in browser.find_element(By.CSS_SELECTOR, "#pair option").text
        browser.find_element(By.ID, "input").send_keys(line)
        browser.find_element(By.ID, "go").click()
        wait.until(ready.text_to_be_present_in_element((By.ID, "scores"), "confidence"))
        assert browser.find_element(By.ID, "output").text == expected
        assert "error" not in browser.find_element(By.ID, "status").get_attribute("class")
        # hovering a word of the translation lights up the source words its alignment names, and back
        status, answer = server.post_json("/v1/translate", {"text": line, "alignments": True})
        alignment = answer["translations"][0]["alignment"]
        assert status == 200 and alignment and browser.find_element(By.ID, "source").text == line
        from selenium.webdriver.common.action_chains import ActionChains

        for side, other, word in (("tgt", "src", alignment[0][1]), ("src", "tgt", alignment[0][0])):
            span = browser.find_element(By.CSS_SELECTOR, f'.w[data-side="{side}"][data-word="{word}"]')
            ActionChains(browser).move_to_element(span).perform()
            lit = sorted(int(e.get_attribute("data-word")) for e in
                         browser.find_elements(By.CSS_SELECTOR, f'.w.hl[data-side="{other}"]'))
            pick = (lambda p: p[0]) if other == "src" else (lambda p: p[1])
            mine = (lambda p: p[1]) if other == "src" else (lambda p: p[0])
            assert lit == sorted(pick(p) for p in alignment if mine(p) == word), (side, word, alignment)
            ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
            assert not browser.find_elements(By.CSS_SELECTOR, ".w.hl")
    finally:
        assert server.stop() == 0, server.log.read_text()


def test_the_openapi_docs_render_without_internet(reverse_run, tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    server = Server(tmp_path, "-m", reverse_run)
    try:
        browser.get(f"http://127.0.0.1:{server.port}/docs")
        wait = WebDriverWait(browser, 120)  # a bound on a hung page, not a timing assertion
        wait.until(ready.text_to_be_present_in_element((By.CSS_SELECTOR, ".swagger-ui .info .title"), "mtkit"))
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path"))
        operations = [e.get_attribute("data-path") or e.text for e in
                      browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")]
        assert any("/v1/translate" in p for p in operations), operations
    finally:
        assert server.stop() == 0, server.log.read_text()


def test_the_page_asks_for_alignments_where_the_models_engine_gives_them(browser):
    """The page reads whether a model's engine gives word alignments from /v1/models (never from the
    engine's name): it asks for them, and shows the source words to hover, for a model whose engine gives
    them; for one whose engine gives none it asks for none, and its translation still comes."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
    from test_serve_libretranslate import AligningReverse, Reverse, Running

    from mtkit.serve.models import ServedModel

    server = Running([ServedModel("plain", Reverse(), "en", "de"), ServedModel("aligned", AligningReverse(), "en",
                                                                                "fr")])
    try:
        assert [m["alignments"] for m in server.json("GET", "/v1/models")[1]["models"]] == [False, True]
        browser.get(f"http://127.0.0.1:{server.port}/")
        wait = WebDriverWait(browser, 120)  # a bound on a hung page, not a timing assertion
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#pair option")) == 2)
        browser.find_element(By.ID, "input").send_keys("a b c")
        for name, shown in (("plain", False), ("aligned", True), ("plain", False)):
            Select(browser.find_element(By.ID, "pair")).select_by_value(name)
            browser.execute_script("document.getElementById('status').textContent = ''")
            browser.find_element(By.ID, "go").click()
            wait.until(lambda d: d.find_element(By.ID, "status").text.endswith("ms")
                       or "error" in d.find_element(By.ID, "status").get_attribute("class"))
            status = browser.find_element(By.ID, "status")
            assert "error" not in status.get_attribute("class"), (name, status.text)
            assert browser.find_element(By.ID, "output").text == "c b a"
            assert browser.find_element(By.ID, "source-box").is_displayed() == shown, name
    finally:
        server.stop()


def test_the_files_tab_uploads_a_document_and_links_its_translation(tmp_path, browser):
    """The Files tab (shown as /frontend/settings has filesTranslation) posts the chosen file to
    /translate_file with the pair's languages and links the translated file, which the browser downloads."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from test_serve_files import Serving, reversed_lines
    from test_serve_libretranslate import AligningReverse

    from mtkit.serve.models import ServedModel

    text = "one two three\n\nfour five\n"
    document = tmp_path / "notes.txt"
    document.write_text(text, encoding="utf-8")
    server = Serving([ServedModel("en-de", AligningReverse(), "en", "de")])
    try:
        browser.get(f"http://127.0.0.1:{server.port}/")
        wait = WebDriverWait(browser, 120)  # a bound on a hung page, not a timing assertion
        wait.until(lambda d: d.find_element(By.ID, "tab-files").is_displayed())
        assert ".txt" in browser.find_element(By.ID, "file").get_attribute("accept")
        browser.find_element(By.ID, "tab-files").click()
        assert not browser.find_element(By.ID, "input").is_displayed()
        browser.find_element(By.ID, "file").send_keys(str(document))
        browser.find_element(By.ID, "file-go").click()
        wait.until(lambda d: d.find_element(By.ID, "file-result").is_displayed()
                   or "error" in d.find_element(By.ID, "file-status").get_attribute("class"))
        assert "error" not in browser.find_element(By.ID, "file-status").get_attribute("class"), \
            browser.find_element(By.ID, "file-status").text
        link = browser.find_element(By.ID, "file-link")
        assert (link.text, link.get_attribute("download")) == ("notes_de.txt", "notes_de.txt")
        assert "/download_file/" in link.get_attribute("href")
        got = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0]).then(r => r.text().then(t => done([r.status, t])));", link.get_attribute("href"))
        assert got == [200, reversed_lines(text)]
    finally:
        server.stop()
