// The devalloc browser demo: show a snapshot given by ?snapshot= first, then initialise, show
// the adapter, round-trip data, try hostile arguments, measure upload and download against
// plain wgpu, chart allocated vs reserved memory, and show the page's own allocator in the
// memory viewer. When done, the title says "devalloc: done" (or "devalloc: failed"; "devalloc:
// lost" once the browser took the GPU away) and #results holds the figures as JSON.
import init, { Devalloc, replay_snapshot } from "./pkg/devalloc_web.js";
import * as viewer from "./viewer.js";
import { isPlanCsv, renderPlan, renderPlanCsv, showNoPlan } from "./plan.js";
import { human, exact, byteTicks, countTicks, decades, decade, trim } from "./format.js";
import { ask, askCard } from "./ask.js";
import { loadModel } from "./model.js";

const $ = (id) => document.getElementById(id);
const results = { ok: false, backend: null, roundTrip: false, bench: [], latency: null, memory: [] };
const gb = (v) => (v < 0.1 ? v.toFixed(4) : v.toFixed(2));
const publish = () => { $("results").textContent = JSON.stringify(results); };

function status(text, cls) {
  const s = $("status");
  s.textContent = text;
  s.className = `status ${cls}`;
}

function showDevice(dv) {
  const a = dv.adapter();
  const limits = dv.limits();
  const webgpu = dv.backend === "webgpu";
  const named = [a.vendor, a.architecture].filter(Boolean).join(" / ");
  const rows = [
    ["backend", webgpu ? "WebGPU" : "WebGL2 (wgpu's GL backend)"],
    ...(dv.fallback ? [["why not WebGPU", `the browser offered no WebGPU adapter (Chromium notes "No available adapters." in the console when a page asks); devalloc said: ${dv.fallback}`]] : []),
    ["adapter", [named, a.description].filter(Boolean).join(": ") || "not named by the browser"],
    ["type", a.deviceType === "Cpu" ? "software (runs on the CPU)" : a.deviceType],
    ["largest buffer", `${human(limits.maxBufferSize, 2)} (${exact(limits.maxBufferSize)})`],
    ["largest storage binding", limits.storageBuffers ? `${human(limits.maxStorageBufferBindingSize, 2)} (${exact(limits.maxStorageBufferBindingSize)})` : "none: WebGL2 has no storage buffers"],
    ["devices", dv.devices().map((d) => d.device).join(", ")],
    ...(webgpu ? [] : [["staging", "a fresh read buffer per download (a reused one makes Chromium warn on every read; see the throughput notes)"]]),
  ];
  $("device").innerHTML = rows.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
  results.backend = dv.backend;
  results.adapter = a;
  results.limits = limits;
}

async function roundTrip(dv) {
  const n = 1 << 16;
  const data = Float32Array.from({ length: n }, (_, i) => Math.sin(i) * 1000);
  const ptr = dv.allocate(n * 4);
  await dv.write_f32(ptr, data);
  const back = await dv.read_f32(ptr, n);
  // A ragged sub-range through an offset pointer.
  await dv.write(ptr + 3n, new Uint8Array([1, 2, 3, 4, 5]));
  const bytes = await dv.read(ptr + 1n, 9);
  dv.deallocate(ptr);
  const floatsOk = back.length === n && back.every((v, i) => v === data[i]);
  const raw = new Uint8Array(data.buffer);
  const expect = [raw[1], raw[2], 1, 2, 3, 4, 5, raw[8], raw[9]];
  const raggedOk = expect.every((v, i) => bytes[i] === v);
  let errorOk = false;
  try { dv.deallocate(ptr); } catch (e) { errorOk = /invalid pointer/.test(e.message); }
  // A weights file's way in: a fetch body streamed onto the device (a Response's body here),
  // one byte short of the allocation; a stream one byte too long is refused at the range's end.
  const sp = dv.allocate(raw.length + 1);
  let calls = 0, lastDone = 0;
  const wrote = await dv.writeFromStream(sp, new Response(raw).body, (done) => { calls++; lastDone = done; });
  const sback = await dv.read(sp, raw.length);
  let longOk = false;
  try { await dv.writeFromStream(sp, new Response(new Uint8Array(raw.length + 2)).body); } catch (e) { longOk = /landed/.test(e.message); }
  let typeOk = false;
  try { dv.writeFromStream(sp, raw); } catch (e) { typeOk = /ReadableStream/.test(e.message); }
  dv.deallocate(sp);
  const streamOk = wrote === raw.length && lastDone === raw.length && calls > 0 && sback.every((v, i) => v === raw[i]) && longOk && typeOk;
  results.stream = { wrote, calls };
  results.roundTrip = floatsOk && raggedOk && errorOk && streamOk;
  $("roundtrip").innerHTML = results.roundTrip
    ? `<span class="ok">verified</span>: ${n} floats written and read back, a ragged 5-byte write at offset 3 kept its neighbours, a double free was refused with an exception, ${raw.length} bytes streamed from a fetch body (writeFromStream) and read back`
    : `<span class="bad">FAILED</span> (floats ${floatsOk}, ragged ${raggedOk}, double free refused ${errorOk}, stream ${streamOk})`;
}

const best = (methods) => methods.filter((m) => !m.ours).reduce((a, b) => (b.ms < a.ms ? b : a));
const ours = (methods) => methods.find((m) => m.ours);

// Bars on a log scale: from 4 KiB to 64 MiB throughput spans four decades.
function drawBars(rows) {
  const c = $("bw"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const series = [
    ["upload, devalloc", (r) => ours(r.up).gbps, "#2563eb"], ["upload, best peer", (r) => best(r.up).gbps, "#93c5fd"],
    ["download, devalloc", (r) => ours(r.down).gbps, "#d97706"], ["download, best peer", (r) => best(r.down).gbps, "#fcd34d"],
  ];
  const { lo, hi, ticks } = decades(rows.flatMap((r) => series.map(([, f]) => f(r))));
  const left = 64, bottom = c.height - 44, top = 34, h = bottom - top;
  const groupW = (c.width - left - 10) / Math.max(rows.length, 5), barW = groupW / 5;
  const y = (v) => bottom - (h * Math.log10(v / lo)) / Math.log10(hi / lo);
  g.font = "12px system-ui"; g.textBaseline = "middle";
  for (const t of ticks) {
    g.fillStyle = "#6b7280"; g.textAlign = "right"; g.fillText(decade(t), left - 6, y(t));
    g.strokeStyle = "#e5e7eb"; g.beginPath(); g.moveTo(left, y(t)); g.lineTo(c.width, y(t)); g.stroke();
  }
  g.save(); g.translate(14, top + h / 2); g.rotate(-Math.PI / 2); g.textAlign = "center"; g.fillText("GB/s, log scale", 0, 0); g.restore();
  rows.forEach((r, i) => {
    series.forEach(([, f, color], j) => {
      const v = f(r), x = left + i * groupW + j * barW + barW / 2;
      g.fillStyle = color; g.fillRect(x, y(v), barW - 2, bottom - y(v));
    });
    g.fillStyle = "#1d2330"; g.textAlign = "center"; g.fillText(human(r.size), left + i * groupW + groupW / 2, bottom + 14);
  });
  g.fillStyle = "#6b7280"; g.textAlign = "center";
  g.fillText("size of one copy", left + (c.width - left) / 2, bottom + 32);
  g.textAlign = "left";
  series.forEach(([label, , color], j) => { g.fillStyle = color; g.fillRect(left + j * 170, 8, 12, 12); g.fillStyle = "#1d2330"; g.fillText(label, left + j * 170 + 16, 14); });
}

function benchRow(r) {
  const cells = (ms) => ms.map((m) => `<td${m.ours ? ' class="ours"' : ""}>${gb(m.gbps)}</td>`).join("");
  return `<tr><td>${human(r.size)}</td>${cells(r.up)}<td>${r.upRatio.toFixed(2)}x</td>${cells(r.down)}<td>${r.downRatio.toFixed(2)}x</td></tr>`;
}

async function throughput(dv) {
  // Interleaved medians of every method; the ratio is devalloc / the best peer (> 1: faster).
  const plan = [[4096, 30], [64 << 10, 20], [1 << 20, 15], [16 << 20, 9], [64 << 20, 5]];
  for (const [size, reps] of plan) {
    status(`measuring ${human(size)}…`, "running");
    const r = await dv.bench(size, reps);
    results.bench.push(r);
    const table = $("bwtable");
    if (!table.tHead.rows.length) {
      const names = (ms) => ms.map((m) => `<th>${m.name}</th>`).join("");
      table.tHead.innerHTML = `<tr><th rowspan="2">size</th><th colspan="${r.up.length + 1}">upload GB/s</th><th colspan="${r.down.length + 1}">download GB/s</th></tr>`
        + `<tr>${names(r.up)}<th>devalloc / best</th>${names(r.down)}<th>devalloc / best</th></tr>`;
    }
    table.tBodies[0].insertAdjacentHTML("beforeend", benchRow(r));
    drawBars(results.bench);
  }
  const notes = [`Medians of interleaved samples (${plan.map(([s, n]) => `${human(s)}: ${n}`).join(", ")} samples per method, after one warm-up each); every copy's data verified.`];
  for (const s of results.bench[0].skipped) notes.push(`Not measured here: ${s.name}: ${s.why}.`);
  if (dv.backend !== "webgpu") notes.push("On WebGL2 devalloc reads through a fresh staging buffer each time: a reused one would be faster for large reads, but Chromium warns on every reuse of a read buffer.");
  $("bwnote").textContent = notes.join(" ");
  // One 4-byte read is below the browser's timer resolution (0.1 ms): time many together.
  const reads = 20, samples = 15;
  status("measuring the latency of a 4-byte read…", "running");
  const lat = await dv.latency(4, reads, samples);
  results.latency = { reads, samples, us: Object.fromEntries(lat.down.map((m) => [m.name, m.ms * 1000])), ratio: lat.downRatio };
  $("latency").textContent = `4-byte download latency, per read: `
    + lat.down.map((m) => `${m.name} ${trim(m.ms * 1000, 0)} µs`).join(", ")
    + ` (median of ${samples} samples of ${reads} reads timed together: one read is below the browser's 0.1 ms timer resolution).`;
}

function drawMemory(samples) {
  const c = $("mem"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const { top: max, ticks } = byteTicks(Math.max(1, ...samples.map((s) => s.reserved)));
  const left = 74, bottom = c.height - 40, top = 24, h = bottom - top, w = c.width - left - 12;
  const n = Math.max(1, samples.length - 1);
  const x = (i) => left + (w * i) / n, y = (v) => bottom - (h * v) / max;
  g.font = "12px system-ui"; g.textBaseline = "middle";
  for (const v of ticks) {
    g.fillStyle = "#6b7280"; g.textAlign = "right"; g.fillText(human(v, 2), left - 6, y(v));
    g.strokeStyle = "#eee"; g.beginPath(); g.moveTo(left, y(v)); g.lineTo(c.width - 12, y(v)); g.stroke();
  }
  const line = (key, color) => {
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    samples.forEach((s, i) => (i ? g.lineTo(x(i), y(s[key])) : g.moveTo(x(i), y(s[key]))));
    g.stroke();
  };
  line("reserved", "#6b7280"); line("allocated", "#2563eb");
  g.fillStyle = "#6b7280"; g.textAlign = "center"; g.textBaseline = "top";
  for (const t of countTicks(n)) { g.fillText(String(t), x(t), bottom + 4); g.fillRect(x(t), bottom, 1, 3); }
  g.fillText("step: one allocation or free each (the last two: everything freed, then empty_cache)", left + w / 2, bottom + 20);
  g.textAlign = "left"; g.textBaseline = "middle";
  g.fillStyle = "#2563eb"; g.fillText("allocated (asked for)", left + 10, 10); g.fillStyle = "#6b7280"; g.fillText("reserved (held from the device: in use and cached)", left + 170, 10);
}

async function memory(dv) {
  dv.empty_cache(); // start from nothing: the benchmark's buffers were cached
  const before = dv.stats();
  const live = [];
  let seed = 7;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  for (let step = 0; step < 120; step++) {
    if (live.length && (rnd(3) === 0 || live.length > 24)) {
      dv.deallocate(live.splice(rnd(live.length), 1)[0]);
    } else {
      live.push(dv.allocate(1024 * (1 + rnd(4096))));
    }
    const s = dv.stats();
    results.memory.push({ allocated: s.allocated, reserved: s.reserved });
    if (step % 10 === 0) { drawMemory(results.memory); await new Promise((r) => setTimeout(r, 0)); }
  }
  live.forEach((p) => dv.deallocate(p));
  const s = dv.stats();
  results.memory.push({ allocated: s.allocated, reserved: s.reserved });
  const freed = dv.empty_cache();
  results.memory.push({ allocated: 0, reserved: dv.stats().reserved });
  drawMemory(results.memory);
  const peakA = Math.max(...results.memory.map((m) => m.allocated)), peakR = Math.max(...results.memory.map((m) => m.reserved));
  results.cache = { hits: s.hits - before.hits, misses: s.misses - before.misses, freedOnEmpty: freed, peakAllocated: peakA, peakReserved: peakR };
  $("memnote").textContent = `On this chart: peak ${human(peakA)} allocated, ${human(peakR)} reserved; `
    + `${results.cache.hits} cache hits / ${results.cache.misses} misses; empty_cache gave back ${human(freed)}. `
    + `(The allocator's lifetime peaks, the benchmark above included: ${human(s.peakAllocated)} allocated, ${human(s.peakReserved)} reserved.)`;
}

// Numbers from JS that do not fit must be exceptions naming the argument, never wrapped.
async function hostileInputs(dv) {
  const cases = [
    ["allocate(2**32 + 16)", () => dv.allocate(2 ** 32 + 16), /^nbytes is too large: 4294967312 bytes; at most 4294967295 on wasm32$/],
    ["allocate(2**52)", () => dv.allocate(2 ** 52), /^nbytes is too large: 4503599627370496 bytes/],
    ["allocate(2**53)", () => dv.allocate(2 ** 53), /^nbytes is too large: 9007199254740992 bytes/],
    ["allocate(Infinity)", () => dv.allocate(Infinity), /^nbytes is too large: Infinity bytes/],
    ["allocate(1.5)", () => dv.allocate(1.5), /^nbytes must be a whole number of bytes, got 1\.5$/],
    ["allocate(-1)", () => dv.allocate(-1), /^nbytes must not be negative, got -1$/],
    ["allocate(NaN)", () => dv.allocate(NaN), /^nbytes must be a number of bytes, got NaN$/],
    ["allocate('64')", () => dv.allocate("64"), /^nbytes must be a number of bytes, got the string "64"$/],
    ["allocate(64n)", () => dv.allocate(64n), /^nbytes must be a number of bytes, got 64n$/],
    ["allocate()", () => dv.allocate(), /^nbytes must be a number of bytes, got undefined$/],
    ["allocate(64, 3)", () => dv.allocate(64, 3), /power of two/],
    ["allocate(64, 2**32)", () => dv.allocate(64, 2 ** 32), /^alignment is too large: 4294967296 bytes/],
    ["read(ptr, 2**32 + 1)", async () => { const p = dv.allocate(64); try { await dv.read(p, 2 ** 32 + 1); } finally { dv.deallocate(p); } }, /^len is too large: 4294967297 bytes/],
    ["read(ptr, -4)", async () => { const p = dv.allocate(64); try { await dv.read(p, -4); } finally { dv.deallocate(p); } }, /^len must not be negative, got -4$/],
    ["read(ptr, 2**32 - 1)", async () => { const p = dv.allocate(64); try { await dv.read(p, 2 ** 32 - 1); } finally { dv.deallocate(p); } }, /^len is too large: 4294967295 bytes do not fit in this page's memory$/],
    ["bench(2**30, 1)", async () => dv.bench(2 ** 30, 1), /^size must be from 1 to 268435456 bytes/],
    ["read_f32(ptr, 2**30)", async () => { const p = dv.allocate(64); try { await dv.read_f32(p, 2 ** 30); } finally { dv.deallocate(p); } }, /^count is too large: 1073741824 floats/],
    ["read(5, 4) (a Number, not a BigInt)", async () => dv.read(5, 4), /^ptr must be a BigInt device address \(as allocate returns, e\.g\. 4096n\), got 5$/],
    ["deallocate(-1n)", () => dv.deallocate(-1n), /^ptr must be from 0n to 2n\*\*64n - 1n, got -1n$/],
    ["deallocate(2n**64n)", () => dv.deallocate(2n ** 64n), /^ptr must be from 0n to 2n\*\*64n - 1n, got 18446744073709551616n$/],
    ["deallocate('0x10')", () => dv.deallocate("0x10"), /got the string "0x10"$/],
    ["runNetworkOn(ptr, [1e9, 1e9]) (a model no allocation holds)", async () => { const p = dv.allocate(64); try { await dv.runNetworkOn(p, [1e9, 1e9]); } finally { dv.deallocate(p); } }, /^the model at 0x[0-9a-f]+ has 64 bytes from there, and layers of \[1000000000, 1000000000\] need \d+$/],
    ["runNetworkOn(ptr, '512,10')", async () => { const p = dv.allocate(64); try { await dv.runNetworkOn(p, "512,10"); } finally { dv.deallocate(p); } }, /^widths must be an array of layer widths, got the string "512,10"$/],
    ["write(ptr + 60n, 8 bytes) past the end", async () => { const p = dv.allocate(64); try { await dv.write(p + 60n, new Uint8Array(8)); } finally { dv.deallocate(p); } }, /out of bounds/],
  ];
  const before = dv.stats();
  results.hostile = [];
  for (const [name, f, want] of cases) {
    let message = null;
    try { await f(); } catch (e) { message = String(e && e.message || e); }
    results.hostile.push({ name, threw: message !== null, ok: message !== null && want.test(message) && !/JsValue\(/.test(message), message });
  }
  const after = dv.stats();
  results.hostileStatsKept = after.live === before.live && after.allocated === before.allocated;
  const bad = results.hostile.filter((h) => !h.ok).length;
  $("hostile").innerHTML = `${bad ? `<span class="bad">${bad} not refused as expected</span>` : `<span class="ok">all ${results.hostile.length} refused</span>`}`
    + ` with an exception that names the argument, the stats unchanged${results.hostileStatsKept ? "" : ` <span class="bad">(they changed)</span>`}; e.g. <code>${results.hostile[0].message}</code>`;
}

// The page's own allocator in the viewer: recording its history while it runs a few layers of
// a network on a memory plan (WebGL2 has no compute shaders: the network refuses, and a few
// plain allocations stand in).
async function ownHistory(dv, show) {
  dv.record_history(10000);
  if (dv.backend !== "webgpu") {
    results.networkSkipped = await dv.run_network().then(() => null, (e) => String(e && e.message || e));
    const ptrs = [1 << 20, 64 << 10, 4096, 256 << 10].map((n) => dv.allocate(n));
    ptrs.splice(1, 2).forEach((p) => dv.deallocate(p));
    ptrs.forEach((p) => dv.deallocate(p));
  } else {
    status("running a network on a memory plan…", "running");
    results.network = await dv.run_network();
  }
  const snap = dv.snapshot();
  dv.record_history(0);
  if (show) results.viewer = viewer.render(snap, "this page's allocator");
  const n = results.network;
  // The network's plan, unless ?plan= asked for another.
  if (!results.plan && n) {
    results.plan = renderPlan({ tensors: n.tensors, unplanned: n.unplannedBytes }, "this page's network: its activations on devalloc's plan");
  } else if (!results.plan) {
    results.plan = showNoPlan("No plan from this page's own run: its network needs compute shaders, which WebGL2 lacks. "
      + "Open a plan CSV (id,lower,upper,size,offset, as `cargo run --release --example plan -- FILE.csv --out DIR` writes) to draw one.");
  }
  if (show && n) {
    const kib = (b) => `${(Number(b) / 1024).toFixed(0)} KiB`;
    $("viewer-summary").textContent += `. The network's activations take ${kib(n.plannedBytes)} on devalloc's plan`
      + ` (the most live at once: ${kib(n.lowerBound)}), against ${kib(n.unplannedBytes)} one after another.`;
  }
}

// A snapshot named by ?snapshot=URL (same origin), shown before anything else.
async function snapshotFromUrl(url) {
  status(`opening the snapshot ${url}…`, "running");
  try {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const text = await response.text();
    results.viewer = viewer.render(text, url);
    results.viewerShownMs = performance.now();
  } catch (e) {
    results.viewer = undefined;
    results.viewerError = `snapshot ${url}: ${e && e.message || e}`;
    showBad($("viewer-summary"), results.viewerError);
  }
}

// A plan CSV named by ?plan=URL (same origin), shown instead of the page's own plan.
async function planFromUrl(url) {
  try {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    results.plan = renderPlanCsv(await response.text(), url);
  } catch (e) {
    results.plan = showNoPlan(`plan ${url}: ${e && e.message || e}`, true, url);
  }
  results.planShownMs = performance.now();
}

// A file opened in the viewer (picker or drop): a plan CSV, or a snapshot.
function openFile(text, name) {
  if (isPlanCsv(text, name)) { results.plan = renderPlanCsv(text, name); return; }
  try { results.viewer = viewer.render(text, name); } catch (e) { showBad($("viewer-summary"), `${name}: ${e.message}`); }
}
// A message that quotes a file (its name, a parse error) shown as text, never as HTML.
function showBad(el, text) {
  const span = document.createElement("span");
  span.className = "bad";
  span.textContent = text;
  el.replaceChildren(span);
}

// The browser took the GPU away: say so, show that devalloc now answers DeviceLost, offer to
// start again.
let dvRef = null, keep = null;
async function onLost(message) {
  results.lost = { message, calls: dvRef ? dvRef.lostCalls : null, probes: [] };
  status("the GPU was lost", "bad");
  const probe = async (name, f) => {
    let error = null;
    try { await f(); } catch (e) { error = String(e && e.message || e); }
    results.lost.probes.push({ name, error });
  };
  if (dvRef) {
    await probe("allocate(64)", () => dvRef.allocate(64));
    if (keep !== null) {
      await probe("write(kept, 4 bytes)", () => dvRef.write(keep, new Uint8Array(4)));
      await probe("read(kept, 4)", () => dvRef.read(keep, 4));
    }
    results.lost.calls = dvRef.lostCalls;
  }
  const rows = results.lost.probes.map((p) => `<li><code>${p.name}</code>: ${p.error === null ? "<span class=\"bad\">succeeded</span>" : p.error}</li>`).join("");
  $("lost").hidden = false;
  $("lost-text").innerHTML = `The browser took the GPU away. devalloc said: <code>${message}</code>. `
    + `From now on every call fails with devalloc's DeviceLost:<ul>${rows}</ul>`
    + `The page's work stopped; what it had measured stays below. Start again to open a new device.`;
  document.title = "devalloc: lost";
  publish();
}

async function main() {
  const wasm = init();
  viewer.setReplayer(async (json, index, limit) => { await wasm; return replay_snapshot(json, index, limit); });
  viewer.acceptFiles(openFile);
  $("restart").addEventListener("click", () => location.reload());
  const params = new URLSearchParams(location.search);
  const url = params.get("snapshot"), planUrl = params.get("plan");
  try {
    if (url) await snapshotFromUrl(url);
    if (planUrl) await planFromUrl(planUrl);
    await wasm;
    status("opening the GPU…", "running");
    const dv = await Devalloc.init((message) => onLost(message));
    dvRef = dv;
    window.devalloc = dv; // for the console
    window.devallocViewer = viewer;
    showDevice(dv);
    await roundTrip(dv);
    await hostileInputs(dv);
    status("loading a model…", "running");
    results.model = await loadModel(dv, (await wasm).memory, $); // before the bench grows wasm memory
    await throughput(dv);
    await memory(dv);
    await ownHistory(dv, !results.viewer);
    askCard(dv);
    window.devallocAsk = (how, n) => ask(dv, how, n); // for the e2e run's injected failures
    results.ask = await ask(dv, "async", 1 << 20);
    if (results.viewerError) $("viewer-summary").textContent = `${results.viewerError}; showing this page's allocator instead. ${$("viewer-summary").textContent}`;
    keep = dv.allocate(256); // kept, to show what a read or write says once the GPU is lost
    results.ok = results.roundTrip && results.hostile.every((h) => h.ok) && results.hostileStatsKept
      && results.ask.ok && results.model.ok
      && results.viewer && results.viewer.shown && results.viewer.shown.events > 0
      && (!results.network || results.network.maxError < 1e-3)
      && results.bench.every((r) => r.verified && ours(r.up).gbps > 0 && ours(r.down).gbps > 0);
    if (results.lost) return;
    status(results.ok ? `done on ${dv.backend === "webgpu" ? "WebGPU" : "WebGL2"}` : "done, with failures", results.ok ? "ok" : "bad");
    document.title = results.ok ? "devalloc: done" : "devalloc: failed";
  } catch (e) {
    results.error = String(e && e.message || e);
    if (!results.lost) {
      status(`failed: ${results.error}`, "bad");
      document.title = "devalloc: failed";
    }
  } finally {
    publish();
  }
}

main();
