//! The README's speed goals, held by `--check`: ratios against the peers (never times), each
//! with a stated noise margin, at every size the run measures, on every backend it runs:
//!
//! - staged upload: devalloc's speed over the best peer's (`write_buffer`, a kept
//!   `StagingBelt`) >= 0.95x;
//! - staged download: devalloc's speed over the best peer's (a fresh or reused `MAP_READ`
//!   buffer, `DownloadBuffer`) >= 0.95x;
//! - 4-byte download: devalloc's staged time <= 1.05x a reused `MAP_READ` buffer's;
//! - allocate + free (cached): devalloc's time <= 1.00x `create_buffer` + drop's.
//!
//! A goal holds where the ratio is within the margin of it (`--margin M`, 0.05 unless given):
//! `>= goal - M`, `<= goal + M`. `--goals upload,download,latency,alloc` holds only the goals
//! of those kinds (the rest are printed beside their goal, not held): a debug build's ratios
//! are not a release build's (wgpu unoptimised costs devalloc's extra calls more than the
//! peers'), and only `alloc` holds there. Without `--check` nothing is held (nor printed here).
use std::cell::RefCell;

/// The kinds of goal, as `--goals` names them.
pub(crate) const KINDS: [&str; 4] = ["upload", "download", "latency", "alloc"];

/// Which side of the goal a ratio must be on.
#[derive(Clone, Copy)]
pub(crate) enum Bound {
    /// A speed ratio (> 1: devalloc faster): at least this.
    AtLeast(f64),
    /// A time ratio (> 1: devalloc slower): at most this.
    AtMost(f64),
}

struct Held {
    what: String,
    ratio: f64,
    bound: Bound,
    ok: bool,
}

struct Checks {
    margin: f64,
    /// The kinds held (the others are printed only).
    kinds: Vec<String>,
    held: Vec<Held>,
}

thread_local! {
    /// The run's goals; None without `--check`.
    static CHECKS: RefCell<Option<Checks>> = const { RefCell::new(None) };
}

/// Holds the goals of `kinds` from now on, with `margin` for noise.
pub(crate) fn enable(margin: f64, kinds: Vec<String>) {
    CHECKS.with(|c| *c.borrow_mut() = Some(Checks { margin, kinds, held: Vec::new() }));
}

/// Holds `ratio` (of `what`, a goal of kind `kind`) to `bound` where `--check` asked for it,
/// and says so; prints it beside its goal where `--goals` left its kind out.
pub(crate) fn hold(kind: &str, what: String, ratio: f64, bound: Bound) {
    debug_assert!(KINDS.contains(&kind));
    CHECKS.with(|c| {
        if let Some(c) = c.borrow_mut().as_mut() {
            if !c.kinds.iter().any(|k| k == kind) {
                let goal = match bound {
                    Bound::AtLeast(g) => format!(">= {g:.2}x"),
                    Bound::AtMost(g) => format!("<= {g:.2}x"),
                };
                println!("  ratio: {what}: {ratio:.2}x (goal {goal}; not held: --goals leaves out {kind})");
                return;
            }
            let ok = match bound {
                Bound::AtLeast(goal) => ratio >= goal - c.margin,
                Bound::AtMost(goal) => ratio <= goal + c.margin,
            };
            let line = describe(&what, ratio, bound, c.margin, ok);
            println!("  check: {line}");
            c.held.push(Held { what, ratio, bound, ok });
        }
    });
}

fn describe(what: &str, ratio: f64, bound: Bound, margin: f64, ok: bool) -> String {
    let verdict = if ok { "ok" } else { "FAIL" };
    match bound {
        Bound::AtLeast(goal) => {
            format!(
                "{what}: {ratio:.2}x, goal >= {goal:.2}x (>= {:.2}x with the margin): {verdict}",
                goal - margin
            )
        }
        Bound::AtMost(goal) => {
            format!(
                "{what}: {ratio:.2}x, goal <= {goal:.2}x (<= {:.2}x with the margin): {verdict}",
                goal + margin
            )
        }
    }
}

/// The summary of every goal held; whether all held (true without `--check`).
pub(crate) fn report() -> bool {
    CHECKS.with(|c| {
        let Some(c) = c.borrow_mut().take() else { return true };
        let failed: Vec<&Held> = c.held.iter().filter(|h| !h.ok).collect();
        println!(
            "\n# check: {} of {} goals held (margin {:.2}; kinds {}){}",
            c.held.len() - failed.len(),
            c.held.len(),
            c.margin,
            c.kinds.join(","),
            if failed.is_empty() { "" } else { "; missed:" }
        );
        for h in &failed {
            println!("  FAIL {}", describe(&h.what, h.ratio, h.bound, c.margin, false));
        }
        !c.held.is_empty() && failed.is_empty()
    })
}
