// End-to-end test of the browser demo: serves index.html and web/ on 127.0.0.1, opens the
// page in Debian's Chromium through Playwright's library (no browser download), waits until
// the demo says it is done, checks what it reports and that the console stayed clean, saves
// screenshots, then takes the GPU away the way the browser would (GPUDevice.destroy() from JS,
// or WEBGL_lose_context.loseContext()) and checks that the page says so and starts again.
// The viewer's plan view: the page's network's plan (WebGPU), and plan CSVs opened through
// the file picker (a small one, bad ones, one of 12,000 tensors), or --plan FILE by ?plan=.
// Exit status 0 when every check holds. Usage: see scripts/e2e-web.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, existsSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { ALLOWED_OOM, outOfMemory } from "./oom.mjs";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const args = process.argv.slice(2);
const flag = (name) => args.includes(name);
const value = (name, dflt) => (args.includes(name) ? args[args.indexOf(name) + 1] : dflt);
// Paths on the command line are relative to where scripts/e2e-web was run.
const fromCaller = (p) => (p === null ? null : resolve(process.env.E2E_CWD || process.cwd(), p));
const noWebgpu = flag("--no-webgpu");
// --snapshot FILE: a snapshot (e.g. from `cargo run --example tour -- --snapshot FILE`) under
// the repository, opened in the page's viewer through ?snapshot=.
const snapshotFile = fromCaller(value("--snapshot", null));
// --plan FILE: a plan CSV (e.g. from `cargo run --release --example plan -- IN.csv --out DIR`)
// under the repository, opened in the viewer's plan view through ?plan=.
const planFile = fromCaller(value("--plan", null));
const out = (name) => join(ROOT, "target", "web-e2e", `${name}${noWebgpu ? "-webgl" : ""}.png`);
const timelineShot = fromCaller(value("--timeline", out("timeline")));
const shot = fromCaller(value("--screenshot", out("demo")));
const lostShot = fromCaller(value("--lost-screenshot", shot.replace(/\.png$/, "-lost.png")));
const planShot = out("plan"), planCsvShot = out("plan-csv"), planLargeShot = out("plan-large");
const expectBackend = noWebgpu ? "gl" : "webgpu";
const browserPath = process.env.CHROMIUM || "/usr/bin/chromium";

if (!existsSync(join(ROOT, "web", "pkg", "devalloc_web.js"))) {
  console.error("e2e: web/pkg is missing: run scripts/build-web first");
  process.exit(2);
}

// Console lines the page cannot prevent, each with why; every other warning or error fails.
// While the page runs: Chromium's answer when a page asks for WebGPU and the browser has no
// adapter (the page must ask to know; it then says so on screen).
const ALLOWED_WHILE_RUNNING = noWebgpu ? [[/^warning: No available adapters\.$/, "Chromium, when asked for a WebGPU adapter it does not have"]] : [];
// Once the GPU is taken away: the browser's own note of a lost context, and devalloc's error
// log of the loss (a lost context is an error; a destroyed WebGPU device is logged as info).
const ALLOWED_AFTER_LOSS = noWebgpu
  ? [
    [/^warning: WebGL: CONTEXT_LOST_WEBGL: loseContext: context lost$/, "Chromium, when the page loses the context"],
    [/^warning: WebGL: INVALID_OPERATION: loseContext: context already lost$/, "Chromium, at the second loss"],
    [/^error: devalloc: a wgpu device was lost: the browser lost the WebGL2 context$/, "devalloc's log of the loss"],
  ]
  : [];

const freePort = () =>
  new Promise((ok, fail) => {
    const s = createServer();
    s.on("error", fail);
    s.listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => ok(port)); });
  });

async function waitForServer(url, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    try { if ((await fetch(url)).ok) return; } catch { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`the web server at ${url} did not come up`);
}

const checks = [];
const check = (name, ok) => checks.push([name, Boolean(ok)]);
const notes = [];
const note = (line) => notes.push(line);

// Sorts console lines into allowed (with the reason) and not.
function judge(lines, allowed, phase) {
  const bad = [];
  for (const line of lines) {
    const hit = allowed.find(([re]) => re.test(line));
    if (hit) note(`console (${phase}), allowed: ${line}  [${hit[1]}]`);
    else bad.push(line);
  }
  for (const line of bad) note(`console (${phase}): ${line}`);
  return bad;
}

// A plan of `n` tensors, each live for 3 steps, in 3 slots: valid, `n` tensors drawn.
function bigPlan(n) {
  const lines = ["id,lower,upper,size,offset"];
  for (let i = 0; i < n; i++) lines.push(`t${i},${i},${i + 3},${4096 + (i % 7) * 1024},${(i % 3) * 16384}`);
  return lines.join("\n") + "\n";
}

// Plan CSVs opened through the viewer's file picker (the path a dropped file takes too).
async function planFiles(page) {
  const open = async (name, text) => {
    await page.setInputFiles("#viewer-file", { name, mimeType: "text/csv", buffer: Buffer.from(text) });
    await page.waitForFunction((n) => { const p = window.devallocViewer.lastPlan(); return p && p.source === n; }, name, { timeout: 30_000 });
    return page.evaluate(() => ({ ...window.devallocViewer.lastPlan(), summary: document.getElementById("plan-summary").textContent, shown: !document.getElementById("plan").hidden }));
  };
  // Steps 1-3 hold 768 bytes each; d sits above the rest: 1280 bytes, 1.67x.
  const small = "id,lower,upper,size,offset\na,0,2,256,0\nb,1,3,512,256\nc,2,4,256,0\nd,3,5,512,768\n";
  const p = await open("small-plan.csv", small);
  check(`a plan CSV opened with the picker is drawn: ${p.drawn} tensors, planned ${p.size}, lower bound ${p.lowerBound}, one after another ${p.unplanned}: "${p.summary}"`,
    p.shown && p.drawn === 4 && p.size === 1280 && p.lowerBound === 768 && p.unplanned === 1536 && p.overlaps === 0
    && p.summary.includes("planned 1.25 KiB = 1.67x the lower bound") && p.summary.includes("one after another it would take 1.5 KiB"));
  await page.locator("#plan-view").screenshot({ path: planCsvShot });
  const bad = [
    ["backwards.csv", "id,lower,upper,size,offset\n0,0,4,100,0\n1,3,2,50,100\n", /^backwards\.csv:3: buffer 1: lower 3 is not below upper 2$/],
    ["problem.csv", "id,lower,upper,size\n0,0,4,100\n", /^problem\.csv:1: no `offset` column: this is a planning problem/],
    ["words.csv", "id,lower,upper,size,offset\n0,0,4,lots,0\n", /^words\.csv:2: `size` is not a whole number: "lots"$/],
  ];
  for (const [name, text, want] of bad) {
    const r = await open(name, text);
    check(`a bad plan CSV is refused in words naming its line, nothing drawn: ${r.summary}`, want.test(r.error || "") && r.summary === r.error && !r.shown);
  }
  const o = await open("overlap.csv", "id,lower,upper,size,offset\n0,0,2,100,0\n1,1,3,100,50\n");
  check(`a plan whose tensors overlap is drawn and called invalid: ${o.summary}`, o.shown && o.overlaps === 1 && /not a valid plan/.test(o.summary));
  const n = 12000;
  const big = await open("decode-12k.csv", bigPlan(n));
  check(`a plan of ${n} tensors is read and drawn in ${big.ms && big.ms.toFixed(0)} ms (under 1 s), none overlapping`, big.drawn === n && big.overlaps === 0 && big.ms < 1000);
  await page.locator("#plan-view").screenshot({ path: planLargeShot });
  console.log(`e2e: plan CSVs: ${p.summary} | ${n} tensors: ${big.ms.toFixed(0)} ms; screenshots ${planCsvShot}, ${planLargeShot}`);
  await hostileSnapshot(page);
}

// A snapshot file is anyone's: labels and names that are HTML must show as text, never run.
async function hostileSnapshot(page) {
  const evil = `<img src=x onerror="window.__devallocXss=1">`;
  const addr = "0x1000";
  const stats = { allocated_bytes: 64, reserved_bytes: 256, cached_bytes: 0, peak_allocated_bytes: 64, peak_reserved_bytes: 256, cache_hits: 0, cache_misses: 1 };
  const events = [
    { seq: 0, time_us: 0, kind: "alloc", addr, size: 64, capacity: 256, label: evil, from_cache: false },
    { seq: 1, time_us: 1, kind: "tensors", addr, tensors: [{ label: evil, offset: 0, size: 64 }] },
  ];
  // Live at the end, in two buffers (an allocation past one wgpu buffer), one size not a number.
  const segments = [{ offset: 0, size: 128 }, { offset: 128, size: evil }];
  const live = [{ addr, size: 64, capacity: 256, label: evil, block: 1, segments }];
  const snap = { format: "devalloc-snapshot", devices: [{ device: evil, name: evil, stats, live, history: { capacity: 16, dropped: 0, events } }] };
  const name = "hostile-snapshot.json";
  await page.setInputFiles("#viewer-file", { name, mimeType: "application/json", buffer: Buffer.from(JSON.stringify(snap)) });
  await page.waitForFunction((n) => document.getElementById("viewer-summary").textContent.includes(n), name, { timeout: 30_000 });
  await page.waitForTimeout(200);
  const r = await page.evaluate(() => ({ ran: window.__devallocXss, imgs: document.querySelectorAll("#viewer img").length,
    peak: document.getElementById("viewer-peak").textContent, events: document.getElementById("viewer-events").textContent }));
  check("a snapshot whose labels and names are HTML shows them as text and runs nothing",
    r.ran === undefined && r.imgs === 0 && r.peak.includes(evil) && r.events.includes("tensors named: <img"));
  check(`the peak table lists an allocation's buffers where it has several (${r.peak.match(/\(in [^)]*\)/)})`,
    /\(in 2 buffers: 128 B, [^)<]*\)/.test(r.peak));
}

const port = await freePort();
const server = spawn("python3", ["-m", "http.server", "--bind", "127.0.0.1", String(port)], { cwd: ROOT, stdio: "ignore" });
let browser;
let results = {};
let lostResults = null;
try {
  const query = new URLSearchParams();
  for (const [key, file] of [["snapshot", snapshotFile], ["plan", planFile]]) {
    if (!file) continue;
    if (!resolve(file).startsWith(ROOT + "/")) throw new Error(`--${key}: the file must be under the repository (the page can only fetch from there)`);
    query.set(key, resolve(file).slice(ROOT.length + 1));
  }
  const url = `http://127.0.0.1:${port}/index.html${String(query) ? `?${query}` : ""}`;
  await waitForServer(url, 30_000);
  browser = await chromium.launch({
    executablePath: browserPath,
    headless: true,
    args: [
      "--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking", "--disable-component-update",
      "--no-first-run", "--disable-sync",
      ...(noWebgpu ? ["--disable-features=WebGPU", "--use-angle=swiftshader", "--enable-unsafe-swiftshader"] : ["--enable-unsafe-webgpu"]),
    ],
  });
  const page = await browser.newPage({ viewport: { width: 1100, height: 1500 } });
  // The GPU objects the page makes, kept where this test can take them away as the browser
  // would: wgpu's GPUDevice, and the WebGL2 context wgpu's GL backend draws with.
  await page.addInitScript(() => {
    const kept = (window.__e2e = { devices: [], contexts: [] });
    if (window.GPUAdapter) {
      const request = GPUAdapter.prototype.requestDevice;
      GPUAdapter.prototype.requestDevice = async function (...a) { const d = await request.apply(this, a); kept.devices.push(d); return d; };
    }
    for (const C of [window.OffscreenCanvas, window.HTMLCanvasElement]) {
      if (!C) continue;
      const get = C.prototype.getContext;
      C.prototype.getContext = function (type, ...rest) {
        const ctx = get.call(this, type, ...rest);
        if (ctx && type === "webgl2" && !kept.contexts.includes(ctx)) kept.contexts.push(ctx);
        return ctx;
      };
    }
  });
  let consoleLines = [];
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") consoleLines.push(`${m.type()}: ${m.text()}`); });
  page.on("pageerror", (e) => consoleLines.push(`pageerror: ${e.message}`));
  await page.goto(url);
  let title = null;
  try {
    await page.waitForFunction(() => ["devalloc: done", "devalloc: failed"].includes(document.title), null, { timeout: 240_000 });
    title = await page.title();
  } catch (e) {
    console.log(`e2e: the demo did not finish: ${e.message}`);
  }
  const raw = await page.locator("#results").textContent();
  const status = await page.locator("#status").textContent();
  results = raw ? JSON.parse(raw) : { error: `the page did not finish: ${status}` };
  console.log(`e2e: page ${url}: title ${JSON.stringify(title)}, status ${JSON.stringify(status)}`);

  // The viewer: a snapshot's history replayed under limits typed into the page.
  const replay = async (limit) => {
    await page.fill("#replay-limit", limit);
    await page.click("#replay-run");
    await page.waitForFunction(() => document.getElementById("replay-result").textContent.length > 0);
    return page.evaluate(() => window.devallocViewer.lastReplay());
  };
  if (results.viewer && results.viewer.shown) {
    const v = results.viewer.shown;
    const free = await replay("");
    check(`a replay with no limit fits, and its peak live (${free && free.peakLive}) is the viewer's peak allocated (${v.peakBytes}) less what was live before recording (${v.beforeBytes})`,
      free && !free.failure && free.peakLive === v.peakBytes - v.beforeBytes);
    // Just under the most live at once: no allocator fits, and the replay says where.
    const tight = free.lowerBound - 1;
    const failed = await replay(String(tight));
    const seqs = new Set(v.steps.filter((s) => s[1] === "alloc").map((s) => s[0]));
    check(`under ${tight} bytes the replay stops at an allocation the viewer shows (event ${failed && failed.failure && failed.failure.step}), refused for want of memory: ${failed && failed.failure && failed.failure.error}`,
      failed && failed.failure && seqs.has(failed.failure.step) && /out of memory|can never be allocated/i.test(failed.failure.error));
    const roomy = await replay("1 GiB");
    check("under 1 GiB the replay fits", roomy && !roomy.failure);
    const bad = await page.evaluate(async () => { document.getElementById("replay-limit").value = "lots"; await window.devallocViewer.replayTyped(); return document.getElementById("replay-result").textContent; });
    check("a limit that is not a size is refused in words", /is not a size/.test(bad));
    await replay(String(tight)); // leave the failing replay drawn for the screenshot
    note(`replay: no limit: ${JSON.stringify(free)}; under ${tight}: fails at event ${failed.failure && failed.failure.step}`);
  }
  mkdirSync(dirname(shot), { recursive: true });
  await page.screenshot({ path: shot, fullPage: true });
  await page.locator("#viewer").screenshot({ path: timelineShot });
  const ownPlan = results.plan || {};
  if (ownPlan.drawn) await page.locator("#plan-view").screenshot({ path: planShot });
  console.log(`e2e: screenshots ${shot}, ${timelineShot}${ownPlan.drawn ? `, ${planShot}` : ""}`);
  if (ownPlan.text || ownPlan.none || ownPlan.error) console.log(`e2e: plan view: ${ownPlan.text || ownPlan.none || ownPlan.error}`);
  if (title) await planFiles(page);
  const whileRunning = judge(consoleLines, ALLOWED_WHILE_RUNNING, "while the page ran");
  check(`the console stayed clean while the page ran (${whileRunning.length} warnings or errors, listed above)`, whileRunning.length === 0);
  if (snapshotFile) {
    check(`the snapshot was drawn within 2 s of loading the page (${results.viewerShownMs && results.viewerShownMs.toFixed(0)} ms)`, results.viewerShownMs > 0 && results.viewerShownMs < 2000);
    const steps = (results.viewer && results.viewer.shown && results.viewer.shown.steps) || [];
    const from = steps.findIndex((s) => s[2] === "input.step1");
    // The repeating workload's steps, up to its growing KV cache (whose old sizes the budget gives back).
    const to = steps.findIndex((s, k) => k > from && (s[1] === "evict" || (s[2] || "").startsWith("kv.")));
    const reserved = new Set(steps.slice(from, to > from ? to : undefined).map((s) => s[4]));
    check(`the tour's reserved bytes are drawn flat from step 1 (event ${from >= 0 ? steps[from][0] : "?"}) on: ${[...reserved].join(", ")}`, from > 0 && reserved.size === 1);
    check("the tour's history accounts for every byte reserved at the end", steps.length && steps[steps.length - 1][4] === results.viewer.shown.reservedNow);
  }
  if (planFile) {
    const rows = readFileSync(planFile, "utf8").split("\n").filter((l) => l.trim()).length - 1;
    check(`the plan ${planFile} was drawn through ?plan= within 2 s of loading the page (${results.planShownMs && results.planShownMs.toFixed(0)} ms): ${ownPlan.drawn} of its ${rows} tensors, no two overlapping, ${ownPlan.ratio}x the lower bound`,
      results.planShownMs > 0 && results.planShownMs < 2000 && ownPlan.drawn === rows && ownPlan.overlaps === 0 && ownPlan.ratio >= 1 && ownPlan.source.endsWith(planFile.split("/").pop()));
  }

  // The browser runs out of memory (injected), and the page goes on.
  if (title === "devalloc: done" && !noWebgpu) {
    consoleLines = [];
    await outOfMemory(page, ROOT, check, note);
    const oomLines = judge(consoleLines, [...ALLOWED_WHILE_RUNNING, ...ALLOWED_OOM], "out of memory");
    check(`nothing but devalloc's own warning in the console while out of memory (${oomLines.length} other lines)`, oomLines.length === 0);
  }

  // The browser takes the GPU away.
  if (title === "devalloc: done") {
    consoleLines = [];
    const take = () => page.evaluate(() => {
      const k = window.__e2e;
      if (k.devices.length) { k.devices.at(-1).destroy(); return "GPUDevice.destroy()"; }
      k.ext = k.ext || k.contexts.at(-1).getExtension("WEBGL_lose_context");
      k.ext.loseContext();
      return "WEBGL_lose_context.loseContext()";
    });
    const how = await take();
    try {
      await page.waitForFunction(() => document.title === "devalloc: lost", null, { timeout: 15_000 });
    } catch (e) {
      console.log(`e2e: the page did not say the GPU was lost: ${e.message}`);
    }
    await take(); // a second loss
    // Not a wait for an event: the check below is that a second loss fires NO second callback,
    // and there is no event for a callback that never comes. The first loss is awaited above
    // (the page's title); this pause is the window a wrongly repeated callback gets to show up.
    await page.waitForTimeout(500);
    lostResults = JSON.parse(await page.locator("#results").textContent()).lost || null;
    const calls = await page.evaluate(() => window.devalloc.lostCalls);
    const shown = await page.locator("#lost").isVisible();
    check(`after ${how} the page says the GPU was lost and offers to start again`, shown && await page.locator("#restart").isVisible());
    check(`devalloc's on_device_lost fired once, a second loss included (${calls})`, calls === 1 && lostResults && lostResults.calls === 1);
    const probes = (lostResults && lostResults.probes) || [];
    check(`every call after the loss failed with DeviceLost (${probes.map((p) => p.name).join(", ")})`, probes.length === 3 && probes.every((p) => /was lost/.test(p.error || "")));
    check(`the loss was named: ${lostResults && lostResults.message}`, lostResults && (noWebgpu ? /WebGL2 context/ : /Destroyed/).test(lostResults.message));
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: lostShot, fullPage: false });
    const afterLoss = judge(consoleLines, ALLOWED_AFTER_LOSS, "after the loss");
    check(`nothing but the loss itself in the console after it (${afterLoss.length} other lines)`, afterLoss.length === 0);
    // Start again: the page reloads and opens a new device.
    consoleLines = [];
    await page.click("#restart");
    try {
      await page.waitForSelector("#roundtrip .ok", { timeout: 60_000 });
      check("after starting again, a new device round-trips data", true);
    } catch (e) {
      check(`after starting again, a new device round-trips data (${e.message})`, false);
    }
    const restarted = judge(consoleLines, ALLOWED_WHILE_RUNNING, "after starting again");
    check(`the console stayed clean after starting again (${restarted.length} lines)`, restarted.length === 0);
  } else {
    check("the page finished, so the GPU could be taken away", false);
  }
} finally {
  if (browser) await browser.close();
  server.kill();
}

check("the page finished without an error", results.ok && !results.error);
check("the round trip was verified", results.roundTrip);
const streamed = results.stream || {};
check(`writeFromStream streamed a fetch body onto the device (${streamed.wrote} bytes, ${streamed.calls} progress calls)`, streamed.wrote > 0 && streamed.calls > 0);
// The model card: the file scripts/make-model wrote beside the page, streamed onto the device.
const model = results.model || {};
const modelFile = readFileSync(join(ROOT, "web", "pkg", "model.bin"));
const modelSha = createHash("sha256").update(modelFile).digest("hex");
check(`the model card streamed web/pkg/model.bin onto the device: ${model.bytes} of ${modelFile.length} bytes, ${model.calls} progress calls, the bar at ${model.barValue} of ${model.barMax}; the device's bytes read back are the file's (SHA-256 ${String(model.sha256).slice(0, 16)})`,
  model.bytes === modelFile.length && model.calls > 1 && model.barValue === modelFile.length && model.barMax === modelFile.length && model.sha256 === modelSha);
if (noWebgpu) {
  // Not flat on WebGL2 (web/model.js says why): said, not checked (issue 39).
  console.log(`e2e: note wasm memory grew by ${model.memoryGrowth} bytes while ${model.bytes} streamed on WebGL2 (not flat there: wgpu's GL backend keeps each staging buffer in wasm memory)`);
} else {
  check(`wasm memory stayed flat while the model streamed: it grew by ${model.memoryGrowth} bytes (at most 16 MiB, twice the window, and under half the file)`,
    model.memoryGrowth >= 0 && model.memoryGrowth <= 16 << 20 && model.memoryGrowth < modelFile.length / 2);
}
check(noWebgpu ? `the model card says the network needs compute shaders: ${model.networkSkipped}` : `the network ran on the streamed weights and matched the CPU (max error ${model.maxError})`,
  noWebgpu ? /compute/.test(model.networkSkipped || "") : model.maxError < 1e-3);
if (model.bench) {
  // Speed is printed, not checked (a benchmark, not a timed test); that every result verified is checked.
  const [ours, hand] = model.bench.methods;
  console.log(`e2e: stream bench (${model.bench.bytes} bytes from memory, median of 3, interleaved): ${ours.name} ${ours.gbps.toFixed(3)} GB/s, ${hand.name} ${hand.gbps.toFixed(3)} GB/s: ${model.bench.ratio.toFixed(2)}x`);
  check("the stream bench verified every result of both methods (SHA-256 of the bytes read back)", model.bench.verified);
} else if (!noWebgpu) {
  check("the stream bench ran on WebGPU", false);
}
check(`backend is ${expectBackend}`, results.backend === expectBackend);
const hostile = results.hostile || [];
check(`every hostile JS argument was refused with an exception in JS's words (${hostile.length} cases)`, hostile.length > 15 && hostile.every((h) => h.ok));
check("refused JS calls changed no stats", results.hostileStatsKept);
const bench = results.bench || [];
const sizes = [4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
check("throughput measured from 4 KiB to 64 MiB", JSON.stringify(bench.map((b) => b.size)) === JSON.stringify(sizes));
const downPeers = noWebgpu ? 3 : 4;
check("every method of every size measured, its data verified",
  bench.length && bench.every((b) => b.verified && b.up.length === 3 && b.down.length === downPeers && [...b.up, ...b.down].every((m) => m.gbps > 0)));
const lat = results.latency || {};
check(`the 4-byte latency timed over ${lat.reads} reads a sample, and no two methods read alike to the microsecond`,
  lat.reads >= 10 && lat.us && Object.values(lat.us).every((us) => us > 0) && new Set(Object.values(lat.us).map((us) => us.toFixed(1))).size > 1);
check("memory chart fed with allocated <= reserved", results.memory && results.memory.every((m) => m.allocated <= m.reserved));
check("the memory note's peaks are the chart's", results.cache && results.cache.peakReserved === Math.max(...results.memory.map((m) => m.reserved)));
const v = results.viewer || {};
check(snapshotFile ? `the viewer drew the snapshot ${snapshotFile}` : "the viewer drew the page's own history",
  v.shown && v.shown.events > 0 && v.shown.peakBytes > 0 && (!snapshotFile || v.source.includes(snapshotFile.split("/").pop())));
check(`every label of the viewer has a colour of its own, none gray (${v.shown && v.shown.coloured} of ${v.shown && v.shown.labels} labels in ${v.shown && v.shown.families} colour groups)`, v.shown && v.shown.coloured === v.shown.labels);
if (!snapshotFile && !noWebgpu) check("the viewer outlines the network's planned buffer", v.shown && v.shown.planned > 0);
if (!snapshotFile && !noWebgpu) {
  const names = (v.shown && v.shown.tensors) || [];
  check(`the viewer names the network's planned tensors (${names.join(", ")})`, names.includes("input") && v.shown.tensorsShown);
}
if (snapshotFile) {
  // The tour's growing KV cache: the pool's budget gives old sizes back, and reserved falls there.
  const steps = (v.shown && v.shown.steps) || [];
  const falls = steps.filter((s, k) => k > 0 && s[1] === "evict" && s[4] < steps[k - 1][4]).length;
  check(`the viewer shows reserved falling where the pool gave cached blocks back (${falls} times)`, falls > 0);
}
const plan = results.plan || {};
if (noWebgpu) {
  check(`the network is refused for want of compute shaders, on gl: ${results.networkSkipped}`, /not supported on gl/.test(results.networkSkipped || "") && /compute shaders/.test(results.networkSkipped || "") && !results.network);
  if (!planFile) check(`the plan view says why the page has no plan of its own: ${plan.none}`, /WebGL2 lacks/.test(plan.none || "") && !plan.drawn);
} else {
  check("the network on a memory plan matched the CPU", results.network && results.network.maxError < 1e-3);
  const n = results.network || {};
  check(`the plan reuses memory: ${n.plannedBytes} bytes planned, ${n.lowerBound} live at most, ${n.unplannedBytes} one after another`,
    n.plannedBytes >= n.lowerBound && n.plannedBytes < n.unplannedBytes);
  if (!planFile) {
    const tensors = n.tensors || [];
    const ratio = n.plannedBytes / n.lowerBound;
    check(`the viewer draws the network's plan: ${plan.drawn} of its ${tensors.length} tensors, its size (${plan.size}) and lower bound (${plan.lowerBound}, computed in JS) the planner's, "${ratio.toFixed(2)}x the lower bound" stated`,
      tensors.length > 0 && plan.drawn === tensors.length && plan.size === n.plannedBytes && plan.lowerBound === n.lowerBound
      && plan.overlaps === 0 && (plan.text || "").includes(`${ratio.toFixed(2)}x the lower bound`));
  }
}
if (v.shown) console.log(`e2e: viewer: ${v.source}: ${v.shown.device}, ${v.shown.events} events, peak ${v.shown.peakBytes} allocated / ${v.shown.peakReserved} reserved, ${v.shown.labels} labels`);

console.log(`e2e: adapter ${JSON.stringify(results.adapter)}`);
for (const h of hostile) if (!h.ok) console.log(`e2e: hostile ${h.name}: ${h.threw ? `threw "${h.message}"` : "did not throw"}`);
if (bench.length) {
  const names = (ms) => ms.map((m) => m.name.padStart(16)).join("");
  console.log(`e2e: upload GB/s (interleaved medians)\ne2e: ${"size".padStart(9)}${names(bench[0].up)}   devalloc/best peer`);
  for (const b of bench) console.log(`e2e: ${String(b.size).padStart(9)}${b.up.map((m) => m.gbps.toFixed(3).padStart(16)).join("")}   ${b.upRatio.toFixed(2)}x (${b.upBestPeer})`);
  console.log(`e2e: download GB/s\ne2e: ${"size".padStart(9)}${names(bench[0].down)}   devalloc/best peer`);
  for (const b of bench) console.log(`e2e: ${String(b.size).padStart(9)}${b.down.map((m) => m.gbps.toFixed(3).padStart(16)).join("")}   ${b.downRatio.toFixed(2)}x (${b.downBestPeer})`);
  for (const s of bench[0].skipped || []) console.log(`e2e: not measured: ${s.name}: ${s.why}`);
}
if (lat.us) console.log(`e2e: 4-byte download, per read (${lat.samples} samples of ${lat.reads} reads): ${Object.entries(lat.us).map(([k, us]) => `${k} ${us.toFixed(1)} us`).join(", ")}; devalloc/best peer ${lat.ratio.toFixed(2)}x`);
if (lostResults) console.log(`e2e: lost: ${JSON.stringify(lostResults)}`);
for (const line of notes) console.log(`e2e: ${line}`);
const failed = checks.filter(([, ok]) => !ok);
for (const [name, ok] of checks) console.log(`e2e: ${ok ? "ok  " : "FAIL"} ${name}`);
if (results.error) console.log(`e2e: the page reported: ${results.error}`);
console.log(`${checks.length - failed.length} passed, ${failed.length} failed`);
process.exit(failed.length ? 1 : 0);
