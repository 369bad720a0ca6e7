// The fault injector for out of memory in the browser, shared by the WebGPU suite
// (tests/conformance/browser_oom.rs) and the page's e2e run (scripts/e2e/e2e.mjs). It wraps
// GPUDevice's createBuffer, pushErrorScope and popErrorScope: while `failNext` > 0, a buffer
// creation returns an invalid buffer and puts a GPUOutOfMemoryError in the innermost
// `out-of-memory` error scope pushed around it, as WebGPU specifies for a buffer it could not
// make (`uncaptured` counts failures no such scope caught). Installed once (idempotent), as
// globalThis.__devallocFault = { failNext, injected, uncaptured }.
(() => {
  if (globalThis.__devallocFault) return;
  const proto = GPUDevice.prototype;
  const create = proto.createBuffer, push = proto.pushErrorScope, pop = proto.popErrorScope;
  const st = { failNext: 0, injected: 0, uncaptured: 0, scopes: new WeakMap() };
  globalThis.__devallocFault = st;
  const stack = (d) => { let s = st.scopes.get(d); if (!s) { s = []; st.scopes.set(d, s); } return s; };
  proto.pushErrorScope = function (filter) { stack(this).push({ filter, oom: false }); return push.call(this, filter); };
  proto.popErrorScope = function () {
    const scope = stack(this).pop();
    const p = pop.call(this);
    return scope && scope.oom ? p.then(() => new GPUOutOfMemoryError("injected: out of memory")) : p;
  };
  proto.createBuffer = function (desc) {
    if (st.failNext <= 0) return create.call(this, desc);
    st.failNext--;
    st.injected++;
    const scope = [...stack(this)].reverse().find((s) => s.filter === "out-of-memory");
    if (scope) scope.oom = true; else st.uncaptured++;
    // An invalid buffer, as WebGPU returns for one it could not make (its own error swallowed).
    push.call(this, "validation");
    const buffer = create.call(this, { ...desc, usage: 0 });
    pop.call(this);
    return buffer;
  };
})()
