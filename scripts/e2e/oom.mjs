// The page runs out of memory (WebGPU): the fault injector of the WebGPU suite
// (tests/conformance/oom_injector.js) wraps the page's GPUDevice, chosen buffer creations fail
// as WebGPU specifies (an out-of-memory error in the scope pushed around them), and the page's
// "Ask for memory" card must show each refusal as out of memory, keep devalloc's stats, and go
// on working. Every injected failure must be reported: through allocateAsync at once, through
// allocate at the allocation's next use. The console may show devalloc's own warning for the
// sync path and nothing else.
import { readFileSync } from "node:fs";
import { join } from "node:path";

// devalloc's warning when the browser refuses a buffer `allocate` already returned.
export const ALLOWED_OOM = [
  [/^warning: devalloc: .*: the browser ran out of memory for devalloc block \d+ \(\d+ bytes\), after the allocation was returned: it is refused from its next use \(allocate_async waits for this verdict\)$/,
    "devalloc's own warning for a refused buffer that allocate had returned"],
];

// Runs the checks on `page` (whose demo is done), through `check(name, ok)` and `note(line)`.
export async function outOfMemory(page, root, check, note) {
  const injector = readFileSync(join(root, "tests", "conformance", "oom_injector.js"), "utf8");
  await page.evaluate(injector);
  const fault = () => page.evaluate(() => ({ ...globalThis.__devallocFault }));
  // The next `n` buffer creations fail; the cache is emptied first, so that the allocation
  // that follows asks the browser for a buffer rather than reusing a cached one.
  const failNext = (n) => page.evaluate((k) => { window.devalloc.empty_cache(); globalThis.__devallocFault.failNext = k; }, n);
  const start = await fault();
  const n = 4 << 20;

  // allocateAsync, refused twice (the try and devalloc's one retry after giving its cache back).
  await failNext(2);
  await page.fill("#ask-bytes", String(n));
  await page.click("#ask-async");
  await page.waitForFunction(() => /allocateAsync: the browser refused/.test(document.getElementById("ask-result").textContent), null, { timeout: 30_000 });
  const shown = await page.locator("#ask-result").textContent();
  check(`the page shows allocateAsync's refusal as out of memory, with the bytes asked for: "${shown.slice(0, 160)}…"`,
    /out of memory/.test(shown) && shown.includes(String(n)) && /stats are as they were/.test(shown));

  // allocateAsync, refused once: the retry makes it.
  await failNext(1);
  const retried = await page.evaluate((k) => window.devallocAsk("async", k), n);
  check("allocateAsync refused once succeeds on devalloc's retry", retried.ok && retried.statsKept);

  // allocate, refused: the write that follows is out of memory, naming the allocation.
  await failNext(1);
  const sync = await page.evaluate((k) => window.devallocAsk("sync", k), n);
  check(`allocate's refused buffer: the next write is out of memory naming it ("${sync.error}"), its free too, stats as they were`,
    !sync.ok && /out of memory/.test(sync.error || "") && /out of memory/.test(sync.deallocate || "") && sync.statsKept);

  // The page goes on: both paths work again with nothing injected.
  const again = [await page.evaluate((k) => window.devallocAsk("async", k), n), await page.evaluate((k) => window.devallocAsk("sync", k), n)];
  check("after the refusals, both paths allocate, write and free again", again.every((r) => r.ok && r.statsKept));

  const end = await fault();
  const injected = end.injected - start.injected;
  check(`every injected failure (${injected}) met devalloc's out-of-memory scope and was reported (4 refused calls, 1 made on the retry)`,
    injected === 4 && end.uncaptured === start.uncaptured && end.failNext === 0);
  note(`out of memory: async ${JSON.stringify(shown)}; sync: ${sync.error}; free: ${sync.deallocate}`);
}
