//! Writes the activation traces devalloc's planner and replay are measured on: tensors of real
//! model shapes with the lifetimes their ops give them, as MiniMalloc CSV (`id,lower,upper,size`:
//! live from step `lower` up to, not including, `upper`; one step per op).
//!
//!     cargo run --example traces [-- DIR]      # default: tests/data/traces
//!
//! - `transformer`: a GPT-2-small forward pass (12 layers, d 768, 12 heads, 512 tokens, f32):
//!   per layer layer norm, q/k/v, attention scores and softmax per head group, projection, MLP
//!   (4x), residuals; the logits at the end.
//! - `mlp_train`: one training step of a 6-layer MLP (batch 256, widths 1024..4096): the forward
//!   pass keeps every activation for the backward pass, which makes activation and weight
//!   gradients; weight gradients live until the optimizer step at the end.
//! - `convnet`: a ResNet-18-like forward pass (batch 8, 224x224, f32): convolutions, batch
//!   norms, ReLUs and residual additions over four stages, the skip inputs kept alive.
//! - `decode`: a 64-token decode loop of a 24-layer model (d 1024) whose KV cache is
//!   re-allocated one token larger each step (copied, then the old one freed), beside each
//!   step's activations.
//! - `large`: a 48-layer transformer forward pass (d 1024, 256 tokens): thousands of tensors.
use std::fmt::Write as _;

/// Records ops: each op makes one tensor (its output) at the next step; a tensor lives from
/// the op that makes it to the last op that reads it (or to the end, if kept).
struct Graph {
    /// (size, first step, last step) of each tensor.
    tensors: Vec<(u64, u64, u64)>,
    step: u64,
}

impl Graph {
    fn new() -> Self {
        Graph { tensors: Vec::new(), step: 0 }
    }

    /// An op reading `inputs` and making a tensor of `bytes`; returns the tensor.
    fn op(&mut self, bytes: u64, inputs: &[usize]) -> usize {
        self.step += 1;
        for &i in inputs {
            self.tensors[i].2 = self.tensors[i].2.max(self.step);
        }
        self.tensors.push((bytes, self.step, self.step));
        self.tensors.len() - 1
    }

    /// An op that reads `inputs` and makes nothing (an in-place update, a copy out).
    fn use_(&mut self, inputs: &[usize]) {
        self.step += 1;
        for &i in inputs {
            self.tensors[i].2 = self.tensors[i].2.max(self.step);
        }
    }

    /// Frees nothing: keeps `t` alive until the end of the trace.
    fn keep(&mut self, t: usize) {
        self.tensors[t].2 = u64::MAX;
    }

    fn csv(&self) -> String {
        let end = self.step + 1;
        let mut out = String::from("id,lower,upper,size\n");
        for (i, &(size, first, last)) in self.tensors.iter().enumerate() {
            let _ = writeln!(out, "{i},{first},{},{size}", last.min(end - 1) + 1);
        }
        out
    }
}

const F32: u64 = 4;

/// A transformer forward pass: `layers` blocks over `tokens` tokens of width `d`.
fn transformer(layers: usize, d: u64, heads: u64, tokens: u64, vocab: u64) -> Graph {
    let mut g = Graph::new();
    let act = tokens * d * F32;
    let mut x = g.op(act, &[]); // embeddings
    for _ in 0..layers {
        let ln1 = g.op(act, &[x]);
        let q = g.op(act, &[ln1]);
        let k = g.op(act, &[ln1]);
        let v = g.op(act, &[ln1]);
        // Attention in two head groups, so that scores of one group die before the next.
        let mut outs = Vec::new();
        for _ in 0..2 {
            let scores = g.op(heads / 2 * tokens * tokens * F32, &[q, k]);
            let probs = g.op(heads / 2 * tokens * tokens * F32, &[scores]);
            outs.push(g.op(act / 2, &[probs, v]));
        }
        let attn = g.op(act, &outs);
        let proj = g.op(act, &[attn]);
        let res1 = g.op(act, &[x, proj]);
        let ln2 = g.op(act, &[res1]);
        let up = g.op(4 * act, &[ln2]);
        let gelu = g.op(4 * act, &[up]);
        let down = g.op(act, &[gelu]);
        x = g.op(act, &[res1, down]);
    }
    let ln = g.op(act, &[x]);
    let logits = g.op(tokens * vocab * F32, &[ln]);
    g.keep(logits);
    g
}

/// One training step of an MLP: forward keeping activations, backward, optimizer.
fn mlp_train(batch: u64, widths: &[u64]) -> Graph {
    let mut g = Graph::new();
    let mut acts = vec![g.op(batch * widths[0] * F32, &[])];
    let mut pre = Vec::new();
    for w in &widths[1..] {
        let z = g.op(batch * w * F32, &[*acts.last().unwrap()]);
        let a = g.op(batch * w * F32, &[z]);
        pre.push(z);
        acts.push(a);
    }
    let loss = g.op(F32, &[*acts.last().unwrap()]);
    let mut grad = g.op(batch * widths[widths.len() - 1] * F32, &[loss, *acts.last().unwrap()]);
    let mut weight_grads = Vec::new();
    for l in (1..widths.len()).rev() {
        let dz = g.op(batch * widths[l] * F32, &[grad, pre[l - 1]]);
        weight_grads.push(g.op(widths[l - 1] * widths[l] * F32, &[dz, acts[l - 1]]));
        grad = g.op(batch * widths[l - 1] * F32, &[dz]);
    }
    g.use_(&weight_grads); // the optimizer step reads every weight gradient
    g
}

/// A ResNet-18-like forward pass.
fn convnet(batch: u64) -> Graph {
    let mut g = Graph::new();
    let fmap = |c: u64, hw: u64| batch * c * hw * hw * F32;
    let mut x = g.op(fmap(3, 224), &[]);
    x = g.op(fmap(64, 112), &[x]); // stem conv
    x = g.op(fmap(64, 112), &[x]); // bn
    x = g.op(fmap(64, 112), &[x]); // relu
    x = g.op(fmap(64, 56), &[x]); // max pool
    for (stage, (c, hw)) in [(64, 56), (128, 28), (256, 14), (512, 7)].into_iter().enumerate() {
        for block in 0..2 {
            let skip = if stage > 0 && block == 0 { g.op(fmap(c, hw), &[x]) } else { x };
            let a = g.op(fmap(c, hw), &[x]);
            let a = g.op(fmap(c, hw), &[a]);
            let a = g.op(fmap(c, hw), &[a]);
            let b = g.op(fmap(c, hw), &[a]);
            let b = g.op(fmap(c, hw), &[b]);
            let sum = g.op(fmap(c, hw), &[b, skip]);
            x = g.op(fmap(c, hw), &[sum]);
        }
    }
    let pooled = g.op(batch * 512 * F32, &[x]);
    let logits = g.op(batch * 1000 * F32, &[pooled]);
    g.keep(logits);
    g
}

/// A decode loop whose KV cache grows by one token a step, re-allocated each time.
fn decode(layers: usize, d: u64, steps: u64, prompt: u64) -> Graph {
    let mut g = Graph::new();
    let mut kv: Vec<(usize, usize)> =
        (0..layers).map(|_| (g.op(prompt * d * F32, &[]), g.op(prompt * d * F32, &[]))).collect();
    for t in 0..steps {
        let len = prompt + t + 1;
        let mut x = g.op(d * F32, &[]);
        for (k, v) in kv.iter_mut() {
            let ln = g.op(d * F32, &[x]);
            let q = g.op(d * F32, &[ln]);
            // The cache grows: a new, larger K and V (copied from the old ones, which then go).
            *k = g.op(len * d * F32, &[*k, ln]);
            *v = g.op(len * d * F32, &[*v, ln]);
            let scores = g.op(len * 16 * F32, &[q, *k]);
            let attn = g.op(d * F32, &[scores, *v]);
            let up = g.op(4 * d * F32, &[attn]);
            x = g.op(d * F32, &[up, x]);
        }
        let logits = g.op(50_000 * F32, &[x]);
        g.use_(&[logits]);
    }
    g
}

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "tests/data/traces".into());
    std::fs::create_dir_all(&dir).expect("the output folder");
    let traces = [
        ("transformer", transformer(12, 768, 12, 512, 50_257)),
        ("mlp_train", mlp_train(256, &[1024, 4096, 4096, 2048, 2048, 1024, 1000])),
        ("convnet", convnet(8)),
        ("decode", decode(24, 1024, 64, 16)),
        ("large", transformer(48, 1024, 16, 256, 32_000)),
    ];
    for (name, g) in traces {
        let path = format!("{dir}/{name}.csv");
        std::fs::write(&path, g.csv()).expect("writing a trace");
        println!("{path}: {} tensors over {} steps", g.tensors.len(), g.step);
    }
}
