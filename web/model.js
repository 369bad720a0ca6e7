// The "Load a model" card: fetch the weights file served beside the page (scripts/make-model
// writes it into web/pkg/), stream it onto the device with writeFromStream and a progress bar,
// check that the device holds the file's bytes (SHA-256 of what it reads back against the
// manifest's), and run the page's network on those weights (WebGPU: WebGL2 has no compute
// shaders). The wasm module's memory is measured around the stream: it grows by devalloc's
// window at most, not by the file.
const MiB = 1 << 20;
const hex = (buffer) => Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");

// What a careful page writes without devalloc: the stream's reader feeding the browser's own
// GPUQueue.writeBuffer, whole 4-byte words at a time (writeBuffer takes no ragged size), the
// ragged tail carried to the next chunk.
async function handLoop(stream, { buffer, offset, queue }) {
  const reader = stream.getReader();
  let at = 0, carry = new Uint8Array(0);
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    let chunk = value;
    if (carry.length) { chunk = new Uint8Array(carry.length + value.length); chunk.set(carry); chunk.set(value, carry.length); }
    const words = chunk.length & ~3;
    if (words) queue.writeBuffer(buffer, offset + at, chunk, 0, words);
    at += words;
    carry = chunk.slice(words);
  }
  if (carry.length) { const last = new Uint8Array(4); last.set(carry); queue.writeBuffer(buffer, offset + at, last); }
  return at + carry.length;
}

// writeFromStream against the hand loop, interleaved, median of 3 rounds each: the model's
// bytes (fetched once into JS memory) as a Blob's stream (the browser's 64 KiB chunks), into an
// allocation of each method's own, cleared before each round and read back after it (SHA-256
// against the file's). Timed from the stream's start to the call's return: both have queued
// every byte, and the queue's order makes every later use see them.
async function streamBench(dv, manifest) {
  const bytes = new Uint8Array(await (await fetch("web/pkg/model.bin")).arrayBuffer());
  const zeros = new Uint8Array(bytes.length);
  const ptrs = [dv.allocate(bytes.length), dv.allocate(bytes.length)];
  const methods = [
    ["writeFromStream", (s) => dv.writeFromStream(ptrs[0], s, null, bytes.length)],
    ["reader + writeBuffer", (s) => handLoop(s, dv.webgpuTarget(ptrs[1]))],
  ];
  const times = [[], []];
  let verified = true;
  try {
    for (let round = 0; round < 3; round++) {
      for (let k = 0; k < 2; k++) {
        const i = (k + round) % 2; // a different method first each round
        await dv.write(ptrs[i], zeros);
        const t0 = performance.now();
        const n = await methods[i][1](new Blob([bytes]).stream());
        times[i].push(performance.now() - t0);
        const sha = hex(await crypto.subtle.digest("SHA-256", await dv.read(ptrs[i], bytes.length)));
        verified &&= n === bytes.length && sha === manifest.sha256;
      }
    }
  } finally {
    ptrs.forEach((p) => dv.deallocate(p));
  }
  const median = (t) => [...t].sort((a, b) => a - b)[1];
  const gbps = times.map((t) => bytes.length / median(t) / 1e6);
  return { bytes: bytes.length, methods: methods.map(([name], i) => ({ name, gbps: gbps[i] })), ratio: gbps[0] / gbps[1], verified };
}

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
      r.bench = await streamBench(dv, manifest);
    } else {
      r.networkSkipped = await dv.runNetworkOn(ptr, manifest.widths).then(() => null, (e) => String(e && e.message || e));
    }
  } finally {
    dv.deallocate(ptr);
  }
  // Flat: at most 16 MiB of growth (twice the 8 MiB window: the module's allocator grows in
  // steps of its own; 9.7-11.1 MiB measured) while a file of 33 MiB streamed through. Not on
  // WebGL2, where it is not flat (27-47 MB for 35 MB, with 8 MiB staging chunks): wgpu's GL
  // backend emulates buffer mapping there, and every mappable buffer, the staging of each
  // upload included, is a copy in wasm memory (wgpu-hal 30 gles `create_buffer`,
  // EMULATE_BUFFER_MAP). The card says so rather than pass it.
  r.memoryFlat = r.memoryGrowth <= 16 * MiB && r.memoryGrowth < total / 2;
  r.memoryOk = r.memoryFlat || dv.backend !== "webgpu";
  r.networkOk = r.maxError === undefined ? r.networkSkipped !== null : r.maxError < 1e-3;
  r.ok = r.bytesOk && r.memoryOk && r.networkOk && r.calls > 0 && r.barValue === total && (!r.bench || r.bench.verified);
  const bench = r.bench
    ? ` From memory, interleaved medians: writeFromStream ${r.bench.methods[0].gbps.toFixed(2)} GB/s, a hand-written reader + writeBuffer loop ${r.bench.methods[1].gbps.toFixed(2)} GB/s (${r.bench.ratio.toFixed(2)}x)${r.bench.verified ? ", every result verified" : ", <span class=\"bad\">a result did not verify</span>"}.`
    : "";
  const net = r.maxError === undefined
    ? `the network needs compute shaders, which this backend lacks (${r.networkSkipped})`
    : `the network (${manifest.widths.join("-")}) ran on those weights and matched the CPU (max error ${r.maxError.toExponential(1)})`;
  $("model-result").innerHTML = `${r.ok ? '<span class="ok">loaded</span>' : '<span class="bad">FAILED</span>'}: `
    + `${r.bytes} bytes streamed in ${r.seconds.toFixed(2)} s (${r.calls} progress calls), the device's bytes ${r.bytesOk ? "are" : "are NOT"} the file's (SHA-256), `
    + `wasm memory grew by ${(r.memoryGrowth / MiB).toFixed(1)} MiB${r.memoryFlat ? "" : dv.backend === "webgpu" ? " (too much)" : " (on WebGL2 wgpu keeps each staging buffer in wasm memory)"}; ${net}.${bench}`;
  return r;
}
