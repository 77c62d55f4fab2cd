"""`longdoc serve --analysis DIR`: the analysis.json of `longdoc analyze attention` and the plots it
lists, served as they are (nothing else from the folder), the page's analysis view in headless
Chromium, and the refusals (a folder without an analysis, an analysis beside documents)."""

import json
import subprocess
import sys

import pytest

from longdoc.analyze.run import AnalysisOptions, analyze_attention
from tests.analyze.folders import text_file, tiny_encoder
from tests.serve.conftest import PHONE, WIDE, overflow, page_errors, request, running, viewport

pytestmark = pytest.mark.slow  # an analysis of a small model, a server, a browser


@pytest.fixture(scope="module")
def analysis_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis")
    out = root / "analysis"
    analyze_attention(AnalysisOptions(model=tiny_encoder(root / "model"), data=text_file(root / "text"), out=out,
                                      progress=False))
    (out / "private.txt").write_text("not to be served", encoding="utf-8")
    return out


def _app(folder):
    from longdoc.serve.analysis import AnalysisFolder
    from longdoc.serve.app import create_app

    return create_app(analysis=AnalysisFolder(folder))


def test_the_api_serves_the_analysis_and_its_plots_only(analysis_folder):
    written = json.loads((analysis_folder / "analysis.json").read_text(encoding="utf-8"))
    with running(_app(analysis_folder)) as base:
        status, info = request(f"{base}/api/info")
        assert status == 200 and info["mode"] == "analysis" and info["plots"] == written["plots"]
        assert request(f"{base}/api/analysis") == (200, written)
        with open(analysis_folder / "overview.png", "rb") as handle:
            png = handle.read()
        import urllib.request

        with urllib.request.urlopen(f"{base}/api/analysis/plots/overview.png") as response:
            assert response.headers["content-type"] == "image/png" and response.read() == png
        for name in ("private.txt", "analysis.json", "..%2Fanalysis.json", "missing.png"):
            status, error = request(f"{base}/api/analysis/plots/{name}")
            assert status == 404, (name, error)


def test_the_page_shows_the_table_and_the_plots(browser, analysis_folder):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    written = json.loads((analysis_folder / "analysis.json").read_text(encoding="utf-8"))
    with running(_app(analysis_folder)) as base:
        for size in (WIDE, PHONE):
            viewport(browser, size)
            browser.get(base)
            WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#analysis-table td"))
            # the table holds the mean of each layer and piece, as analysis.json has it
            entropy = written["statistics"]["normalized_entropy"]["pieces"]
            cells = browser.find_elements(By.CSS_SELECTOR, "#analysis-table tbody tr")
            assert len(cells) == written["model"]["layers"]
            first_l2l = cells[0].find_element(By.CSS_SELECTOR, "td[data-piece=l2l]").text
            assert first_l2l == f"{entropy['l2l'][0]['mean']:.3f}"
            Select(browser.find_element(By.ID, "analysis-piece")).select_by_value("g2l")
            WebDriverWait(browser, 30).until(lambda d: d.execute_script(
                "const img = document.querySelector('#analysis-plot img');"
                "return img && img.complete && img.naturalWidth > 0 && img.src.endsWith('normalized_entropy_g2l.png');"))
            assert browser.execute_script(
                "const img = document.querySelector('#analysis-overview img'); return img.complete && img.naturalWidth")
            Select(browser.find_element(By.ID, "analysis-statistic")).select_by_value("js_divergence")
            heading = browser.find_element(By.CSS_SELECTOR, "#analysis-table thead th").text
            assert heading == "layers"
            assert overflow(browser) == 0, size
            assert page_errors(browser) == []


def test_the_page_says_when_the_carried_share_does_not_apply(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    out = tmp_path / "analysis"
    analyze_attention(AnalysisOptions(model=tiny_encoder(tmp_path / "model", residual_attention=False),
                                      data=text_file(tmp_path / "text"), out=out, plots=False, progress=False))
    with running(_app(out)) as base:
        viewport(browser, WIDE)
        browser.get(base)
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#analysis-table td"))
        Select(browser.find_element(By.ID, "analysis-statistic")).select_by_value("carried_share")
        note = browser.find_element(By.ID, "analysis-note").text
        assert note.startswith("Not applicable:") and "no residual attention" in note
        assert "No plot" in browser.find_element(By.ID, "analysis-overview").text
        assert page_errors(browser) == []


def _fails(*argv) -> str:
    result = subprocess.run([sys.executable, "-m", "longdoc.cli", "serve", *map(str, argv)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    return result.stderr


def test_bad_command_lines_are_refused_with_one_line(analysis_folder, tmp_path):
    assert f"--analysis {tmp_path}: no analysis.json" in _fails("--analysis", tmp_path, "--port", "0")
    assert "leave out DOCS" in _fails("--analysis", analysis_folder, tmp_path)
