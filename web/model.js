// The "Load a model" card: fetch the weights file served beside the page (scripts/make-model
// writes it into web/pkg/), stream it onto the device with writeFromStream and a progress bar,
// check that the device holds the file's bytes (SHA-256 of what it reads back against the
// manifest's), and run the page's network on those weights (WebGPU: WebGL2 has no compute
// shaders). The wasm module's memory is measured around the stream: it grows by devalloc's
// window at most, not by the file.
const MiB = 1 << 20;
const hex = (buffer) => Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");

export async function loadModel(dv, memory, $) {
  const bar = $("model-bar"), said = $("model-progress");
  const manifest = await (await fetch("web/pkg/model.json")).json();
  const response = await fetch("web/pkg/model.bin");
  if (!response.ok) throw new Error(`web/pkg/model.bin: HTTP ${response.status} (scripts/build-web writes it)`);
  const total = manifest.bytes;
  bar.max = total;
  const ptr = dv.allocate(total);
  const r = { bytes: 0, total, calls: 0, memoryGrowth: 0, barMax: total, barValue: 0 };
  try {
    const before = memory.buffer.byteLength;
    const t0 = performance.now();
    r.bytes = await dv.writeFromStream(ptr, response.body, (done) => {
      r.calls++;
      bar.value = done;
      said.textContent = `${(done / MiB).toFixed(1)} of ${(total / MiB).toFixed(1)} MiB`;
    }, total);
    r.seconds = (performance.now() - t0) / 1000;
    r.memoryGrowth = memory.buffer.byteLength - before;
    r.barValue = bar.value;
    r.sha256 = hex(await crypto.subtle.digest("SHA-256", await dv.read(ptr, total)));
    r.bytesOk = r.bytes === total && r.sha256 === manifest.sha256;
    if (dv.backend === "webgpu") {
      r.maxError = (await dv.runNetworkOn(ptr, manifest.widths)).maxError;
    } else {
      r.networkSkipped = await dv.runNetworkOn(ptr, manifest.widths).then(() => null, (e) => String(e && e.message || e));
    }
  } finally {
    dv.deallocate(ptr);
  }
  // Flat: at most 16 MiB of growth (twice the 8 MiB window: the module's allocator grows in
  // steps of its own; 9.7-11.1 MiB measured) while a file of 33 MiB streamed through. Not on
  // WebGL2, where it is not flat (28 MB for 35 MB, with 8 MiB staging chunks): wgpu's GL
  // backend emulates buffer mapping there, and every mappable buffer, the staging of each
  // upload included, is a copy in wasm memory (wgpu-hal 30 gles `create_buffer`,
  // EMULATE_BUFFER_MAP). The card says so rather than pass it.
  r.memoryFlat = r.memoryGrowth <= 16 * MiB && r.memoryGrowth < total / 2;
  r.memoryOk = r.memoryFlat || dv.backend !== "webgpu";
  r.networkOk = r.maxError === undefined ? r.networkSkipped !== null : r.maxError < 1e-3;
  r.ok = r.bytesOk && r.memoryOk && r.networkOk && r.calls > 0 && r.barValue === total;
  const net = r.maxError === undefined
    ? `the network needs compute shaders, which this backend lacks (${r.networkSkipped})`
    : `the network (${manifest.widths.join("-")}) ran on those weights and matched the CPU (max error ${r.maxError.toExponential(1)})`;
  $("model-result").innerHTML = `${r.ok ? '<span class="ok">loaded</span>' : '<span class="bad">FAILED</span>'}: `
    + `${r.bytes} bytes streamed in ${r.seconds.toFixed(2)} s (${r.calls} progress calls), the device's bytes ${r.bytesOk ? "are" : "are NOT"} the file's (SHA-256), `
    + `wasm memory grew by ${(r.memoryGrowth / MiB).toFixed(1)} MiB${r.memoryFlat ? "" : dv.backend === "webgpu" ? " (too much)" : " (on WebGL2 wgpu keeps each staging buffer in wasm memory)"}; ${net}.`;
  return r;
}
