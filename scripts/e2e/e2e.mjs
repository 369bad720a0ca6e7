// End-to-end test of the browser demo: serves index.html and web/ on 127.0.0.1, opens the
// page in Debian's Chromium through Playwright's library (no browser download), waits until
// the demo says it is done, checks what it reports and saves a screenshot. Exit status 0 when
// every check holds. Usage: see scripts/e2e-web.
import { spawn } from "node:child_process";
import { mkdirSync, existsSync, mkdtempSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

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
const timelineShot = fromCaller(value("--timeline", join(ROOT, "target", "web-e2e", noWebgpu ? "timeline-webgl.png" : "timeline.png")));
const expectBackend = noWebgpu ? "gl" : "webgpu";
const shot = fromCaller(value("--screenshot", join(ROOT, "target", "web-e2e", noWebgpu ? "demo-webgl.png" : "demo.png")));
const browserPath = process.env.CHROMIUM || "/usr/bin/chromium";

if (!existsSync(join(ROOT, "web", "pkg", "devalloc_web.js"))) {
  console.error("e2e: web/pkg is missing: run scripts/build-web first");
  process.exit(2);
}

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

const port = await freePort();
const server = spawn("python3", ["-m", "http.server", "--bind", "127.0.0.1", String(port)], { cwd: ROOT, stdio: "ignore" });
let browser;
let results;
const checks = [];
const check = (name, ok) => checks.push([name, Boolean(ok)]);
try {
  const rel = snapshotFile ? resolve(snapshotFile).slice(ROOT.length + 1) : null;
  if (snapshotFile && !resolve(snapshotFile).startsWith(ROOT + "/")) throw new Error("--snapshot: the file must be under the repository (the page can only fetch from there)");
  const url = `http://127.0.0.1:${port}/index.html${rel ? `?snapshot=${encodeURIComponent(rel)}` : ""}`;
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
  const consoleLines = [];
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
  mkdirSync(dirname(shot), { recursive: true });
  await page.screenshot({ path: shot, fullPage: true });
  await page.locator("#viewer").screenshot({ path: timelineShot });
  console.log(`e2e: page ${url}: title ${JSON.stringify(title)}, status ${JSON.stringify(status)}`);
  console.log(`e2e: screenshot saved to ${shot}`);
  for (const line of consoleLines.slice(0, 20)) console.log(`e2e: console ${line}`);
  results = raw ? JSON.parse(raw) : { error: `the page did not finish: ${status}` };
} finally {
  if (browser) await browser.close();
  server.kill();
}

check("the page finished without an error", results.ok && !results.error);
check("the round trip was verified", results.roundTrip);
check(`backend is ${expectBackend}`, results.backend === expectBackend);
const hostile = results.hostile || [];
check(`every hostile JS argument was refused with an exception naming it (${hostile.length} cases)`, hostile.length > 10 && hostile.every((h) => h.ok));
check("refused JS calls changed no stats", results.hostileStatsKept);
const bench = results.bench || [];
const sizes = [4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
check("throughput measured from 4 KiB to 64 MiB", JSON.stringify(bench.map((b) => b.size)) === JSON.stringify(sizes));
check("every method of every size measured, its data verified",
  bench.length && bench.every((b) => b.verified && b.up.length === 3 && b.down.length === 4 && [...b.up, ...b.down].every((m) => m.gbps > 0)));
check("4-byte latency measured", ((results.latencyUs || {}).devalloc || 0) > 0);
check("memory chart fed with allocated <= reserved", results.memory && results.memory.every((m) => m.allocated <= m.reserved));
const v = results.viewer || {};
check(snapshotFile ? `the viewer drew the snapshot ${snapshotFile}` : "the viewer drew the page's own history",
  v.shown && v.shown.events > 0 && v.shown.peakBytes > 0 && (!snapshotFile || v.source.includes(snapshotFile.split("/").pop())));
if (!snapshotFile && noWebgpu) check("the network is refused for want of compute shaders, with that reason", /compute shaders/.test(results.networkSkipped || "") && !results.network);
else if (!snapshotFile) check("the network on a memory plan matched the CPU", results.network && results.network.maxError < 1e-3);
console.log(`e2e: viewer: ${JSON.stringify(v)}; timeline screenshot ${timelineShot}`);

console.log(`e2e: adapter ${JSON.stringify(results.adapter)}`);
for (const h of hostile) if (!h.ok) console.log(`e2e: hostile ${h.name}: ${h.threw ? `threw "${h.message}"` : "did not throw"}`);
if (bench.length) {
  const names = (ms) => ms.map((m) => m.name.padStart(15)).join("");
  console.log(`e2e: upload GB/s (interleaved medians)\ne2e: ${"size".padStart(9)}${names(bench[0].up)}   devalloc/best peer`);
  for (const b of bench) console.log(`e2e: ${String(b.size).padStart(9)}${b.up.map((m) => m.gbps.toFixed(3).padStart(15)).join("")}   ${b.upRatio.toFixed(2)}x (${b.upBestPeer})`);
  console.log(`e2e: download GB/s\ne2e: ${"size".padStart(9)}${names(bench[0].down)}   devalloc/best peer`);
  for (const b of bench) console.log(`e2e: ${String(b.size).padStart(9)}${b.down.map((m) => m.gbps.toFixed(3).padStart(15)).join("")}   ${b.downRatio.toFixed(2)}x (${b.downBestPeer})`);
}
if (results.latencyUs) console.log(`e2e: 4-byte download (us): ${Object.entries(results.latencyUs).map(([k, v]) => `${k} ${v.toFixed(0)}`).join(", ")}; devalloc/best peer ${results.latencyRatio.toFixed(2)}x`);
const failed = checks.filter(([, ok]) => !ok);
for (const [name, ok] of checks) console.log(`e2e: ${ok ? "ok  " : "FAIL"} ${name}`);
if (results.error) console.log(`e2e: the page reported: ${results.error}`);
console.log(`${checks.length - failed.length} passed, ${failed.length} failed`);
process.exit(failed.length ? 1 : 0);
