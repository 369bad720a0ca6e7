// The memory plan picture: tensors placed in one planned buffer, drawn on an offset-by-step
// canvas (x: steps, y: byte offset), one rectangle per tensor from its first to its last step,
// with the plan's size and its lower bound (the most bytes live at any one step) as lines.
// Draws the page's own network's plan (from devalloc's planner, in wasm) or a MiniMalloc plan
// CSV (`id,lower,upper,size,offset`, as `cargo run --example plan -- FILE --out DIR` writes).
import { human, byteTicks, countTicks, PALETTE } from "./format.js";

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

/// Whether an opened file is a plan CSV rather than a snapshot (JSON).
export function isPlanCsv(text, name) {
  const start = String(text).replace(/^\uFEFF/, "").trimStart();
  return !start.startsWith("{") && (/\.csv$/i.test(name || "") || /^[^\n]*,/.test(start));
}

/// Parses a MiniMalloc plan CSV: a header naming `id`, `lower`, `upper`, `size` and `offset`
/// (any order, any case), then one buffer a row, live from step `lower` up to, not including,
/// `upper`. Returns `[{label, size, first, last, offset}]` (`last` inclusive); throws an Error
/// whose message names the file and the line.
export function parsePlanCsv(text, name = "the file") {
  const bad = (line, why) => new Error(`${name}:${line}: ${why}`);
  const lines = String(text).replace(/^\uFEFF/, "").split(/\r\n|\n|\r/);
  let at = lines.findIndex((l) => l.trim() !== "");
  if (at < 0) throw bad(1, "empty: expected a header `id,lower,upper,size,offset`");
  const cols = lines[at].split(",").map((c) => c.trim().toLowerCase());
  const col = (want) => {
    const i = cols.indexOf(want);
    if (i >= 0) return i;
    if (want === "offset" && ["id", "lower", "upper", "size"].every((c) => cols.includes(c))) {
      throw bad(at + 1, "no `offset` column: this is a planning problem (MiniMalloc's input), not a plan; "
        + "`cargo run --release --example plan -- FILE.csv --out DIR` writes its plan");
    }
    throw bad(at + 1, `no \`${want}\` column in the header (a plan's is \`id,lower,upper,size,offset\`)`);
  };
  const [idAt, lowerAt, upperAt, sizeAt, offsetAt] = ["id", "lower", "upper", "size", "offset"].map(col);
  const tensors = [], seen = new Set();
  for (let i = at + 1; i < lines.length; i++) {
    const row = lines[i].trim();
    if (!row) continue;
    const line = i + 1, fields = row.split(",").map((f) => f.trim());
    const field = (k, what) => {
      if (k >= fields.length) throw bad(line, `missing \`${what}\` (${fields.length} fields)`);
      return fields[k];
    };
    const number = (k, what) => {
      const t = field(k, what);
      if (/^-\d+$/.test(t)) throw bad(line, `\`${what}\` is negative: ${t}`);
      if (!/^\d+$/.test(t)) throw bad(line, `\`${what}\` is not a whole number: ${JSON.stringify(t)}`);
      const v = Number(t);
      if (!Number.isSafeInteger(v)) throw bad(line, `\`${what}\` is past 2^53, more than this page can draw exactly: ${t}`);
      return v;
    };
    const id = field(idAt, "id");
    const [lower, upper, size, offset] = [[lowerAt, "lower"], [upperAt, "upper"], [sizeAt, "size"], [offsetAt, "offset"]].map(([k, w]) => number(k, w));
    if (lower >= upper) throw bad(line, `buffer ${id}: lower ${lower} is not below upper ${upper}`);
    if (size === 0) throw bad(line, `buffer ${id}: size 0`);
    if (!Number.isSafeInteger(offset + size)) throw bad(line, `buffer ${id}: offset + size is past 2^53`);
    if (seen.has(id)) throw bad(line, `buffer ${id} appears twice`);
    seen.add(id);
    tensors.push({ label: id, size, first: lower, last: upper - 1, offset });
  }
  if (!tensors.length) throw bad(at + 1, "a header and no buffers");
  return tensors;
}

/// What a plan's tensors say: the buffer's size (the largest offset + size), the lower bound
/// (the most bytes live at one step) and the step where it is reached, the bytes one after
/// another, the steps spanned, and pairs of tensors live at a common step that share bytes.
export function planStats(tensors) {
  const n = tensors.length;
  let size = 0, unplanned = 0, from = Infinity, to = -Infinity;
  for (const t of tensors) {
    size = Math.max(size, t.offset + t.size); unplanned += t.size;
    from = Math.min(from, t.first); to = Math.max(to, t.last + 1);
  }
  // One sweep over starts and ends (a tensor is live from `first` to `last`, both included),
  // keeping the live tensors by offset: in a valid plan their byte ranges are disjoint, so a
  // new tensor can only overlap its neighbours there.
  const byFirst = [...Array(n).keys()].sort((a, b) => tensors[a].first - tensors[b].first);
  const byEnd = [...byFirst].sort((a, b) => tensors[a].last - tensors[b].last);
  const active = [], overlaps = [];
  const at = (offset) => { // the first live tensor at or above `offset`
    let lo = 0, hi = active.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (tensors[active[m]].offset < offset) lo = m + 1; else hi = m; }
    return lo;
  };
  let live = 0, lowerBound = 0, peakStep = from, e = 0;
  for (const i of byFirst) {
    const t = tensors[i];
    while (e < n && tensors[byEnd[e]].last < t.first) {
      const j = byEnd[e++];
      live -= tensors[j].size;
      let k = at(tensors[j].offset);
      while (active[k] !== j) k++;
      active.splice(k, 1);
    }
    live += t.size;
    if (live > lowerBound) { lowerBound = live; peakStep = t.first; }
    const k = at(t.offset);
    if (k > 0) { const u = tensors[active[k - 1]]; if (u.offset + u.size > t.offset && overlaps.length < 1000) overlaps.push([active[k - 1], i]); }
    for (let m = k; m < active.length && tensors[active[m]].offset < t.offset + t.size && overlaps.length < 1000; m++) overlaps.push([active[m], i]);
    active.splice(k, 0, i);
  }
  return { size, lowerBound, peakStep, unplanned, from, to, overlaps };
}

let shown = null;

/// What the plan view drew last (for the page's checks): `{source, tensors, size, lowerBound,
/// ratio, ...}`, `{source, error}` for a bad file, or `{source, none}` where there is no plan.
export const lastPlan = () => shown && shown.result;

// Colours: one per label where the palette has enough, else the palette in turn (by start).
function colouring(tensors) {
  const labels = [...new Set(tensors.map((t) => t.label))];
  if (labels.length <= PALETTE.length) {
    const map = new Map(labels.map((l, i) => [l, PALETTE[i]]));
    return { own: true, labels, of: (t) => map.get(t.label) };
  }
  return { own: false, labels, of: (t, i) => PALETTE[i % PALETTE.length] };
}

function draw(canvas, tensors, st, colour) {
  const g = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, left = 74, right = W - 12, bottom = H - 40, top = 16, w = right - left, h = bottom - top;
  g.clearRect(0, 0, W, H);
  const { top: max, ticks } = byteTicks(Math.max(st.size, st.lowerBound));
  const span = Math.max(1, st.to - st.from);
  const x = (s) => left + (w * (s - st.from)) / span;
  const y = (b) => bottom - (h * b) / max;
  g.font = "11px system-ui"; g.textBaseline = "middle"; g.lineWidth = 1;
  for (const v of ticks) {
    g.fillStyle = "#6b7280"; g.textAlign = "right"; g.fillText(human(v, 2), left - 6, y(v));
    g.strokeStyle = "#eee"; g.beginPath(); g.moveTo(left, y(v)); g.lineTo(right, y(v)); g.stroke();
  }
  const rects = new Array(tensors.length);
  tensors.forEach((t, i) => {
    const x0 = x(t.first), x1 = Math.max(x(t.last + 1), x0 + 1), y0 = y(t.offset + t.size), y1 = Math.max(y(t.offset), y0 + 1);
    g.fillStyle = colour.of(t, i);
    g.fillRect(x0, y0, x1 - x0, y1 - y0);
    // A white hairline round rectangles big enough to show one, so neighbours stay apart.
    if (x1 - x0 >= 4 && y1 - y0 >= 4) { g.strokeStyle = "rgba(255,255,255,0.8)"; g.strokeRect(x0 + 0.5, y0 + 0.5, x1 - x0 - 1, y1 - y0 - 1); }
    rects[i] = [x0, y0, x1, y1];
  });
  g.strokeStyle = "#b91c1c"; g.lineWidth = 2;
  for (const [a, b] of st.overlaps) for (const k of [a, b]) { const [x0, y0, x1, y1] = rects[k]; g.strokeRect(x0, y0, x1 - x0, y1 - y0); }
  // The step where the most is live, and the two lines: the lower bound, and the plan's size.
  g.strokeStyle = "#6b7280"; g.lineWidth = 1; g.setLineDash([2, 3]);
  const xp = Math.round(x(st.peakStep + 0.5)) + 0.5;
  g.beginPath(); g.moveTo(xp, top); g.lineTo(xp, bottom); g.stroke();
  const hline = (bytes, colourOf, dash, text, above) => {
    g.strokeStyle = colourOf; g.lineWidth = 2; g.setLineDash(dash);
    g.beginPath(); g.moveTo(left, y(bytes)); g.lineTo(right, y(bytes)); g.stroke(); g.setLineDash([]);
    g.font = "bold 11px system-ui"; g.textAlign = "right"; g.textBaseline = above ? "bottom" : "top";
    const tw = g.measureText(text).width, ty = y(bytes) + (above ? -3 : 3);
    g.fillStyle = "rgba(255,255,255,0.85)"; g.fillRect(right - tw - 6, above ? ty - 13 : ty - 1, tw + 4, 14);
    g.fillStyle = colourOf; g.fillText(text, right - 4, ty);
  };
  // The plan's label above its line, the lower bound's below its own: apart even when equal.
  hline(st.lowerBound, "#15803d", [6, 4], `lower bound ${human(st.lowerBound, 2)}: the most live at one step`, false);
  hline(st.size, "#111", [], `planned ${human(st.size, 2)}`, true);
  g.font = "11px system-ui"; g.fillStyle = "#6b7280"; g.textAlign = "center"; g.textBaseline = "top";
  for (const t of countTicks(span)) {
    const label = (st.from + t).toLocaleString("en-US"), half = g.measureText(label).width / 2;
    g.fillText(label, Math.min(x(st.from + t), W - half - 1), bottom + 4); g.fillRect(x(st.from + t), bottom, 1, 3);
  }
  g.fillText("step (time): each tensor spans its first to its last step; height: its bytes at its offset in the planned buffer", left + w / 2, bottom + 20);
  return rects;
}

function legend(el, tensors, colour, st) {
  const chip = (c, text, cls = "") => `<span class="chip"><i${cls ? ` class="${cls}"` : ""}${c ? ` style="background:${c}"` : ""}></i>${text}</span>`;
  const first = new Map();
  tensors.forEach((t, i) => first.has(t.label) || first.set(t.label, colour.of(t, i)));
  el.innerHTML = (colour.own ? [...first].map(([l, c]) => chip(c, esc(l))).join("")
    : chip(PALETTE[0], `${tensors.length} tensors, ${PALETTE.length} colours in turn (hover one for its id, size and steps)`))
    + chip(null, "plan size", "line") + chip(null, "lower bound", "line lb") + chip(null, "the step where the most is live", "line peak")
    + (st.overlaps.length ? chip(null, "tensors that overlap", "outlined bad") : "");
}

/// Draws `plan` (`{tensors: [{label, size, first, last, offset}], unplanned?}`) in the plan
/// view, naming `source`; returns what it drew.
export function renderPlan(plan, source) {
  const t0 = performance.now();
  const tensors = plan.tensors || [];
  if (!tensors.length) return showNoPlan(`${source}: a plan of no tensors: nothing to draw`, false, source);
  const st = planStats(tensors);
  const canvas = $("plan");
  const colour = colouring(tensors);
  canvas.hidden = false;
  const rects = draw(canvas, tensors, st, colour);
  legend($("plan-legend"), tensors, colour, st);
  const unplanned = plan.unplanned !== undefined && plan.unplanned !== null ? Number(plan.unplanned) : st.unplanned;
  const ratio = st.size / st.lowerBound;
  const text = `${source}: ${tensors.length} tensor${tensors.length > 1 ? "s" : ""} over steps ${st.from}–${st.to - 1}: `
    + `planned ${human(st.size, 2)} = ${ratio.toFixed(2)}x the lower bound (${human(st.lowerBound, 2)}, the most live at once, at step ${st.peakStep}); `
    + `one after another it would take ${human(unplanned, 2)}.`
    + (st.overlaps.length === 1 ? " A pair of tensors live at a common step share bytes (outlined in red): not a valid plan."
      : st.overlaps.length ? ` ${st.overlaps.length}${st.overlaps.length >= 1000 ? " or more" : ""} pairs of tensors live at a common step share bytes (outlined in red): not a valid plan.` : "");
  const el = $("plan-summary");
  el.className = st.overlaps.length ? "bad" : "";
  el.textContent = text;
  canvas.onmousemove = (e) => {
    const r = canvas.getBoundingClientRect(), px = ((e.clientX - r.left) * canvas.width) / r.width, py = ((e.clientY - r.top) * canvas.height) / r.height;
    for (let i = rects.length - 1; i >= 0; i--) {
      const [x0, y0, x1, y1] = rects[i];
      if (px >= x0 && px <= x1 && py >= y0 && py <= y1) {
        const t = tensors[i];
        canvas.title = `${t.label}: ${human(t.size, 2)} (${t.size} bytes) at offset ${t.offset}, steps ${t.first}–${t.last}`;
        return;
      }
    }
    canvas.title = "";
  };
  const result = {
    source, tensors: tensors.length, drawn: rects.length, size: st.size, lowerBound: st.lowerBound, unplanned,
    ratio: Number(ratio.toFixed(4)), overlaps: st.overlaps.length, text, ms: performance.now() - t0,
  };
  shown = { result };
  return result;
}

/// Reads a plan CSV and draws it (`ms`: reading included); a bad file is a message naming its
/// line, never a throw.
export function renderPlanCsv(text, name) {
  const t0 = performance.now();
  try {
    const result = renderPlan({ tensors: parsePlanCsv(text, name) }, name);
    result.ms = performance.now() - t0;
    return result;
  } catch (e) {
    return showNoPlan(String(e && e.message || e), true, name);
  }
}

/// Shows `text` in the plan view instead of a picture (`bad`: as an error).
export function showNoPlan(text, bad = false, source = null) {
  const el = $("plan-summary");
  el.className = bad ? "bad" : "";
  el.textContent = text;
  $("plan").hidden = true;
  $("plan-legend").innerHTML = "";
  shown = { result: bad ? { source, error: text } : { source, none: text } };
  return shown.result;
}
