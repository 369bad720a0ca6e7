// Numbers as the page shows them, and the axes of its charts: byte sizes in binary units
// (KiB, MiB, GiB), tick steps that land on round binary sizes, and log-scale decades.

const KIB = 1024, MIB = 1 << 20, GIB = 2 ** 30;

/// `v` with at most `digits` decimals, trailing zeros dropped (1.25, 1.5, 2).
export const trim = (v, digits = 1) => String(Number(v.toFixed(digits)));

/// Bytes in the largest binary unit that keeps the number at least 1.
export function human(bytes, digits = 1) {
  const b = Number(bytes);
  if (b >= GIB) return `${trim(b / GIB, digits)} GiB`;
  if (b >= MIB) return `${trim(b / MIB, digits)} MiB`;
  if (b >= KIB) return `${trim(b / KIB, digits)} KiB`;
  return `${b} B`;
}

/// Bytes in full, grouped: "2,147,483,648 bytes".
export const exact = (bytes) => `${Number(bytes).toLocaleString("en-US")} bytes`;

/// Parses what a user types as a size: "64 MiB", "1.5GiB", "512k", "4096". NaN if it is not one.
export function parseBytes(text) {
  const m = /^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)?\s*$/i.exec(String(text));
  if (!m) return NaN;
  const scale = { "": 1, k: KIB, m: MIB, g: GIB, t: GIB * 1024 }[m[2].toLowerCase()];
  return Math.round(Number(m[1]) * scale);
}

/// Ticks for a byte axis from 0 to at least `max`: a power-of-two step, 3 to 6 ticks, so that
/// every label is a round binary size (256 KiB, 1.25 MiB, 16 MiB). Returns { top, ticks }.
export function byteTicks(max) {
  const m = Math.max(1, max);
  const step = 2 ** Math.max(0, Math.ceil(Math.log2(m / 5)));
  const top = Math.ceil(m / step) * step;
  const ticks = [];
  for (let v = 0; v <= top; v += step) ticks.push(v);
  return { top, ticks };
}

/// Ticks for a count axis from 0 to `max` (events, steps): steps of 1, 2 or 5 times a power of
/// ten, at most about 10 ticks.
export function countTicks(max) {
  const m = Math.max(1, max);
  const raw = m / 8, pow = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((k) => k * pow).find((s) => s >= raw);
  const ticks = [];
  for (let v = 0; v <= m; v += Math.max(1, step)) ticks.push(v);
  return ticks;
}

/// The decades of a log axis that hold every value of `values` (> 0): { lo, hi, ticks }.
export function decades(values) {
  const vs = values.filter((v) => v > 0);
  const lo = 10 ** Math.floor(Math.log10(Math.min(...vs)));
  const hi = 10 ** Math.ceil(Math.log10(Math.max(...vs)));
  const ticks = [];
  for (let v = lo; v <= hi * 1.0001; v *= 10) ticks.push(v);
  return { lo, hi: hi === lo ? hi * 10 : hi, ticks: hi === lo ? [...ticks, hi * 10] : ticks };
}

/// A decade's label: 0.001, 0.01, 0.1, 1, 10.
export const decade = (v) => (v >= 1 ? String(Math.round(v)) : v.toPrecision(1));

/// Distinct colours for chart series, in order: no two alike in hue and lightness, so that up to
/// 20 labels can be told apart (the viewer greys out the rest and says so).
export const PALETTE = [
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
  "#bcbd22", "#393b79", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
  "#f7b6d2", "#9edae5", "#637939", "#e7969c",
];
export const OTHER = "#b8bcc4";
