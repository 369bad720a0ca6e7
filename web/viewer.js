// The memory viewer: draws a devalloc snapshot (the JSON that Snapshot::to_json writes, or
// that the page's own allocator gives): a timeline of allocations stacked over time (each
// colored by its label, planned buffers outlined, the cache as a gray band on top), the
// largest allocations at the peak, and the table of events.

const KIB = 1024, MIB = 1 << 20;
const human = (b) => (b >= MIB ? `${(b / MIB).toFixed(1)} MiB` : b >= KIB ? `${(b / KIB).toFixed(1)} KiB` : `${b} B`);
const hex = (a) => "0x" + BigInt(a).toString(16);

function colorOf(key) {
  // FNV-1a, then mixed, so that labels one character apart get far-apart hues.
  let h = 0x811c9dc5;
  for (const c of key) h = Math.imul(h ^ c.charCodeAt(0), 16777619);
  h ^= h >>> 15; h = Math.imul(h, 0x2c1b3c6d); h ^= h >>> 12;
  h >>>= 0;
  return `hsl(${h % 360}, 62%, ${44 + ((h >>> 9) % 20)}%)`;
}

// The label of an allocation for coloring: its label, else its size class.
const keyOf = (a) => a.label || `unlabelled ${human(2 ** Math.ceil(Math.log2(Math.max(a.size, 256))))}`;

// Steps of the timeline: one per event, each with the allocations live after it (oldest at the
// bottom) and the cached bytes.
export function timeline(dev) {
  const events = (dev.history && dev.history.events) || [];
  const seen = new Set(events.filter((e) => e.kind === "alloc").map((e) => String(e.addr)));
  const live = new Map();
  const planned = new Set(events.filter((e) => e.kind === "planned_buffer").map((e) => String(e.addr)));
  (dev.planned || []).forEach((p) => planned.add(String(p.addr)));
  // What was live before the first recorded event: freed later without an alloc event, or
  // live at the end without one.
  let order = 0;
  for (const e of events) {
    if (e.kind === "free" && !seen.has(String(e.addr)) && !live.has(String(e.addr))) {
      live.set(String(e.addr), { addr: e.addr, size: e.size, label: null, order: order++, before: true });
    }
  }
  for (const l of dev.live || []) {
    if (!seen.has(String(l.addr)) && !live.has(String(l.addr))) live.set(String(l.addr), { ...l, order: order++, before: true });
  }
  let cached = 0;
  const steps = [{ t: events.length ? events[0].time_us : 0, live: [...live.values()], cached, event: null }];
  for (const e of events) {
    if (e.kind === "alloc") {
      live.set(String(e.addr), { addr: e.addr, size: e.size, label: e.label, order: order++ });
      if (e.from_cache) cached = Math.max(0, cached - e.capacity);
    } else if (e.kind === "free") {
      live.delete(String(e.addr));
      if (e.to_cache) cached += e.capacity;
    } else if (e.kind === "empty_cache" || e.kind === "evict") {
      cached = Math.max(0, cached - e.bytes);
    }
    steps.push({ t: e.time_us, live: [...live.values()].sort((a, b) => a.order - b.order), cached, event: e });
  }
  for (const s of steps) s.allocated = s.live.reduce((n, a) => n + a.size, 0);
  return { steps, planned };
}

function drawTimeline(canvas, dev) {
  const { steps, planned } = timeline(dev);
  const g = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, left = 70, bottom = H - 28, top = 12, w = W - left - 10, h = bottom - top;
  g.clearRect(0, 0, W, H);
  const max = Math.max(1, ...steps.map((s) => s.allocated + s.cached));
  const x = (i) => left + (w * i) / Math.max(1, steps.length - 1);
  const y = (bytes) => bottom - (h * bytes) / max;
  g.font = "11px system-ui";
  g.fillStyle = "#6b7280";
  for (let k = 0; k <= 4; k++) {
    const v = (max * k) / 4;
    g.fillText(human(Math.round(v)), 4, y(v) + 4);
    g.strokeStyle = "#eee"; g.beginPath(); g.moveTo(left, y(v)); g.lineTo(W, y(v)); g.stroke();
  }
  for (let i = 0; i + 1 < steps.length; i++) {
    const s = steps[i + 1], x0 = x(i), x1 = Math.max(x(i + 1), x0 + 1);
    let base = 0;
    for (const a of s.live) {
      const isPlanned = planned.has(String(a.addr)) || (a.label || "").startsWith("planned buffer");
      g.fillStyle = colorOf(keyOf(a));
      g.fillRect(x0, y(base + a.size), x1 - x0, y(base) - y(base + a.size));
      if (isPlanned) { g.strokeStyle = "#111"; g.lineWidth = 1; g.strokeRect(x0 + 0.5, y(base + a.size) + 0.5, x1 - x0 - 1, y(base) - y(base + a.size) - 1); }
      base += a.size;
    }
    if (s.cached) { g.fillStyle = "rgba(120,120,120,0.35)"; g.fillRect(x0, y(base + s.cached), x1 - x0, y(base) - y(base + s.cached)); }
  }
  g.fillStyle = "#6b7280";
  const t0 = steps[0].t, t1 = steps[steps.length - 1].t;
  g.fillText(`${((t1 - t0) / 1000).toFixed(1)} ms, ${steps.length - 1} events`, left, H - 8);
  return steps;
}

function legend(el, dev) {
  const keys = new Map();
  for (const e of (dev.history && dev.history.events) || []) if (e.kind === "alloc") keys.set(keyOf(e), (keys.get(keyOf(e)) || 0) + e.size);
  for (const l of dev.live || []) keys.set(keyOf(l), (keys.get(keyOf(l)) || 0) + l.size);
  el.innerHTML = [...keys.entries()].sort((a, b) => b[1] - a[1]).slice(0, 14)
    .map(([k]) => `<span class="chip"><i style="background:${colorOf(k)}"></i>${k}</span>`).join("")
    + `<span class="chip"><i style="background:rgba(120,120,120,0.35)"></i>cache</span><span class="chip"><i class="outlined"></i>planned buffer</span>`;
}

function peakTable(el, steps) {
  const peak = steps.reduce((p, s) => (s.allocated > p.allocated ? s : p), steps[0]);
  const rows = [...peak.live].sort((a, b) => b.size - a.size).slice(0, 10)
    .map((a) => `<tr><td>${a.label || "unlabelled"}</td><td>${human(a.size)}</td><td>${hex(a.addr)}</td></tr>`).join("");
  el.innerHTML = `<caption>largest allocations at the peak: ${human(peak.allocated)} allocated${peak.event ? ` (event ${peak.event.seq})` : ""}</caption>`
    + `<thead><tr><th>label</th><th>size</th><th>address</th></tr></thead><tbody>${rows}</tbody>`;
  return peak;
}

function eventTable(el, dev) {
  const events = ((dev.history && dev.history.events) || []).slice(-200);
  const detail = (e) => e.kind === "alloc" ? `${human(e.size)} ${e.label || ""} ${e.from_cache ? "(cache hit)" : "(from the device)"}`
    : e.kind === "free" ? `${human(e.size)} ${e.to_cache ? "(to the cache)" : "(back to the device)"}`
    : e.kind === "out_of_memory" ? `${human(e.requested)}: ${e.detail}`
    : e.kind === "planned_buffer" ? `memory id ${e.memory_id}, ${human(e.size)}`
    : e.bytes !== undefined ? human(e.bytes) : e.count !== undefined ? `${e.count}` : "";
  el.innerHTML = `<thead><tr><th>#</th><th>µs</th><th>event</th><th>address</th><th>detail</th></tr></thead><tbody>`
    + events.map((e) => `<tr><td>${e.seq}</td><td>${e.time_us}</td><td>${e.kind}</td><td>${e.addr !== undefined ? hex(e.addr) : ""}</td><td>${detail(e)}</td></tr>`).join("")
    + "</tbody>";
}

// Renders `snapshot` into the viewer's elements; returns what it drew (for the page's checks).
export function render(snapshot, source) {
  const $ = (id) => document.getElementById(id);
  if (!snapshot || snapshot.format !== "devalloc-snapshot") throw new Error("not a devalloc snapshot");
  const devices = snapshot.devices || [];
  const select = $("viewer-device");
  select.innerHTML = devices.map((d, i) => `<option value="${i}">${d.device}: ${d.name}</option>`).join("");
  const show = (i) => {
    const dev = devices[i];
    if (!dev) return null;
    const steps = drawTimeline($("timeline"), dev);
    legend($("viewer-legend"), dev);
    const peak = peakTable($("viewer-peak"), steps);
    eventTable($("viewer-events"), dev);
    const s = dev.stats;
    const dm = dev.device_memory;
    $("viewer-summary").textContent = `${source}: ${dev.device}, ${(dev.history && dev.history.events.length) || 0} events; `
      + `now ${human(s.allocated_bytes)} allocated, ${human(s.reserved_bytes)} reserved (${human(s.cached_bytes)} cached), peak ${human(s.peak_allocated_bytes)}; `
      + `${s.cache_hits} hits / ${s.cache_misses} misses`
      + (dm && dm.total_bytes ? `; device ${human(dm.free_bytes || 0)} free of ${human(dm.total_bytes)}` : "")
      + (dm && dm.backend_reserved_bytes !== null && dm.backend_reserved_bytes !== undefined ? `; the backend holds ${human(dm.backend_reserved_bytes)}` : "");
    return { device: dev.device, events: steps.length - 1, peakBytes: peak.allocated };
  };
  select.onchange = () => show(Number(select.value));
  const first = devices.findIndex((d) => d.history && d.history.events.length) ;
  select.value = String(Math.max(0, first));
  const shown = show(Math.max(0, first));
  return { source, devices: devices.length, shown };
}

// Lets a snapshot file be opened with the picker or dropped on the viewer.
export function acceptFiles(onSnapshot) {
  const read = async (file) => onSnapshot(JSON.parse(await file.text()), file.name);
  document.getElementById("viewer-file").addEventListener("change", (e) => e.target.files[0] && read(e.target.files[0]));
  const zone = document.getElementById("viewer");
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("drop"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("drop"));
  zone.addEventListener("drop", (e) => { e.preventDefault(); zone.classList.remove("drop"); if (e.dataTransfer.files[0]) read(e.dataTransfer.files[0]); });
}
