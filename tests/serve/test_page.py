"""The page as a person uses it, in headless Chromium: asking with the keyboard alone, the answer
marked in the document at its exact offsets (an emoji before it, which JavaScript counts twice),
the prediction browser's marked supporting facts against the gold file, at 1280x800 and on a
phone-sized window with nothing overflowing sideways. Screenshots of both views on the HotpotQA
sample go to $LONGDOC_SCREENSHOTS (docs/ takes them from there) or the test's folder."""

import json
from pathlib import Path

import pytest

from tests.ask.conftest import lifted_reader  # noqa: F401  (a random QA reader, lifted: arbitrary answers, exact offsets)
from tests.serve.conftest import (
    PHONE, WIDE, held_service, overflow, page_errors, request, running, screenshot, viewport, wait_ready,
)
from tests.tasks.predictions import MAKERS, prediction_files

pytestmark = pytest.mark.slow  # a browser, MiniLM and an index

# The marks' own offsets (code points, as the API counts), adjacent pieces joined.
MARKED = """
const ranges = [];
for (const piece of arguments[0].querySelectorAll(arguments[1])) {
  const [start, end] = [Number(piece.dataset.start), Number(piece.dataset.end)];
  if (ranges.length && ranges[ranges.length - 1][1] === start) ranges[ranges.length - 1][1] = end;
  else ranges.push([start, end]);
}
return ranges;
"""


def _merged(ranges) -> list[list[int]]:
    merged = []
    for start, end in sorted(ranges):  # facts given twice are one sentence
        if merged and merged[-1][1] == start:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return merged


def _wait(driver, condition, timeout: float = 120):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: condition(d))


def _keys(driver, *keys) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(*keys).perform()


def _by_id(driver, name):
    return driver.find_element("id", name)


def _open_ask_page(driver, base: str, size) -> None:
    viewport(driver, size)
    driver.get(base + "/")
    _wait(driver, lambda d: not _by_id(d, "ask-button").get_attribute("disabled"))
    # the page focuses the question box last, after its status arrives: keys sent before then land elsewhere
    _wait(driver, lambda d: d.switch_to.active_element == _by_id(d, "question"))
    page_errors(driver)


def _ask_with_the_keyboard(driver, question: str) -> list:
    from selenium.webdriver.common.keys import Keys

    _by_id(driver, "document-title").click()  # nothing focused that takes text
    _keys(driver, "/")
    assert driver.switch_to.active_element == _by_id(driver, "question")
    _keys(driver, question, Keys.ENTER)
    return _wait(driver, lambda d: d.find_elements("css selector", "#answers button"))


def _chosen(driver) -> tuple[list, str]:
    container = _by_id(driver, "document-text")
    text = "".join(piece.get_attribute("textContent") for piece in container.find_elements("css selector", "mark.chosen"))
    return driver.execute_script(MARKED, container, "mark.chosen"), text


def _in_view(driver, selector: str, scroller: str) -> bool:
    return driver.execute_script("""
        const mark = document.querySelector(arguments[0]).getBoundingClientRect();
        const box = document.querySelector(arguments[1]).getBoundingClientRect();
        return mark.top >= box.top - 1 && mark.bottom <= box.bottom + 1 && mark.bottom <= innerHeight;""",
                                 selector, scroller)


def test_the_answer_is_marked_at_its_offsets_and_keys_move_through_the_answers(browser, ask_server, ask_documents):
    _open_ask_page(browser, ask_server, WIDE)
    buttons = _ask_with_the_keyboard(browser, "Where was Mara Quell born?")
    first = buttons[0]
    file, start, end = first.get_attribute("data-file"), int(first.get_attribute("data-start")), int(first.get_attribute("data-end"))
    contents = Path(file).read_text(encoding="utf-8")
    assert "🌉" in contents[:start]  # the offsets count it once; the page must too
    ranges, marked = _chosen(browser)
    assert ranges == [[start, end]] and marked == contents[start:end] == "Mara Quell was born in Tallinnford."
    assert first.find_element("css selector", ".answer-text").text == marked
    assert _by_id(browser, "document-text").get_attribute("textContent") == contents
    assert f"{Path(file).name}:3:1" in first.text and "sentence" in first.text  # file:line:column, the mode
    assert _in_view(browser, "#document-text mark.chosen", "#document-text")
    # j: the next answer, shown and marked in its own document
    _by_id(browser, "document-title").click()
    _keys(browser, "j")
    second = browser.find_elements("css selector", "#answers button")[1]
    _wait(browser, lambda d: second.get_attribute("aria-current") == "true")
    _wait(browser, lambda d: _by_id(d, "document-title").get_attribute("title") == second.get_attribute("data-file"))
    second_range = [int(second.get_attribute("data-start")), int(second.get_attribute("data-end"))]
    assert _chosen(browser)[0] == [second_range] and browser.switch_to.active_element == second
    assert page_errors(browser) == []


def test_the_options_are_controls_and_no_answer_is_said(browser, ask_server):
    from selenium.webdriver.common.keys import Keys

    _open_ask_page(browser, ask_server, WIDE)  # the question box has the focus: Esc leaves it, o opens the options
    _keys(browser, Keys.ESCAPE, "o")
    assert _by_id(browser, "options").get_attribute("open") is not None
    for name, value in (("opt-passages", "2"), ("opt-min-evidence", "0.99")):
        _by_id(browser, name).clear()
        _by_id(browser, name).send_keys(value)
    _by_id(browser, "question").send_keys("Who sells lamps?\n")
    _wait(browser, lambda d: "No answer found" in _by_id(d, "answer-note").text)
    assert browser.find_elements("css selector", "#answers button") == []
    _by_id(browser, "opt-min-evidence").clear()
    _by_id(browser, "question").send_keys("\n")
    _wait(browser, lambda d: "2 passages read" in _by_id(d, "answer-note").text)
    assert len(browser.find_elements("css selector", "#document-text mark.passage")) >= 1


def test_the_ask_view_on_the_hotpotqa_sample_fits_both_windows(browser, ask_server, ask_documents, tmp_path):
    record = ask_documents.records[4]  # "The director of the romantic comedy "Big Stone Gap" is based in ..."
    for size, name in ((WIDE, "serve-ask"), (PHONE, "serve-ask-phone")):
        _open_ask_page(browser, ask_server, size)
        _ask_with_the_keyboard(browser, record["question"])
        ranges, marked = _chosen(browser)
        assert marked and len(ranges) == 1
        assert overflow(browser) == 0
        assert _in_view(browser, "#document-text mark.chosen", "#document-text")
        screenshot(browser, name, tmp_path)
    listed = browser.find_elements("css selector", "#documents tbody tr")
    assert len(listed) == len(request(f"{ask_server}/api/documents")[1]["documents"]) and all(row.get_attribute("textContent").endswith("indexed") for row in listed)
    assert page_errors(browser) == []


def test_indexing_progress_is_shown_and_asking_waits_for_it(browser, ask_documents):
    from longdoc.serve.app import create_app

    service, gate = held_service([ask_documents.served[1]])
    with running(create_app(asking=service)) as base:
        viewport(browser, WIDE)
        browser.get(base + "/")
        _wait(browser, lambda d: "indexing: 0 of 1 document indexed (0%)" in _by_id(d, "index-text").text)
        assert _by_id(browser, "ask-button").get_attribute("disabled") is not None
        # Read in one script: while indexing, the page rebuilds the table's rows at each status poll,
        # so an element found by one call can be gone by the next.
        assert browser.execute_script(
            "return document.querySelector('#documents tbody td:last-child').textContent") == "waiting"
        gate.set()
        _wait(browser, lambda d: not _by_id(d, "ask-button").get_attribute("disabled"))
        assert "1 document indexed" in _by_id(browser, "index-text").text
        assert _by_id(browser, "index-progress").get_attribute("value") == "1"
    service.close()


def test_span_mode_marks_the_readers_span_and_its_sentence(browser, lifted_reader, ask_documents):
    from longdoc.serve.app import create_app
    from longdoc.ask.documents import load_sources
    from longdoc.serve.asking import AskService

    sources, _ = load_sources([ask_documents.served[0]])
    service = AskService(sources, lifted_reader / "lifted")
    with running(create_app(asking=service)) as base:
        wait_ready(base)
        from selenium.webdriver.common.keys import Keys

        _open_ask_page(browser, base, WIDE)
        _keys(browser, Keys.ESCAPE, "o")
        _wait(browser, lambda d: _by_id(d, "opt-min-evidence").is_displayed(), timeout=10)  # the panel opened
        _by_id(browser, "opt-min-evidence").send_keys("-1")
        first = _ask_with_the_keyboard(browser, "Where was Mara Quell born?")[0]
        assert "span" in first.text
        start, end = int(first.get_attribute("data-start")), int(first.get_attribute("data-end"))
        contents = Path(first.get_attribute("data-file")).read_text(encoding="utf-8")
        ranges, marked = _chosen(browser)
        assert ranges == [[start, end]] and marked == contents[start:end]
        support = browser.execute_script(MARKED, _by_id(browser, "document-text"), "mark.support")
        assert support and support[0][0] <= start and end <= support[-1][1]  # the sentence(s) it lies in
        assert page_errors(browser) == []
    service.close()


def _browse(task, shared_data, tmp_path):
    from longdoc.serve.app import create_app
    from longdoc.serve.browser import PredictionBrowser
    from longdoc.tasks import REGISTRY

    gold, preds, options = prediction_files(task, shared_data, tmp_path)
    return gold, preds, create_app(browser=PredictionBrowser(REGISTRY, task, gold, preds, options,
                                                                           allow_missing=True))


def test_an_examples_supporting_facts_are_marked_as_in_the_gold_file(browser, shared_data, tmp_path):
    gold, preds, app = _browse("hotpotqa", shared_data, tmp_path)
    records = json.loads(gold.read_text(encoding="utf-8"))
    predicted = json.loads(preds[0].read_text(encoding="utf-8"))
    with running(app) as base:
        info = request(f"{base}/api/info")[1]
        for size, name in ((WIDE, "serve-browse"), (PHONE, "serve-browse-phone")):
            viewport(browser, size)
            browser.get(base + "/")
            _wait(browser, lambda d: d.find_elements("css selector", "#examples button"))
            page_errors(browser)
            # keyboard: / to the search box, type, Esc, j opens the first example found
            _keys(browser, "/")
            _keys(browser, "Derrickson")
            _wait(browser, lambda d: len(d.find_elements("css selector", "#examples button")) == 1)
            from selenium.webdriver.common.keys import Keys
            _keys(browser, Keys.ESCAPE, "j")
            record = next(r for r in records if "Derrickson" in r["question"])
            _wait(browser, lambda d: record["question"] in _by_id(d, "example").text)
            blocks = browser.find_elements("css selector", "#example .text")
            assert len(blocks) == len(record["context"])
            for block, (title, sentences) in zip(blocks, record["context"]):
                assert block.get_attribute("textContent") == "".join(sentences)
                starts = [sum(map(len, sentences[:i])) for i in range(len(sentences))]

                def sentences_of(facts):
                    return _merged({(starts[i], starts[i] + len(sentences[i])) for t, i in facts
                                    if t == title and isinstance(i, int) and 0 <= i < len(sentences)})

                gold_marked = browser.execute_script(MARKED, block, "mark.o-gold.k-support")
                assert gold_marked == sentences_of(record["supporting_facts"])
                assert browser.execute_script(MARKED, block, "mark.o-run-1.k-support") == gold_marked  # the perfect run
                assert browser.execute_script(MARKED, block, "mark.o-run-0.k-support") == \
                    sentences_of(predicted["sp"][record["_id"]])
            assert overflow(browser) == 0
            screenshot(browser, name, tmp_path)
        # the totals shown are the official ones (`longdoc evaluate`'s, pinned in test_browse_api)
        shown = {row.get_attribute("data-metric"): [cell.text for cell in row.find_elements("css selector", "td")][:2]
                 for row in browser.find_elements("css selector", "#totals tbody tr")}
        assert shown["joint_f1"] == [f"{info['runs'][0]['totals']['joint_f1']:.4f}", "1"]
        assert page_errors(browser) == []


def test_filters_and_sorting(browser, shared_data, tmp_path):
    from selenium.webdriver.support.select import Select

    gold, preds, app = _browse("hotpotqa", shared_data, tmp_path)
    with running(app) as base:
        rows = request(f"{base}/api/examples")[1]["examples"]
        viewport(browser, WIDE)
        browser.get(base + "/")
        _wait(browser, lambda d: d.find_elements("css selector", "#examples button"))
        listed = lambda: [b.get_attribute("data-id") for b in browser.find_elements("css selector", "#examples button")]  # noqa: E731
        Select(_by_id(browser, "filter-right")).select_by_visible_text("A wrong")
        assert listed() == [r["id"] for r in rows if r["runs"][0]["right"] is False]
        Select(_by_id(browser, "filter-right")).select_by_visible_text("all")
        Select(_by_id(browser, "facet-type")).select_by_visible_text("comparison")
        assert listed() == [r["id"] for r in rows if r["facets"]["type"] == "comparison"]
        Select(_by_id(browser, "facet-type")).select_by_visible_text("any")
        Select(_by_id(browser, "range-metric")).select_by_visible_text("sp_f1")
        _by_id(browser, "range-max").send_keys("0.5")
        assert listed() == [r["id"] for r in rows if r["runs"][0]["metrics"]["sp_f1"] <= 0.5]
        _by_id(browser, "range-max").clear()
        Select(_by_id(browser, "sort")).select_by_visible_text("metric of A, low first")
        ordered = [r["id"] for r in sorted(rows, key=lambda r: r["runs"][0]["metrics"]["sp_f1"])]
        assert listed() == ordered


@pytest.mark.parametrize("task", [task for task in MAKERS if task != "hotpotqa"])
def test_every_tasks_example_shows_its_marks_and_fits(browser, task, shared_data, tmp_path):
    gold, preds, app = _browse(task, shared_data, tmp_path)
    with running(app) as base:
        first = request(f"{base}/api/examples")[1]["examples"][-1]["id"]
        for size in (WIDE, PHONE):
            viewport(browser, size)
            browser.get(f"{base}/#example={_quoted(first)}")
            _wait(browser, lambda d: d.find_elements("css selector", "#example .text"))
            assert browser.find_elements("css selector", "#example mark.o-gold")
            assert browser.find_elements("css selector", "#example .legend mark")
            assert overflow(browser) == 0
        assert page_errors(browser) == []


def _quoted(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def test_wikihop_candidates_show_the_models_probabilities(browser, scored_predictions, shared_data, tmp_path):
    from longdoc.data.prediction_scores import scores_path
    from longdoc.serve.app import create_app
    from longdoc.serve.browser import PredictionBrowser
    from longdoc.tasks import REGISTRY

    gold, pred = scored_predictions["wikihop"]
    _, (_, perfect), _ = prediction_files("wikihop", shared_data, tmp_path)  # run B: no scores side file
    answers = json.loads(pred.read_text(encoding="utf-8"))
    truth = {record["id"]: record["answer"] for record in json.loads(gold.read_text(encoding="utf-8"))}
    records = [json.loads(line) for line in scores_path(pred).read_text(encoding="utf-8").splitlines()[1:]]
    # A question the model gets wrong (the gold is not the top row), with about six candidates (the screenshot).
    record = min((r for r in records if answers[r["id"]] != truth[r["id"]]), key=lambda r: abs(len(r["candidates"]) - 6))
    probabilities = {c["text"]: c["probability"] for c in record["candidates"]}
    app = create_app(browser=PredictionBrowser(REGISTRY, "wikihop", gold, [pred, perfect]))
    with running(app) as base:
        for size in (WIDE, PHONE):
            viewport(browser, size)
            browser.get(f"{base}/#example={_quoted(record['id'])}")
            _wait(browser, lambda d: d.find_elements("css selector", "#example meter"))
            rows = browser.find_elements("css selector", "#example section table tbody tr")
            shown = [(row.find_element("css selector", "td").text,
                      float(row.find_element("css selector", "meter").get_attribute("value"))) for row in rows]
            assert [text for text, _ in shown] == sorted(probabilities, key=lambda text: -probabilities[text])
            assert all(value == pytest.approx(probabilities[text], abs=5e-5) for text, value in shown)
            assert [row.find_element("css selector", "td").text for row in rows
                    if "gold-row" in row.get_attribute("class")] == [truth[record["id"]]]
            runs = _by_id(browser, "example").find_element("css selector", "table.runs").text
            assert f"{answers[record['id']]} {probabilities[answers[record['id']]]:.1%}" in runs
            assert f"no scores: no {perfect.name}.scores.jsonl beside {perfect.name}" in runs
            assert overflow(browser) == 0
            if size == WIDE:
                screenshot(browser, "serve-browse-scores", tmp_path)
        assert page_errors(browser) == []
