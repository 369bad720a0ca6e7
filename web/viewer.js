// The memory viewer: draws a devalloc snapshot (the JSON that Snapshot::to_json writes, or
// that the page's own allocator gives): allocations stacked in the order events happened (each
// coloured by its label, planned buffers outlined), what is reserved but not in use (the cache
// and rounding) as a gray band up to the reserved line, the largest allocations at
// the peak, the table of events, and a replay of the history under a memory limit. Memory
// plans (the page's network's, or a plan CSV) are drawn by plan.js, below the timeline.
import { human, exact, byteTicks, countTicks, parseBytes, PALETTE, OTHER } from "./format.js";

export { lastPlan } from "./plan.js";

const hex = (a) => "0x" + BigInt(a).toString(16);
// Text from a snapshot (labels, messages, names), made safe to put in HTML: a snapshot file is
// anyone's, and a label like `<img onerror=...>` must show as text, never run.
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const $ = (id) => document.getElementById(id);

// The key an allocation is coloured by: its label, else its size class.
const keyOf = (a) => a.label || `unlabelled ${human(2 ** Math.ceil(Math.log2(Math.max(a.size, 256))))}`;

// A device's name as people read it: wgpu's is "<adapter> (<type>, <route>)", and in the
// browser the adapter is often unnamed.
const nameOf = (name) => {
  const n = String(name || "").trim();
  return n.startsWith("(") ? `unnamed adapter ${n}` : n || "unnamed adapter";
};

// Steps of the timeline: one per event, each with the allocations live after it (oldest at the
// bottom), the bytes allocated (asked for) and reserved (held: live blocks' capacity plus the
// cache), as far as the history tells.
export function timeline(dev) {
  const events = (dev.history && dev.history.events) || [];
  const seen = new Set(events.filter((e) => e.kind === "alloc").map((e) => String(e.addr)));
  const live = new Map();
  // Planned buffers: recorded as such, or allocations whose tensors were named.
  const planned = new Set(events.filter((e) => e.kind === "planned_buffer" || e.kind === "tensors").map((e) => String(e.addr)));
  (dev.planned || []).forEach((p) => planned.add(String(p.addr)));
  // What was live before the first recorded event: freed later without an alloc event, or
  // live at the end without one.
  let order = 0;
  for (const e of events) {
    if (e.kind === "free" && !seen.has(String(e.addr)) && !live.has(String(e.addr))) {
      live.set(String(e.addr), { addr: e.addr, size: e.size, capacity: e.capacity, label: null, order: order++, before: true });
    }
  }
  for (const l of dev.live || []) {
    if (!seen.has(String(l.addr)) && !live.has(String(l.addr))) live.set(String(l.addr), { ...l, order: order++, before: true });
  }
  const before = live.size;
  // The buffers of an allocation made of several (wgpu's segments), which only the snapshot's
  // live list says: given to the last allocation made at that address, the one still live.
  const segments = new Map((dev.live || []).filter((l) => Array.isArray(l.segments) && l.segments.length)
    .map((l) => [String(l.addr), l.segments]));
  const lastAlloc = new Map(events.filter((e) => e.kind === "alloc").map((e) => [String(e.addr), e]));
  let cached = 0;
  const steps = [{ live: [...live.values()], cached, event: null }];
  for (const e of events) {
    if (e.kind === "alloc") {
      const segs = lastAlloc.get(String(e.addr)) === e ? segments.get(String(e.addr)) : undefined;
      live.set(String(e.addr), { addr: e.addr, size: e.size, capacity: e.capacity, label: e.label, order: order++, segments: segs });
      if (e.from_cache) cached = Math.max(0, cached - e.capacity);
    } else if (e.kind === "free") {
      live.delete(String(e.addr));
      if (e.to_cache) cached += e.capacity;
    } else if (e.kind === "empty_cache" || e.kind === "evict") {
      cached = Math.max(0, cached - e.bytes);
    } else if (e.kind === "tensors" && live.has(String(e.addr))) {
      live.set(String(e.addr), { ...live.get(String(e.addr)), tensors: e.tensors });
    }
    steps.push({ live: [...live.values()].sort((a, b) => a.order - b.order), cached, event: e });
  }
  for (const s of steps) {
    s.allocated = s.live.reduce((n, a) => n + a.size, 0);
    s.reserved = s.live.reduce((n, a) => n + (a.capacity || a.size), 0) + s.cached;
  }
  return { steps, planned, before };
}

// The family of a key: labels that differ only in their last number (w.layer0 ... w.layer3,
// act.layer0.step0 ... step5) share a hue, each in its own shade; every unlabelled size class
// is one family.
const familyOf = (key) => (key.startsWith("unlabelled") ? "unlabelled" : key.replace(/\d+(?=\D*$)/, "#"));

// `hex` mixed with white by `t` (0: itself, 1: white).
function tint(hex, t) {
  const n = parseInt(hex.slice(1), 16), mix = (c) => Math.round(c + (255 - c) * t);
  return `rgb(${mix(n >> 16)}, ${mix((n >> 8) & 255)}, ${mix(n & 255)})`;
}

// Colours by key: a colour of its own for each, where the palette has enough; else a hue per
// family, biggest family first (up to PALETTE.length; the rest gray), and a shade per member.
function colours(steps) {
  const bytes = new Map();
  for (const s of steps) for (const a of s.live) bytes.set(keyOf(a), Math.max(bytes.get(keyOf(a)) || 0, a.size));
  const own = bytes.size <= PALETTE.length;
  const families = new Map();
  for (const [k, b] of bytes) {
    const name = own ? k : familyOf(k);
    const f = families.get(name) || { name, members: [], bytes: 0 };
    f.members.push(k);
    f.bytes = Math.max(f.bytes, b);
    families.set(f.name, f);
  }
  const natural = (a, b) => a.localeCompare(b, "en", { numeric: true });
  const ordered = [...families.values()].sort((a, b) => b.bytes - a.bytes || natural(a.name, b.name));
  const map = new Map();
  ordered.forEach((f, i) => {
    f.members.sort(f.name === "unlabelled" ? (a, b) => bytes.get(b) - bytes.get(a) : natural);
    f.colour = i < PALETTE.length ? PALETTE[i] : OTHER;
    f.members.forEach((k, j) => map.set(k, f.colour === OTHER ? OTHER : tint(f.colour, f.members.length > 1 ? (0.6 * j) / (f.members.length - 1) : 0)));
  });
  return { keys: [...bytes.keys()], families: ordered, map };
}

function drawTimeline(canvas, tl, colour, failStep) {
  const { steps, planned } = tl;
  const g = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, left = 74, bottom = H - 40, top = 12, w = W - left - 12, h = bottom - top;
  g.clearRect(0, 0, W, H);
  const { top: max, ticks } = byteTicks(Math.max(...steps.map((s) => s.reserved)));
  const n = steps.length - 1;
  const x = (i) => left + (w * i) / Math.max(1, n);
  const y = (bytes) => bottom - (h * bytes) / max;
  g.font = "11px system-ui";
  g.textBaseline = "middle";
  for (const v of ticks) {
    g.fillStyle = "#6b7280"; g.textAlign = "right"; g.fillText(human(v, 2), left - 6, y(v));
    g.strokeStyle = "#eee"; g.beginPath(); g.moveTo(left, y(v)); g.lineTo(W - 12, y(v)); g.stroke();
  }
  for (let i = 0; i < n; i++) {
    const s = steps[i + 1], x0 = x(i), x1 = Math.max(x(i + 1), x0 + 1);
    let base = 0;
    for (const a of s.live) {
      const isPlanned = planned.has(String(a.addr));
      g.fillStyle = colour.get(keyOf(a)) || OTHER;
      g.fillRect(x0, y(base + a.size), x1 - x0, y(base) - y(base + a.size));
      // A hairline between neighbours, so that shades of one family stay apart.
      if (y(base) - y(base + a.size) >= 4) { g.fillStyle = "rgba(255,255,255,0.7)"; g.fillRect(x0, y(base + a.size), x1 - x0, 1); }
      if (isPlanned) { g.strokeStyle = "#111"; g.lineWidth = 1; g.strokeRect(x0 + 0.5, y(base + a.size) + 0.5, x1 - x0 - 1, y(base) - y(base + a.size) - 1); }
      base += a.size;
    }
    if (s.reserved > base) { g.fillStyle = "rgba(120,120,120,0.3)"; g.fillRect(x0, y(s.reserved), x1 - x0, y(base) - y(s.reserved)); }
  }
  // The reserved line: what the allocator holds from the device.
  g.strokeStyle = "#111"; g.lineWidth = 1.5; g.beginPath();
  for (let i = 0; i < n; i++) { const r = steps[i + 1].reserved; g.lineTo(x(i), y(r)); g.lineTo(x(i + 1), y(r)); }
  g.stroke();
  // The x axis: event numbers.
  g.fillStyle = "#6b7280"; g.textAlign = "center"; g.textBaseline = "top";
  for (const t of countTicks(n)) { g.fillText(String(t), x(t), bottom + 4); g.fillRect(x(t), bottom, 1, 3); }
  g.fillText("event number: allocations and frees in the order they happened (not time)", left + w / 2, bottom + 20);
  if (failStep !== null && failStep !== undefined) {
    const i = steps.findIndex((s) => s.event && s.event.seq === failStep);
    if (i > 0) {
      const xf = (x(i - 1) + x(i)) / 2;
      g.strokeStyle = "#b91c1c"; g.lineWidth = 2; g.setLineDash([5, 3]);
      g.beginPath(); g.moveTo(xf, top); g.lineTo(xf, bottom); g.stroke(); g.setLineDash([]);
      g.fillStyle = "#b91c1c"; g.textAlign = xf > left + w * 0.7 ? "right" : "left"; g.textBaseline = "top";
      g.fillText(`the replay fails here (event ${failStep})`, xf + (g.textAlign === "left" ? 4 : -4), top);
    }
  }
  return { max, ticks };
}

function legend(el, families, colour, hasPlanned) {
  const shown = families.filter((f) => f.colour !== OTHER);
  const rest = families.length - shown.length;
  const chip = (k) => `<i style="background:${colour.get(k)}"></i>`;
  const name = (f) => esc(f.members.length === 1 ? f.members[0]
    : f.name === "unlabelled" ? `unlabelled (${f.members.map((k) => k.slice(11)).join(", ")})`
    : f.members.length <= 3 ? f.members.join(", ") : `${f.members[0]} … ${f.members[f.members.length - 1]} (${f.members.length})`);
  el.innerHTML = shown.map((f) => `<span class="chip">${f.members.slice(0, 6).map(chip).join("")}${name(f)}</span>`).join("")
    + (rest ? `<span class="chip"><i style="background:${OTHER}"></i>${rest} more label famil${rest > 1 ? "ies" : "y"}, drawn in gray</span>` : "")
    + `<span class="chip"><i style="background:rgba(120,120,120,0.3)"></i>reserved, not in use (cache and rounding)</span>`
    + `<span class="chip"><i class="line"></i>reserved (held from the device)</span>`
    + (hasPlanned ? `<span class="chip"><i class="outlined"></i>planned buffer</span>` : "");
}

// The tensors named inside an allocation (a planned buffer's), as the tables show them.
const tensorsOf = (a) => (a.tensors && a.tensors.length
  ? ` <span class="tensors">(tensors: ${a.tensors.map((t) => `${esc(t.label)} ${human(t.size)} at +${esc(t.offset)}`).join(", ")})</span>` : "");

// The device buffers of an allocation past one buffer's limit, as the tables show them.
const segmentsOf = (a) => (Array.isArray(a.segments) && a.segments.length
  ? ` <span class="segments">(in ${a.segments.length} buffers: ${a.segments.map((g) => esc(human(Number(g && g.size)))).join(", ")})</span>` : "");

function peakTable(el, steps) {
  const peak = steps.reduce((p, s) => (s.allocated > p.allocated ? s : p), steps[0]);
  const rows = [...peak.live].sort((a, b) => b.size - a.size).slice(0, 10)
    .map((a) => `<tr><td>${esc(a.label || "unlabelled")}${tensorsOf(a)}${segmentsOf(a)}</td><td>${human(a.size)}</td><td>${hex(a.addr)}</td></tr>`).join("");
  el.innerHTML = `<caption>largest allocations at the peak of this history: ${human(peak.allocated)} allocated${peak.event ? ` after event ${peak.event.seq}` : ""}</caption>`
    + `<thead><tr><th>label</th><th>size</th><th>address</th></tr></thead><tbody>${rows}</tbody>`;
  return peak;
}

function eventTable(el, dev) {
  const all = (dev.history && dev.history.events) || [];
  const events = all.slice(-200);
  const detail = (e) => esc(e.kind === "alloc" ? `${human(e.size)} ${e.label || ""} ${e.from_cache ? "(cache hit)" : "(from the device)"}`
    : e.kind === "free" ? `${human(e.size)} ${e.to_cache ? "(to the cache)" : "(back to the device)"}`
    : e.kind === "out_of_memory" ? `${human(e.requested)}: ${e.detail}`
    : e.kind === "planned_buffer" ? `memory id ${e.memory_id}, ${human(e.size)}`
    : e.kind === "tensors" ? `tensors named: ${(e.tensors || []).map((t) => t.label).join(", ")}`
    : e.bytes !== undefined ? human(e.bytes) : e.count !== undefined ? `${e.count}` : "");
  // A browser's clock (Date.now()) has 1 ms steps: say so rather than show µs it never had.
  const coarse = all.length > 1 && all.every((e) => e.time_us % 1000 === 0);
  el.innerHTML = `<caption>${events.length < all.length ? `the newest ${events.length} of ${all.length} events` : `all ${all.length} events`}; µs since recording started${coarse ? " (in 1 ms steps: recorded by a browser)" : ""}</caption>`
    + `<thead><tr><th>#</th><th>µs</th><th>event</th><th>address</th><th>detail</th></tr></thead><tbody>`
    + events.map((e) => `<tr><td>${esc(e.seq)}</td><td>${esc(e.time_us)}</td><td>${esc(e.kind)}</td><td>${e.addr !== undefined ? hex(e.addr) : ""}</td><td>${detail(e)}</td></tr>`).join("")
    + "</tbody>";
}

function summary(source, dev, tl, peak) {
  const s = dev.stats, h = dev.history, events = (h && h.events) || [];
  const peakReserved = Math.max(...tl.steps.map((x) => x.reserved));
  const last = tl.steps[tl.steps.length - 1];
  const span = events.length ? (events[events.length - 1].time_us - events[0].time_us) / 1000 : 0;
  const parts = [
    `${source}: ${dev.device} (${nameOf(dev.name)}), ${events.length} events over ${span.toFixed(1)} ms`
      + (h && h.dropped ? ` (the ${h.dropped} oldest dropped: the ring holds ${h.capacity})` : ""),
    `in this history: peak ${human(peak.allocated)} allocated, ${human(peakReserved)} reserved`,
    `now: ${human(s.allocated_bytes)} allocated, ${human(s.reserved_bytes)} reserved (${human(s.cached_bytes)} cached)`,
  ];
  if (s.peak_allocated_bytes > peak.allocated || s.peak_reserved_bytes > peakReserved) {
    parts.push(`the allocator's lifetime peaks, before recording started too: ${human(s.peak_allocated_bytes)} allocated, ${human(s.peak_reserved_bytes)} reserved`);
  }
  if (last.reserved !== s.reserved_bytes) {
    parts.push(`the history accounts for ${human(last.reserved)} of the ${human(s.reserved_bytes)} reserved now (the rest came before its first event)`);
  }
  if (tl.before) parts.push(`${tl.before} allocation${tl.before > 1 ? "s" : ""} made before recording started, drawn from the start`);
  parts.push(`${s.cache_hits} cache hits / ${s.cache_misses} misses`);
  const planned = (dev.planned || []).length + events.filter((e) => e.kind === "planned_buffer" || e.kind === "tensors").length;
  parts.push(planned ? `planned buffers outlined` : `no planned buffers recorded`);
  const dm = dev.device_memory;
  if (dm && dm.total_bytes) parts.push(`device ${human(dm.free_bytes || 0)} free of ${human(dm.total_bytes)}`);
  if (dm && dm.backend_reserved_bytes !== null && dm.backend_reserved_bytes !== undefined) parts.push(`the backend holds ${human(dm.backend_reserved_bytes)}`);
  return parts.join("; ");
}

let replayer = null;
/// Gives the viewer the function that replays a snapshot's history under a limit (the wasm
/// binding, once the module is loaded): `(json, deviceIndex, limitBytes) => report`.
export function setReplayer(f) { replayer = f; }

let current = null;

function showReplay(r, limit) {
  const el = $("replay-result");
  if (r.failure) {
    const f = r.failure;
    el.className = "bad";
    el.textContent = `under ${human(limit, 2)} (${exact(limit)}) the history does not fit: it first fails at event ${f.step}`
      + (f.size ? `, an allocation of ${human(f.size)}${f.label ? ` (${f.label})` : ""}` : "") + `: ${f.error}. `
      + `Until then: peak ${human(r.peakLive)} live, ${human(r.peakReserved)} reserved, ${r.deviceAllocations} device allocations. `
      + `No allocator fits in less than ${human(r.lowerBound)}, the most live at once.`;
  } else {
    el.className = "ok";
    el.textContent = `under ${limit === null ? "no limit" : `${human(limit, 2)} (${exact(limit)})`} the whole history fits: `
      + `peak ${human(r.peakLive)} live, ${human(r.peakReserved)} reserved, ${r.deviceAllocations} device allocations, ${r.cacheHits} cache hits`
      + (r.steadyAfter !== null && r.steadyAfter !== undefined ? `; no device allocation after event ${r.steadyAfter}` : "") + ".";
  }
  el.textContent += " (Replayed through devalloc's pool on host memory with caching on; a device's own block sizes can make its reserved differ."
    + (current && current.before ? ` The ${current.before} allocation${current.before > 1 ? "s" : ""} made before recording started ${current.before > 1 ? "are" : "is"} not in the replay.` : "") + ")";
}

/// The report of the last replay of the shown device, if any.
export const lastReplay = () => (current && current.result.replay) || null;

/// Replays the shown device's history under the limit typed in the viewer; returns the report
/// (also drawn: the failing event as a red line).
export async function replayTyped() {
  const text = $("replay-limit").value.trim();
  const limit = text === "" ? null : parseBytes(text);
  const el = $("replay-result");
  if (!current || !replayer) { el.textContent = "nothing to replay yet"; return null; }
  if (limit !== null && !(limit > 0)) { el.className = "bad"; el.textContent = `"${text}" is not a size: type e.g. 64 MiB, 1.5 GiB, 512 KiB or 4096`; return null; }
  let r;
  try {
    r = await replayer(current.json, current.index, limit);
  } catch (e) {
    el.className = "bad"; el.textContent = `the replay failed: ${e && e.message || e}`;
    return null;
  }
  showReplay(r, limit);
  current.failStep = r.failure ? r.failure.step : null;
  current.redraw();
  current.result.replay = { limit, ...r };
  return current.result.replay;
}

/// Renders `snapshot` (JSON text, or the parsed object) into the viewer's elements; returns
/// what it drew (for the page's checks).
export function render(snapshot, source) {
  const json = typeof snapshot === "string" ? snapshot : JSON.stringify(snapshot);
  const snap = typeof snapshot === "string" ? JSON.parse(snapshot) : snapshot;
  if (!snap || snap.format !== "devalloc-snapshot") throw new Error("not a devalloc snapshot");
  const devices = snap.devices || [];
  const select = $("viewer-device");
  select.innerHTML = devices.map((d, i) => `<option value="${i}">${esc(d.device)}: ${esc(nameOf(d.name))}</option>`).join("");
  const result = { source, devices: devices.length, shown: null };
  const show = (i) => {
    const dev = devices[i];
    if (!dev) return null;
    const tl = timeline(dev);
    const { keys, families, map } = colours(tl.steps);
    current = { json, index: i, failStep: null, before: tl.before, result, redraw: () => drawTimeline($("timeline"), tl, map, current.failStep) };
    current.redraw();
    const hasPlanned = tl.planned.size > 0;
    legend($("viewer-legend"), families, map, hasPlanned);
    const peak = peakTable($("viewer-peak"), tl.steps);
    eventTable($("viewer-events"), dev);
    $("viewer-summary").textContent = summary(source, dev, tl, peak);
    $("replay-result").textContent = "";
    result.shown = {
      device: dev.device, events: tl.steps.length - 1, peakBytes: peak.allocated,
      peakReserved: Math.max(...tl.steps.map((s) => s.reserved)), reservedNow: dev.stats.reserved_bytes,
      before: tl.before, beforeBytes: tl.steps[0].allocated, labels: keys.length, families: families.length, coloured: keys.filter((k) => map.get(k) !== OTHER).length, planned: tl.planned.size,
      // The tensors named in planned buffers, and whether the tables show each name.
      tensors: ((dev.history && dev.history.events) || []).filter((e) => e.kind === "tensors").flatMap((e) => e.tensors.map((t) => t.label)),
      tensorsShown: ((dev.history && dev.history.events) || []).filter((e) => e.kind === "tensors")
        .every((e) => e.tensors.every((t) => $("viewer-events").textContent.includes(t.label))),
      steps: tl.steps.slice(1).map((s) => [s.event.seq, s.event.kind, s.event.label || null, s.allocated, s.reserved]),
    };
    delete result.replay;
    return result.shown;
  };
  select.onchange = () => show(Number(select.value));
  const first = devices.findIndex((d) => d.history && d.history.events.length);
  select.value = String(Math.max(0, first));
  show(Math.max(0, first));
  return result;
}

/// Lets a file (a snapshot, or a plan CSV) be opened with the picker or dropped on the viewer,
/// and the replay be run from its field (Enter) or button. `onFile(text, name)` gets the file.
export function acceptFiles(onFile) {
  const read = async (file) => onFile(await file.text(), file.name);
  $("viewer-file").addEventListener("change", (e) => e.target.files[0] && read(e.target.files[0]));
  const zone = $("viewer");
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("drop"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("drop"));
  zone.addEventListener("drop", (e) => { e.preventDefault(); zone.classList.remove("drop"); if (e.dataTransfer.files[0]) read(e.dataTransfer.files[0]); });
  $("replay-run").addEventListener("click", () => replayTyped());
  $("replay-limit").addEventListener("keydown", (e) => { if (e.key === "Enter") replayTyped(); });
}
