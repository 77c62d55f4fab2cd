// Shared by both views: requests, elements, marked text, keyboard shortcuts.

export async function getJSON(url, options = {}) {
  const response = await fetch(url, options);
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  if (!response.ok) {
    const message = body && body.error ? body.error : `${response.status} ${response.statusText}`;
    const error = new Error(message);
    error.status = response.status;
    error.field = body ? body.field : null;
    throw error;
  }
  return body;
}

export function el(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "className") element.className = value;
    else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

// Offsets from the server count Unicode code points (Python's str); JavaScript strings count UTF-16
// units. The map is the identity unless the text holds characters outside the BMP.
export function utf16Offsets(text) {
  if (!/[\uD800-\uDFFF]/.test(text)) return (offset) => offset;
  const units = [];
  let unit = 0;
  for (const character of text) { units.push(unit); unit += character.length; }
  units.push(unit);
  return (offset) => units[Math.min(offset, units.length - 1)];
}

// file:line:column of a code-point offset, as `longdoc ask` prints it (both counted from 1).
export function lineColumn(text, offset) {
  const at = utf16Offsets(text)(offset);
  const lineStart = text.lastIndexOf("\n", at - 1) + 1;
  const line = (text.slice(0, at).match(/\n/g) || []).length + 1;
  return [line, Array.from(text.slice(lineStart, at)).length + 1];
}

// Render `text` into `container` with `marks` ([{start, end, classes, title}], code-point offsets,
// overlapping freely): the text is cut at every mark boundary; each piece covered by marks is one
// <mark> with all their classes and its own offsets in data-start/data-end.
export function renderMarked(container, text, marks) {
  const toUnit = utf16Offsets(text);
  const length = Array.from(text).length;
  const cuts = new Set([0, length]);
  const kept = marks.filter((m) => m.start < m.end && m.start >= 0 && m.end <= length);
  for (const mark of kept) { cuts.add(mark.start); cuts.add(mark.end); }
  const points = [...cuts].sort((a, b) => a - b);
  const fragment = document.createDocumentFragment();
  for (let i = 0; i + 1 < points.length; i++) {
    const [start, end] = [points[i], points[i + 1]];
    const piece = text.slice(toUnit(start), toUnit(end));
    const covering = kept.filter((m) => m.start <= start && end <= m.end);
    if (!covering.length) { fragment.append(piece); continue; }
    const titles = [...new Set(covering.map((m) => m.title).filter(Boolean))];
    fragment.append(el("mark", {
      className: [...new Set(covering.flatMap((m) => m.classes))].join(" "),
      "data-start": start, "data-end": end, title: titles.join("; ") || null,
    }, piece));
  }
  container.replaceChildren(fragment);
}

export function formatNumber(value, digits = 3) {
  if (value === null || value === undefined) return "";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? String(value) : value.toFixed(digits);
}

export function formatBytes(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

function typing(event) {
  const target = event.target;
  return target instanceof HTMLElement && (target.isContentEditable || ["INPUT", "SELECT", "TEXTAREA"].includes(target.tagName));
}

// Single-key shortcuts, ignored while typing in a field (where Escape leaves the field).
export function shortcuts(handlers) {
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (typing(event)) {
      if (event.key === "Escape" && handlers.Escape) { handlers.Escape(event); }
      return;
    }
    const handler = handlers[event.key];
    if (handler) { event.preventDefault(); handler(event); }
  });
}

export function setupKeysHelp() {
  const button = document.getElementById("keys-button");
  const panel = document.getElementById("keys");
  const toggle = () => {
    panel.hidden = !panel.hidden;
    button.setAttribute("aria-expanded", String(!panel.hidden));
  };
  button.addEventListener("click", toggle);
  return toggle;
}

// Move the current item of a list of buttons by `step` and press it.
export function stepThrough(list, step) {
  const buttons = [...list.querySelectorAll("button")];
  if (!buttons.length) return;
  const current = buttons.findIndex((b) => b.getAttribute("aria-current") === "true");
  const next = current < 0 ? 0 : Math.max(0, Math.min(buttons.length - 1, current + step));
  buttons[next].focus();
  buttons[next].click();
}
