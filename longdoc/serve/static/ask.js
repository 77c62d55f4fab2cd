// The ask view: a question, its answers (score, file:line:column, mode), and the document beside
// them with the chosen answer, its supporting sentences and the passages retrieval chose marked.
import {
  el, formatBytes, formatNumber, getJSON, lineColumn, renderMarked, shortcuts, stepThrough,
} from "./common.js";

const $ = (id) => document.getElementById(id);
const texts = new Map(); // file -> {text, extracted_from}
let result = null;
let ready = false;
let folder = ""; // the folder all documents share, left out where a name is shown (kept in titles)

const shown = (file) => (file.startsWith(folder) ? file.slice(folder.length) : file);

function sharedFolder(files) {
  if (files.length < 2) return files.length ? files[0].slice(0, files[0].lastIndexOf("/") + 1) : "";
  let prefix = files[0];
  for (const file of files) while (!file.startsWith(prefix)) prefix = prefix.slice(0, -1);
  return prefix.slice(0, prefix.lastIndexOf("/") + 1);
}

async function documentText(file) {
  if (!texts.has(file)) texts.set(file, await getJSON(`/api/documents/${encodeURIComponent(file)}`));
  return texts.get(file);
}

function showStatus(status) {
  const box = $("index-box");
  $("index-progress").value = status.fraction;
  const failed = status.state === "failed";
  const documents = `document${status.total === 1 ? "" : "s"}`;
  $("index-text").textContent = failed ? `Cannot answer: ${status.error}` : status.state === "ready"
    ? `${status.total} ${documents} indexed; answers are ${status.mode === "span" ? "spans (a reader)" : "sentences (no reader given)"}`
    : `${status.state}: ${status.indexed} of ${status.total} ${documents} indexed (${Math.round(100 * status.fraction)}%)`;
  box.dataset.state = status.state;
  $("documents-count").textContent = status.total;
  folder = sharedFolder(status.documents.map((d) => d.file));
  $("documents").tBodies[0].replaceChildren(...status.documents.map((d) => el("tr", {},
    el("td", { className: "file", title: d.file }, shown(d.file)),
    el("td", { className: "number" }, formatBytes(d.bytes)),
    el("td", { className: "number" }, d.characters.toLocaleString("en")),
    el("td", { className: "number" }, d.passages ?? ""),
    el("td", {}, d.state))));
  ready = status.state === "ready";
  $("ask-button").disabled = !ready;
  $("ask-button").title = ready ? "" : "the documents are being indexed";
}

async function pollStatus() {
  const status = await getJSON("/api/documents");
  showStatus(status);
  if (status.state !== "ready" && status.state !== "failed") setTimeout(pollStatus, 500);
}

function options() {
  const body = { question: $("question").value };
  const number = (id, name, parse) => {
    const value = $(id).value.trim();
    if (value !== "") body[name] = parse(value);
  };
  number("opt-top-k", "top_k", (v) => parseInt(v, 10));
  number("opt-passages", "passages", (v) => parseInt(v, 10));
  number("opt-min-evidence", "min_evidence", Number);
  number("opt-min-score", "min_score", Number);
  number("opt-max-answer-len", "max_answer_len", (v) => parseInt(v, 10));
  body.retrieval = $("opt-retrieval").value;
  body.second_hop = $("opt-second-hop").checked;
  body.read_all = $("opt-read-all").checked;
  body.handle_impossible_answer = $("opt-impossible").checked;
  return body;
}

function where(file, start) {
  const known = texts.get(file);
  if (!known) return shown(file);
  const [line, column] = lineColumn(known.text, start);
  return `${shown(file)}:${line}:${column}${known.extracted_from ? ` (text extracted from ${known.extracted_from})` : ""}`;
}

async function ask(event) {
  event.preventDefault();
  if (!ready) return;
  const note = $("answer-note");
  note.textContent = "Asking…";
  for (const control of $("ask-form").querySelectorAll("[aria-invalid]")) control.removeAttribute("aria-invalid");
  $("ask-button").disabled = true;
  try {
    result = await getJSON("/api/ask", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(options()),
    });
  } catch (error) {
    note.textContent = `Error: ${error.message}`;
    $("answers").replaceChildren();
    const control = document.querySelector(`#ask-form [name="${error.field}"]`);
    if (control) {
      control.setAttribute("aria-invalid", "true");
      if (control.closest("details")) control.closest("details").open = true;
      control.focus();
    }
    return;
  } finally {
    $("ask-button").disabled = !ready;
  }
  await Promise.all([...new Set(result.answers.map((a) => a.file))].map(documentText));
  showAnswers();
}

function showAnswers() {
  const note = $("answer-note");
  const mode = result.mode === "span" ? "span (a reader's answer)" : "sentence (no reader: the nearest sentences)";
  if (!result.answers.length) {
    note.textContent = `No answer found: no sentence read is close enough to the question (evidence `
      + `${formatNumber(result.evidence, 2)}); mode ${mode}.`;
  } else {
    note.textContent = `${result.answers.length} answer${result.answers.length > 1 ? "s" : ""}, mode ${mode}; `
      + `${result.passages.length} passages read.`;
  }
  $("answers").replaceChildren(...result.answers.map((answer, number) => el("li", {},
    el("button", {
      type: "button", "data-file": answer.file, "data-start": answer.start, "data-end": answer.end,
      "aria-current": "false", onclick: () => choose(number),
    },
    el("span", { className: "answer-text" }, answer.text.replace(/\s+/g, " ")),
    el("span", { className: "meta" },
      `score ${formatNumber(answer.score)} · `, el("code", {}, where(answer.file, answer.start)), " · ",
      el("span", { className: "badge" }, result.mode),
      answer.support.length ? ` · ${answer.support.length} supporting sentence${answer.support.length > 1 ? "s" : ""}` : "")))));
  if (result.answers.length) choose(0);
  else if (result.passages.length) showDocument(result.passages[0].file, null);
}

async function choose(number) {
  [...$("answers").querySelectorAll("button")].forEach((button, i) => button.setAttribute("aria-current", String(i === number)));
  const answer = result.answers[number];
  await showDocument(answer.file, number);
}

async function showDocument(file, chosen) {
  const { text } = await documentText(file);
  const marks = result.passages.filter((p) => p.file === file).map((p) => ({
    start: p.start, end: p.end, classes: ["passage"], title: `passage read (retrieval score ${formatNumber(p.score)})`,
  }));
  result.answers.forEach((answer, number) => {
    if (answer.file !== file) return;
    marks.push({ start: answer.start, end: answer.end, classes: number === chosen ? ["answer", "chosen"] : ["answer"],
                 title: `answer ${number + 1} (score ${formatNumber(answer.score)})` });
    if (number === chosen) {
      for (const s of answer.support) marks.push({ start: s.start, end: s.end, classes: ["support"], title: "supporting sentence" });
    }
  });
  $("document-title").textContent = shown(file);
  $("document-title").title = file;
  const container = $("document-text");
  renderMarked(container, text, marks);
  $("ask-legend").replaceChildren(
    el("mark", { className: "answer chosen" }, "the answer shown"), el("mark", { className: "answer" }, "other answers"),
    el("mark", { className: "support" }, "its supporting sentences"), el("mark", { className: "passage" }, "passages read"));
  const target = container.querySelector("mark.chosen") || container.querySelector("mark.passage");
  if (target) target.scrollIntoView({ block: "center" });
}

export async function start(info) {
  $("ask-view").hidden = false;
  $("subtitle").textContent = `${info.documents} documents · ${info.model ? `reader ${info.model}` : "no reader: answers are sentences"}`;
  $("opt-passages").value = info.defaults.passages;
  $("opt-min-evidence").placeholder = "0.5";
  $("ask-form").addEventListener("submit", ask);
  shortcuts({
    "/": () => $("question").focus(),
    j: () => stepThrough($("answers"), 1),
    k: () => stepThrough($("answers"), -1),
    d: () => $("document-text").focus(),
    o: () => { $("options").open = !$("options").open; },
    Escape: (event) => event.target.blur(),
  });
  await pollStatus();
  $("question").focus();
}
