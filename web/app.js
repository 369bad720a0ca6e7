// The devalloc browser demo: initialise, show the adapter, round-trip data, measure upload and
// download against plain wgpu, and chart allocated vs reserved memory. When done, the title
// says "devalloc: done" (or "devalloc: failed") and #results holds the figures as JSON.
import init, { Devalloc } from "./pkg/devalloc_web.js";
import * as viewer from "./viewer.js";

const $ = (id) => document.getElementById(id);
const results = { ok: false, backend: null, roundTrip: false, bench: [], latencyUs: null, memory: [] };
const round = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));
const human = (b) => (b >= 1 << 20 ? `${round(b / (1 << 20))} MiB` : b >= 1024 ? `${round(b / 1024)} KiB` : `${b} B`);
const gb = (v) => (v < 0.1 ? v.toFixed(4) : v.toFixed(2));

function status(text, cls) {
  const s = $("status");
  s.textContent = text;
  s.className = `status ${cls}`;
}

function showDevice(dv) {
  const adapter = dv.adapter();
  const limits = dv.limits();
  const rows = [
    ["backend", dv.backend === "webgpu" ? "WebGPU" : "WebGL2 (wgpu GL backend)"],
    ["adapter", adapter.name || "(the browser does not say)"],
    ["vendor / arch", `${adapter.vendor} / ${adapter.architecture}`],
    ["type", adapter.deviceType],
    ["max buffer", human(limits.maxBufferSize)],
    ["max storage binding", human(limits.maxStorageBufferBindingSize)],
    ["devices", dv.devices().map((d) => d.device).join(", ")],
  ];
  $("device").innerHTML = rows.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
  results.backend = dv.backend;
  results.adapter = adapter;
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
  results.roundTrip = floatsOk && raggedOk && errorOk;
  $("roundtrip").innerHTML = results.roundTrip
    ? `<span class="ok">verified</span>: ${n} floats written and read back, a ragged 5-byte write at offset 3 kept its neighbours, a double free was refused with an exception`
    : `<span class="bad">FAILED</span> (floats ${floatsOk}, ragged ${raggedOk}, double free refused ${errorOk})`;
}

const best = (methods) => methods.filter((m) => !m.ours).reduce((a, b) => (b.ms < a.ms ? b : a));
const ours = (methods) => methods.find((m) => m.ours);

function drawBars(rows) {
  const c = $("bw"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const series = [
    ["up devalloc", (r) => ours(r.up).gbps, "#2563eb"], ["up best peer", (r) => best(r.up).gbps, "#93c5fd"],
    ["down devalloc", (r) => ours(r.down).gbps, "#f59e0b"], ["down best peer", (r) => best(r.down).gbps, "#fcd34d"],
  ];
  const max = Math.max(0.001, ...rows.flatMap((r) => series.map(([, f]) => f(r))));
  const left = 50, bottom = c.height - 30, h = bottom - 30, groupW = (c.width - left - 10) / Math.max(rows.length, 3), barW = groupW / 5;
  g.font = "12px system-ui"; g.fillStyle = "#6b7280";
  for (let t = 0; t <= 4; t++) {
    const y = bottom - (h * t) / 4;
    g.fillText((max * t / 4).toFixed(2), 4, y + 4);
    g.strokeStyle = "#eee"; g.beginPath(); g.moveTo(left, y); g.lineTo(c.width, y); g.stroke();
  }
  rows.forEach((r, i) => {
    series.forEach(([, f, color], j) => {
      const v = f(r), bh = (h * v) / max, x = left + i * groupW + j * barW + barW / 2;
      g.fillStyle = color; g.fillRect(x, bottom - bh, barW - 2, bh);
    });
    g.fillStyle = "#1d2330"; g.fillText(human(r.size), left + i * groupW + groupW / 2 - 20, bottom + 16);
  });
  series.forEach(([label, , color], j) => { g.fillStyle = color; g.fillRect(left + j * 130, 8, 12, 12); g.fillStyle = "#1d2330"; g.fillText(label, left + j * 130 + 16, 18); });
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
        + `<tr>${names(r.up)}<th>ratio</th>${names(r.down)}<th>ratio</th></tr>`;
    }
    table.tBodies[0].insertAdjacentHTML("beforeend", benchRow(r));
    drawBars(results.bench);
  }
  const lat = await dv.bench(4, 30);
  results.latencyUs = Object.fromEntries(lat.down.map((m) => [m.name, m.ms * 1000]));
  results.latencyRatio = lat.downRatio;
  $("latency").textContent = "4-byte download latency (µs): "
    + lat.down.map((m) => `${m.name} ${(m.ms * 1000).toFixed(0)}`).join(", ") + " (browser timers are coarse)";
}

function drawMemory(samples) {
  const c = $("mem"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const max = Math.max(1, ...samples.map((s) => s.reserved));
  const left = 60, bottom = c.height - 20, h = bottom - 20, w = c.width - left - 10;
  g.font = "12px system-ui"; g.fillStyle = "#6b7280";
  g.fillText(human(Math.round(max)), 4, 24); g.fillText("0", 40, bottom);
  const line = (key, color) => {
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    samples.forEach((s, i) => { const x = left + (w * i) / Math.max(1, samples.length - 1), y = bottom - (h * s[key]) / max; i ? g.lineTo(x, y) : g.moveTo(x, y); });
    g.stroke();
  };
  line("reserved", "#9ca3af"); line("allocated", "#2563eb");
  g.fillStyle = "#2563eb"; g.fillText("allocated", left + 10, 14); g.fillStyle = "#9ca3af"; g.fillText("reserved", left + 90, 14);
}

async function memory(dv) {
  dv.empty_cache(); // start from nothing: the benchmark's buffers were cached
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
  results.cache = { hits: s.hits, misses: s.misses, freedOnEmpty: freed };
  $("memnote").textContent = `cache: ${s.hits} hits / ${s.misses} misses; peak allocated ${human(s.peakAllocated)}, peak reserved ${human(s.peakReserved)}; empty_cache gave back ${human(freed)}`;
}

// Numbers from JS that do not fit must be exceptions naming the argument, never wrapped.
async function hostileInputs(dv) {
  const cases = [
    ["allocate(2**32 + 16)", () => dv.allocate(2 ** 32 + 16), /nbytes/],
    ["allocate(2**52)", () => dv.allocate(2 ** 52), /nbytes|never be allocated/],
    ["allocate(2**53)", () => dv.allocate(2 ** 53), /nbytes/],
    ["allocate(1.5)", () => dv.allocate(1.5), /nbytes/],
    ["allocate(-1)", () => dv.allocate(-1), /nbytes/],
    ["allocate(NaN)", () => dv.allocate(NaN), /nbytes/],
    ["allocate('64')", () => dv.allocate("64"), /nbytes/],
    ["allocate(64, 3)", () => dv.allocate(64, 3), /power of two/],
    ["allocate(64, 2**32)", () => dv.allocate(64, 2 ** 32), /alignment/],
    ["read(ptr, 2**32 + 1)", async () => { const p = dv.allocate(64); try { await dv.read(p, 2 ** 32 + 1); } finally { dv.deallocate(p); } }, /len/],
    ["read(ptr, -4)", async () => { const p = dv.allocate(64); try { await dv.read(p, -4); } finally { dv.deallocate(p); } }, /len/],
    ["read(5, 4) (a Number, not a BigInt)", async () => dv.read(5, 4), /ptr must be a BigInt/],
    ["deallocate(-1n)", () => dv.deallocate(-1n), /ptr must be from 0/],
    ["deallocate(2n**64n)", () => dv.deallocate(2n ** 64n), /ptr must be from 0/],
    ["write(ptr + 60n, 8 bytes) past the end", async () => { const p = dv.allocate(64); try { await dv.write(p + 60n, new Uint8Array(8)); } finally { dv.deallocate(p); } }, /out of bounds/],
  ];
  const before = dv.stats();
  results.hostile = [];
  for (const [name, f, want] of cases) {
    let message = null;
    try { await f(); } catch (e) { message = String(e && e.message || e); }
    results.hostile.push({ name, threw: message !== null, ok: message !== null && want.test(message), message });
  }
  const after = dv.stats();
  results.hostileStatsKept = after.live === before.live && after.allocated === before.allocated;
}

// The memory viewer: a snapshot file named by ?snapshot=URL (same origin), else the page's own
// allocator recording its history while it runs a few layers of a network on a memory plan.
async function memoryViewer(dv) {
  viewer.acceptFiles((snap, name) => { results.viewer = viewer.render(snap, name); });
  const url = new URLSearchParams(location.search).get("snapshot");
  if (url) {
    status(`opening the snapshot ${url}…`, "running");
    const response = await fetch(url);
    if (!response.ok) throw new Error(`snapshot ${url}: HTTP ${response.status}`);
    results.viewer = viewer.render(await response.json(), url);
    return;
  }
  dv.record_history(10000);
  if (dv.backend !== "webgpu") {
    // WebGL2 has no compute shaders, so the network cannot run on the fallback: the call
    // refuses with the reason, and the viewer shows a few plain allocations instead.
    results.networkSkipped = await dv.run_network().then(() => null, (e) => String(e));
    const ptrs = [1 << 20, 64 << 10, 4096, 256 << 10].map((n) => dv.allocate(n));
    ptrs.splice(1, 2).forEach((p) => dv.deallocate(p));
    ptrs.forEach((p) => dv.deallocate(p));
  } else {
    status("running a network on a memory plan…", "running");
    results.network = { maxError: await dv.run_network() };
  }
  const snap = dv.snapshot();
  dv.record_history(0);
  results.viewer = viewer.render(snap, "this page's allocator");
}

async function main() {
  try {
    await init();
    status("opening the GPU…", "running");
    const dv = await Devalloc.init();
    showDevice(dv);
    await roundTrip(dv);
    await hostileInputs(dv);
    await throughput(dv);
    await memory(dv);
    await memoryViewer(dv);
    results.ok = results.roundTrip && results.hostile.every((h) => h.ok) && results.hostileStatsKept
      && results.viewer && results.viewer.shown && results.viewer.shown.events > 0
      && (!results.network || results.network.maxError < 1e-3)
      && results.bench.every((r) => r.verified && ours(r.up).gbps > 0 && ours(r.down).gbps > 0);
    status(results.ok ? `done on ${dv.backend === "webgpu" ? "WebGPU" : "WebGL2"}` : "done, with failures", results.ok ? "ok" : "bad");
    document.title = results.ok ? "devalloc: done" : "devalloc: failed";
  } catch (e) {
    results.error = String(e && e.message || e);
    status(`failed: ${results.error}`, "bad");
    document.title = "devalloc: failed";
  }
  $("results").textContent = JSON.stringify(results);
}

main();
