// The prediction browser: totals per run (the official metric), the examples filtered, sorted and
// searched, one example in full with the gold's and runs A and B's marks, the leaderboard.
import { el, formatNumber, getJSON, renderMarked, shortcuts, stepThrough } from "./common.js";

const $ = (id) => document.getElementById(id);
const PAGE = 200;
// Marks that point at an answer are drawn strongly; those that cover a region (a supporting sentence,
// a long answer) lightly; other candidates' mentions faintly.
const STRONG = new Set(["answer", "short answer", "keyphrase"]);
const FAINT = new Set(["candidate"]);
let info = null;
let rows = [];
let shown = PAGE;
let current = null;
let shownRuns = null;

const slug = (text) => text.toLowerCase().replace(/[^a-z0-9]+/g, "-");
const runA = () => Number($("run-a").value);
const runB = () => ($("run-b").value === "" ? null : Number($("run-b").value));
const runName = (run) => info.runs[run].name;

function verdict(result) {
  if (result.right === null) return el("span", { className: "wrong" }, "no prediction");
  return el("span", { className: result.right ? "right" : "wrong" }, result.right ? "right" : "wrong");
}

function showTotals() {
  const a = runA();
  const b = runB();
  const keys = Object.keys(info.runs[a].totals);
  const head = el("tr", {}, el("th", { scope: "col" }, "metric"), el("th", { scope: "col", className: "number", title: runName(a) }, "A"),
    b === null ? null : el("th", { scope: "col", className: "number", title: runName(b) }, "B"),
    b === null ? null : el("th", { scope: "col", className: "number" }, "B − A"));
  $("totals").replaceChildren(el("thead", {}, head), el("tbody", {}, keys.map((key) => el("tr", { "data-metric": key },
    el("th", { scope: "row" }, key === info.headline_metric ? `${key} (headline)` : key),
    el("td", { className: "number", "data-run": a }, formatNumber(info.runs[a].totals[key], 4)),
    b === null ? null : el("td", { className: "number", "data-run": b }, formatNumber(info.runs[b].totals[key], 4)),
    b === null ? null : el("td", { className: "number" }, formatNumber(info.runs[b].totals[key] - info.runs[a].totals[key], 4))))));
  const notes = [a, b].filter((run) => run !== null).flatMap((run) => info.runs[run].notes.map((n) => `${runName(run)}: ${n}`));
  $("run-notes").replaceChildren(...notes.map((n) => el("li", {}, n)));
}

function rightOptions() {
  const choices = [["", "all"], ["a-right", "A right"], ["a-wrong", "A wrong"], ["a-none", "A: no prediction"]];
  if (runB() !== null) {
    choices.push(["a-right-b-wrong", "A right, B wrong"], ["a-wrong-b-right", "A wrong, B right"],
      ["differ", "A and B differ (right or wrong)"], ["other-prediction", "A and B predict differently"]);
  }
  const chosen = $("filter-right").value;
  $("filter-right").replaceChildren(...choices.map(([value, label]) => el("option", { value }, label)));
  $("filter-right").value = choices.some(([value]) => value === chosen) ? chosen : "";
  $("filter-right").title = `right: ${info.right_means}`;
  const sortChoices = [["gold", "gold order"], ["a-up", "metric of A, low first"], ["a-down", "metric of A, high first"]];
  if (runB() !== null) sortChoices.push(["diff-up", "B − A, B worst first"], ["diff-down", "B − A, B best first"]);
  const sorted = $("sort").value;
  $("sort").replaceChildren(...sortChoices.map(([value, label]) => el("option", { value }, label)));
  $("sort").value = sortChoices.some(([value]) => value === sorted) ? sorted : "gold";
}

function keep(row) {
  const a = row.runs[runA()];
  const b = runB() === null ? null : row.runs[runB()];
  const query = $("search").value.trim().toLowerCase();
  if (query && ![row.id, row.question, row.gold, a.prediction].some((t) => t.toLowerCase().includes(query))) return false;
  const right = $("filter-right").value;
  const tests = {
    "a-right": () => a.right === true, "a-wrong": () => a.right === false, "a-none": () => a.right === null,
    "a-right-b-wrong": () => a.right === true && b.right === false, "a-wrong-b-right": () => a.right === false && b.right === true,
    differ: () => a.right !== b.right, "other-prediction": () => a.prediction !== b.prediction,
  };
  if (right && !tests[right]()) return false;
  for (const select of $("facets").querySelectorAll("select")) {
    if (select.value && row.facets[select.dataset.facet] !== select.value) return false;
  }
  const metric = $("range-metric").value;
  const low = $("range-min").value;
  const high = $("range-max").value;
  if (low !== "" && a.metrics[metric] < Number(low)) return false;
  if (high !== "" && a.metrics[metric] > Number(high)) return false;
  return true;
}

function ordered(found) {
  const metric = $("range-metric").value;
  const a = runA();
  const b = runB();
  const keys = {
    "a-up": (row) => row.runs[a].metrics[metric], "a-down": (row) => -row.runs[a].metrics[metric],
    "diff-up": (row) => row.runs[b].metrics[metric] - row.runs[a].metrics[metric],
    "diff-down": (row) => row.runs[a].metrics[metric] - row.runs[b].metrics[metric],
  };
  const key = keys[$("sort").value];
  return key ? [...found].sort((x, y) => key(x) - key(y)) : found;
}

function showSubset(found) {
  const runs = [runA(), runB()].filter((run) => run !== null);
  const rights = runs.map((run) => found.filter((row) => row.runs[run].right === true).length);
  $("count").textContent = `${found.length} of ${rows.length} examples; right (${info.right_means}): `
    + runs.map((run, i) => `${i ? "B" : "A"} ${rights[i]}`).join(", ");
  if (!info.totals_are_means || !found.length) { $("subset").replaceChildren(); return; }
  const mean = (run, key) => found.reduce((sum, row) => sum + row.runs[run].metrics[key], 0) / found.length;
  $("subset").replaceChildren(
    el("caption", { className: "note" }, "Means over the examples shown"),
    el("tr", {}, el("th", { scope: "col" }, ""), ...info.metric_keys.slice(0, 6).map((k) => el("th", { scope: "col", className: "number" }, k))),
    ...runs.map((run, i) => el("tr", {}, el("th", { scope: "row" }, i ? "B" : "A"),
      ...info.metric_keys.slice(0, 6).map((k) => el("td", { className: "number" }, formatNumber(mean(run, k)))))));
}

function showList() {
  const found = ordered(rows.filter(keep));
  showSubset(found);
  const metric = $("range-metric").value;
  const runs = [runA(), runB()].filter((run) => run !== null);
  $("examples").replaceChildren(...found.slice(0, shown).map((row) => el("li", {}, el("button", {
    type: "button", "data-id": row.id, "aria-current": String(row.id === current),
    onclick: () => { location.hash = route({ example: row.id }); },
  },
  el("span", { className: "answer-text" }, row.question || row.id),
  el("span", { className: "meta" }, `gold: ${row.gold}`),
  ...runs.map((run, i) => el("span", { className: "meta" }, `${i ? "B" : "A"}: `, verdict(row.runs[run]),
    ` ${metric} ${formatNumber(row.runs[run].metrics[metric])} · ${row.runs[run].prediction || "—"}`))))));
  $("more").hidden = found.length <= shown;
}

function route(change = {}) {
  const state = { example: current, a: runA(), b: runB(), ...change };
  const parts = [];
  if (state.example !== null && state.example !== undefined) parts.push(`example=${encodeURIComponent(state.example)}`);
  parts.push(`a=${state.a}`);
  if (state.b !== null) parts.push(`b=${state.b}`);
  return `#${parts.join("&")}`;
}

function markClasses(mark, slots) {
  const owner = mark.run === null ? "g" : `r${slots.indexOf(mark.run)}`;
  const strength = FAINT.has(mark.kind) ? "faint" : STRONG.has(mark.kind) ? "strong" : "region";
  return [`${owner}-${strength}`, `k-${slug(mark.kind)}`, mark.run === null ? "o-gold" : `o-run-${mark.run}`];
}

function markTitle(mark) {
  const owner = mark.run === null ? "gold" : runName(mark.run);
  return `${owner}: ${mark.kind}${mark.note ? ` (${mark.note})` : ""}`;
}

function legend(example, slots) {
  const seen = new Map();
  for (const block of example.texts) {
    for (const mark of block.marks) {
      if (mark.run !== null && !slots.includes(mark.run)) continue;
      const key = `${mark.run}|${mark.kind}`;
      if (!seen.has(key)) seen.set(key, el("mark", { className: markClasses(mark, slots).join(" ") },
        `${mark.run === null ? "gold" : `${slots.indexOf(mark.run) ? "B" : "A"} (${runName(mark.run)})`} ${mark.kind}`));
    }
  }
  return el("div", { className: "legend", "aria-label": "What the marks mean" }, ...seen.values());
}

// A probability column's cell: a bar (a <meter>, which screen readers read as a value) and the number.
function tableCell(text, bar) {
  if (!bar || text === "") return el("td", {}, text);
  const value = Number(text);
  return el("td", { className: "bar-cell number" },
    el("meter", { min: 0, max: 1, value, "aria-label": `probability ${formatNumber(value)}` }), ` ${formatNumber(value)}`);
}

async function showExample(id) {
  const article = $("example");
  let example;
  try {
    example = await getJSON(`/api/examples/${encodeURIComponent(id)}`);
  } catch (error) {
    article.replaceChildren(el("p", { className: "wrong" }, error.message));
    return;
  }
  current = id;
  for (const button of $("examples").querySelectorAll("button")) button.setAttribute("aria-current", String(button.dataset.id === id));
  const slots = [runA(), runB()].filter((run) => run !== null);
  const runHeads = slots.map((run, i) => el("th", { scope: "col" }, `${i ? "B" : "A"}: ${runName(run)}`));
  const labels = [...new Set(slots.flatMap((run) => example.run_fields[run].map(([label]) => label)))];
  const value = (run, label) => (example.run_fields[run].find(([l]) => l === label) || ["", ""])[1];
  const runTable = el("table", { className: "runs" },
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, ""), ...runHeads)),
    el("tbody", {},
      el("tr", {}, el("th", { scope: "row" }, "right"), ...slots.map((run) => el("td", {}, verdict(example.runs[run])))),
      labels.map((label) => el("tr", {}, el("th", { scope: "row" }, label), ...slots.map((run) => el("td", {}, value(run, label)))))));
  // The example's figures: one row per run, one column per figure.
  const figures = el("table", { className: "figures" },
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, ""), info.metric_keys.map((key) => el("th", { scope: "col", className: "number" }, key)))),
    el("tbody", {}, slots.map((run, i) => el("tr", { "data-run": run }, el("th", { scope: "row" }, i ? "B" : "A"),
      info.metric_keys.map((key) => el("td", { className: "number", "data-metric": key }, formatNumber(example.runs[run].metrics[key])))))));
  // A row whose "gold" column says so is the gold's (its first cell in bold).
  const goldRow = (table, cells) => cells[table.columns.indexOf("gold")] === "gold";
  const tables = example.tables.map((table) => el("section", {}, el("h3", {}, table.title), el("div", { className: "table-scroll" },
    el("table", {}, el("thead", {}, el("tr", {}, table.columns.map((c) => el("th", { scope: "col" }, c)))),
      el("tbody", {}, table.rows.map((cells) => el("tr", { className: goldRow(table, cells) ? "gold-row" : null },
        cells.map((c, column) => tableCell(c, table.bars.includes(column))))))))));
  const blocks = example.texts.map((block, number) => {
    const text = el("div", { className: "text", "data-block": number, tabindex: "0", "aria-label": block.title });
    renderMarked(text, block.text, block.marks.filter((m) => m.run === null || slots.includes(m.run))
      .map((m) => ({ start: m.start, end: m.end, classes: markClasses(m, slots), title: markTitle(m) })));
    return el("section", { className: "block" }, el("h3", {}, block.title), text);
  });
  article.replaceChildren(
    el("h2", {}, example.question || example.id),
    el("p", { className: "meta" }, `id ${example.id} · `, Object.entries(example.facets).map(([k, v]) => `${k}: ${v}`).join(" · ")),
    el("h3", {}, "Gold"),
    el("dl", { className: "fields" }, example.fields.map(([label, text]) => [el("dt", {}, label), el("dd", {}, text)])),
    el("h3", {}, "Predictions"), el("div", { className: "table-scroll" }, runTable),
    el("div", { className: "table-scroll" }, figures),
    ...tables, legend(example, slots), ...blocks);
  // Side by side (a wide window): the first gold mark in sight, moving the example as little as
  // needed (its head stays in view when the mark is near it; a long NQ page scrolls to its long
  // answer). One column (a phone): the example's head, below the list.
  if (!matchMedia("(min-width: 900px)").matches) { article.scrollIntoView({ block: "start" }); return; }
  article.parentElement.scrollTop = 0;
  const target = article.querySelector("mark.g-strong, mark.g-region, mark");
  if (target) target.scrollIntoView({ block: "nearest" });
}

function showLeaderboard() {
  const board = info.leaderboard;
  if (!board) return;
  $("leaderboard-box").hidden = false;
  const columns = board.columns;
  $("leaderboard").replaceChildren(...board.groups.map((group) => el("section", {}, el("h3", {}, group.title),
    el("table", {}, el("thead", {}, el("tr", {}, ["rank", "model", "split", ...columns, "date"].map((c) => el("th", { scope: "col" }, c)))),
      el("tbody", {}, group.rows.map((row) => el("tr", {},
        el("td", {}, row.rank ?? ""),
        el("td", {}, row.run === null || row.run === undefined
          ? `${row.model}${row.reference ? " [reference]" : ""}`
          : el("a", { href: route({ a: row.run, example: null }) }, row.model)),
        el("td", {}, row.split ?? ""),
        ...columns.map((c) => el("td", { className: "number" }, formatNumber(row.metrics[c], 4))),
        el("td", {}, row.date ?? ""))))))));
}

// The address says which example and runs are shown (#example=ID&a=0&b=1): links, the back button
// and the run selectors all go through it.
async function follow() {
  const params = new URLSearchParams(location.hash.slice(1));
  const a = params.get("a") ?? $("run-a").value;
  const b = params.has("a") ? params.get("b") ?? "" : $("run-b").value;
  if (info.runs[Number(a)]) $("run-a").value = a;
  if (b === "" || info.runs[Number(b)]) $("run-b").value = b;
  const runs = `${runA()}|${runB()}`;
  const changed = runs !== shownRuns;
  shownRuns = runs;
  if (changed) { rightOptions(); showTotals(); showList(); }
  const id = params.get("example");
  if (id !== null && (id !== current || changed)) await showExample(id);
}

export async function start(started) {
  info = started;
  $("browse-view").hidden = false;
  $("subtitle").textContent = `${info.task} · ${info.gold.split("/").pop()} · ${info.examples} examples`;
  $("subtitle").title = info.gold;
  const runOptions = info.runs.map((run, number) => el("option", { value: number }, `${number + 1}. ${run.name}`));
  $("run-a").replaceChildren(...runOptions);
  $("run-b").replaceChildren(el("option", { value: "" }, "none"), ...runOptions.map((o) => o.cloneNode(true)));
  if (info.runs.length > 1) $("run-b").value = "1";
  $("range-metric").replaceChildren(...info.metric_keys.map((key) => el("option", { value: key }, key)));
  $("facets").replaceChildren(...Object.entries(info.facets).flatMap(([name, values]) => {
    const id = `facet-${slug(name)}`;
    return [el("label", { for: id }, name), el("select", { id, "data-facet": name },
      el("option", { value: "" }, "any"), values.map((v) => el("option", { value: v }, v)))];
  }));
  rows = (await getJSON("/api/examples")).examples;
  showLeaderboard();
  const relist = () => { shown = PAGE; showList(); };
  $("filters").addEventListener("input", relist);
  $("filters").addEventListener("change", relist);
  $("filters").addEventListener("submit", (event) => event.preventDefault());
  for (const id of ["run-a", "run-b"]) {
    $(id).addEventListener("change", () => { location.hash = route(); });
  }
  $("more").addEventListener("click", () => { shown += PAGE; showList(); });
  window.addEventListener("hashchange", follow);
  shortcuts({
    "/": () => $("search").focus(),
    j: () => stepThrough($("examples"), 1),
    k: () => stepThrough($("examples"), -1),
    d: () => { const text = $("example").querySelector(".text"); if (text) text.focus(); },
    o: () => { $("filters-box").open = !$("filters-box").open; },
    Escape: (event) => event.target.blur(),
  });
  await follow();
}
