// An attention analysis (`longdoc analyze attention`): the model and the data, a statistic's mean per
// layer for each attention piece (all heads and queries pooled), its per-head plot and the overview.
import { el, formatNumber, getJSON, shortcuts } from "./common.js";

const $ = (id) => document.getElementById(id);
let info = null;
let analysis = null;

const place = (entry) => (entry.layer !== undefined ? String(entry.layer) : `${entry.layers[0]}–${entry.layers[1]}`);

function showFields() {
  const { model, data } = analysis;
  const residual = model.residual_attention ? (model.residual_attention_mean ? "on (running mean)" : "on") : "off";
  const fields = [
    ["model", model.path], ["kind", model.kind],
    ["shape", `${model.layers} layers × ${model.heads} heads of ${model.head_size}, radius ${model.local_radius}`],
    ["residual attention", residual], ["talking heads", model.talking_heads ? "on" : "off"],
    ["computed with", `${model.attention_backend} attention, ${model.device}, ${model.dtype}`],
    ["data", data.task ? `${data.path} (${data.task})` : `${data.path} (plain text)`],
    ["inputs", `${data.inputs} (${data.long_tokens} long, ${data.global_tokens} global tokens)`],
    ["created", analysis.created],
  ];
  $("analysis-fields").replaceChildren(...fields.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
}

function plotFigure(file, caption) {
  if (!info.plots.includes(file)) return el("p", { className: "note" }, `No plot ${file}: analysis.json holds the figures.`);
  return el("figure", {}, el("img", { src: `/api/analysis/plots/${encodeURIComponent(file)}`, alt: caption }),
    el("figcaption", { className: "note" }, caption));
}

function showStatistic() {
  const name = $("analysis-statistic").value;
  const statistic = analysis.statistics[name];
  const chosenPiece = $("analysis-piece").value;
  if (!statistic.applicable) {
    $("analysis-note").textContent = `Not applicable: ${statistic.reason}`;
    $("analysis-table").replaceChildren();
    $("analysis-piece").replaceChildren();
    $("analysis-plot").replaceChildren();
    return;
  }
  $("analysis-note").textContent = `${statistic.description} (${statistic.unit}); mean over all heads and queries.`;
  const pieces = Object.keys(statistic.pieces);
  const places = statistic.pieces[pieces[0]].map(place);
  const head = el("tr", {}, el("th", { scope: "col" }, statistic.pieces[pieces[0]][0].layer !== undefined ? "layer" : "layers"),
    pieces.map((piece) => el("th", { scope: "col", className: "number" }, piece)));
  const body = places.map((where, row) => el("tr", {}, el("th", { scope: "row" }, where),
    pieces.map((piece) => {
      const entry = statistic.pieces[piece][row];
      return el("td", { className: "number", "data-piece": piece }, entry && entry.values ? formatNumber(entry.mean, 3) : "–");
    })));
  $("analysis-table").replaceChildren(el("thead", {}, head), el("tbody", {}, body));
  $("analysis-piece").replaceChildren(...pieces.map((piece) => el("option", { value: piece }, piece)));
  $("analysis-piece").value = pieces.includes(chosenPiece) ? chosenPiece : pieces[0];
  showPlot();
}

function showPlot() {
  const name = $("analysis-statistic").value;
  const piece = $("analysis-piece").value;
  $("analysis-plot").replaceChildren(plotFigure(`${name}_${piece}.png`,
    `${name.replaceAll("_", " ")} on ${piece}: one panel per layer, one box per head (median, quartiles, 5th–95th percentiles)`));
}

export async function start(started) {
  info = started;
  $("analysis-view").hidden = false;
  $("subtitle").textContent = `attention analysis · ${info.model.path} · ${info.data.inputs} inputs`;
  $("subtitle").title = info.folder;
  analysis = await getJSON("/api/analysis");
  showFields();
  const names = Object.keys(analysis.statistics);
  $("analysis-statistic").replaceChildren(...names.map((name) => el("option", { value: name },
    analysis.statistics[name].applicable ? name : `${name} (not applicable)`)));
  $("analysis-statistic").value = names.includes("normalized_entropy") ? "normalized_entropy" : names[0];
  $("analysis-statistic").addEventListener("change", showStatistic);
  $("analysis-piece").addEventListener("change", showPlot);
  $("analysis-overview").replaceChildren(plotFigure("overview.png", "mean per layer of each piece, for each statistic"));
  showStatistic();
  shortcuts({ "/": () => $("analysis-statistic").focus() });
}
