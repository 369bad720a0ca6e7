// The "Ask for memory" card: asks devalloc for a number of bytes, either with allocateAsync
// (which waits for the browser's verdict on the buffer, and rejects with out of memory when
// the browser could not make it) or with allocate (which returns at once: a buffer the browser
// refuses later is refused at its next use, here a write). Whatever the browser says is shown,
// with devalloc's stats before and after, and the page goes on working. The e2e run makes
// chosen buffer creations fail (scripts/e2e/e2e.mjs) and calls `ask` as the buttons do.
import { human, exact } from "./format.js";

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const nextTask = () => new Promise((ok) => setTimeout(ok, 0));
const counted = (s) => ({ live: s.live, allocated: s.allocated, reserved: s.reserved });

// Asks for `n` bytes `how` ("async" or "sync"), frees what it got, and returns (and shows)
// { how, n, ok, error, before, after, statsKept }.
export async function ask(dv, how, n) {
  const before = counted(dv.stats());
  const r = { how, n, ok: false, error: null, before };
  try {
    if (how === "async") {
      const p = await dv.allocateAsync(n);
      await dv.write(p, new Uint8Array(16).fill(7));
      dv.deallocate(p);
    } else {
      const p = dv.allocate(n);
      // The browser's verdict on the buffer comes a task or more later: wait until it is in
      // (the allocation leaves the stats when refused) or a few tasks have gone by.
      for (let i = 0; i < 20 && dv.stats().live > before.live; i++) await nextTask();
      try {
        await dv.write(p, new Uint8Array(16).fill(7));
      } catch (e) {
        r.error = String(e && e.message || e);
        try { dv.deallocate(p); } catch (e2) { r.deallocate = String(e2 && e2.message || e2); }
        throw e;
      }
      dv.deallocate(p);
    }
    r.ok = true;
  } catch (e) {
    r.error = r.error || String(e && e.message || e);
  }
  r.after = counted(dv.stats());
  r.statsKept = r.after.live === before.live && r.after.allocated === before.allocated;
  show(r);
  return r;
}

function show(r) {
  const call = r.how === "async" ? "allocateAsync" : "allocate, then a write";
  const stats = (s) => `${s.live} live, ${exact(s.allocated)} allocated, ${exact(s.reserved)} reserved`;
  const text = r.ok
    ? `<span class="ok">${call}: ${human(r.n, 2)} allocated, written and freed.</span>`
    : `<span class="bad">${call}: the browser refused ${human(r.n, 2)}.</span> devalloc said: <code>${esc(r.error)}</code>`
      + (r.deallocate ? ` Its free said: <code>${esc(r.deallocate)}</code>.` : "")
      + ` The stats are ${r.statsKept ? "as they were" : "<span class=\"bad\">changed</span>"}, and the page goes on.`;
  $("ask-result").innerHTML = `${text}<br>Before: ${stats(r.before)}. After: ${stats(r.after)}.`;
}

// Wires the card's buttons to `dv`.
export function askCard(dv) {
  const go = async (how) => {
    const n = Number($("ask-bytes").value);
    if (!Number.isSafeInteger(n) || n < 1) {
      $("ask-result").innerHTML = `<span class="bad">not a number of bytes: ${esc($("ask-bytes").value)}</span>`;
      return;
    }
    await ask(dv, how, n);
  };
  $("ask-async").addEventListener("click", () => go("async"));
  $("ask-sync").addEventListener("click", () => go("sync"));
  $("ask-async").disabled = $("ask-sync").disabled = false;
}
