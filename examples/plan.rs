//! Plans memory for MiniMalloc-format problems with devalloc's planner, beside the peers a user
//! could pick instead, in one run on the same inputs: one after another (no reuse; what
//! `PlanLayout` does), greedy by size (TFLite's GreedyBySize) and ExecuTorch's greedy planner.
//!
//!     cargo run --release --example plan -- FILE.csv... [--out DIR] [--budget-ms N] [--alignment N]
//!
//! FILE.csv: `id,lower,upper,size` (a buffer live from step `lower` up to, not including,
//! `upper`). `--budget-ms N` bounds the search per file (default 10000); 0 runs the fast
//! heuristic alone. `--out DIR` writes each plan as `DIR/NAME` in MiniMalloc's output format
//! (`id,lower,upper,size,offset`). Each file's report ends with one line scripts can read
//! (devalloc's plan: the search's where it ran; `optimal`: at the lower bound, or proven
//! optimal by the search; `fits`: within the capacity a MiniMalloc name gives, `NAME.CAPACITY.csv`):
//!
//!     plan: file=NAME buffers=N lower_bound=N size=N ratio=X ms=N valid=yes|no optimal=yes|no [fits=yes|no]
//!
//! The run fails (exit 1) if any method's plan, a peer's included, is invalid or fails; with
//! `--expect-optimal N`, unless exactly N of the files' plans are optimal; with `--expect-fit`,
//! unless every plan fits the capacity its file's name gives.
#[path = "support/logging.rs"]
mod logging;

use std::process::ExitCode;
use std::time::Instant;

use devalloc::plan::{self, check, Instance, MemoryPlan, Strategy, TensorLife};

struct Args {
    files: Vec<String>,
    out: Option<String>,
    budget_ms: u64,
    alignment: u64,
    expect_optimal: Option<u64>,
    expect_fit: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        files: Vec::new(),
        out: None,
        budget_ms: 10_000,
        alignment: 1,
        expect_optimal: None,
        expect_fit: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut number = |what: &str| -> Result<u64, String> {
            let v = it.next().ok_or(format!("{what} needs a number"))?;
            v.parse().map_err(|_| format!("{what}: not a whole number: {v}"))
        };
        match a.as_str() {
            "--budget-ms" => args.budget_ms = number("--budget-ms")?,
            "--alignment" => args.alignment = number("--alignment")?,
            "--expect-optimal" => args.expect_optimal = Some(number("--expect-optimal")?),
            "--expect-fit" => args.expect_fit = true,
            "--out" => args.out = Some(it.next().ok_or("--out needs a folder")?),
            f if !f.starts_with("--") => args.files.push(f.to_string()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if args.files.is_empty() {
        return Err("name one or more MiniMalloc CSV files".into());
    }
    Ok(args)
}

/// One method's plan and time; `invalid` is what the planner's own check of the placement
/// found wrong (None: a valid plan).
struct Row {
    method: String,
    plan: devalloc::Result<MemoryPlan>,
    ms: f64,
    invalid: Option<String>,
}

/// What one file's plans came to: devalloc's plan optimal, within the capacity the file's
/// name gives (None: it gives none), and every method's plan valid.
struct Outcome {
    optimal: bool,
    fits: Option<bool>,
    all_valid: bool,
}

/// The capacity in a MiniMalloc file's name (`A.1048576.csv`), if it has one.
fn capacity(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".csv")?;
    stem.rsplit_once('.')?.1.parse().ok()
}

fn measure(
    method: String,
    tensors: &[TensorLife],
    alignment: u64,
    f: impl FnOnce() -> devalloc::Result<MemoryPlan>,
) -> Row {
    let t = Instant::now();
    let plan = f();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let invalid = match &plan {
        Ok(p) => check(tensors, alignment, p.offsets(), p.size()).err().map(|e| e.to_string()),
        Err(e) => Some(format!("no plan: {e}")),
    };
    Row { method, plan, ms, invalid }
}

/// Plans one file with every method and prints the report; an invalid plan (anyone's) is said
/// on stderr.
fn one(path: &str, args: &Args) -> Result<Outcome, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let name =
        std::path::Path::new(path).file_name().map_or(path.into(), |n| n.to_string_lossy().into_owned());
    let inst = Instance::from_csv(&name, &text).map_err(|e| e.to_string())?;
    let (t, align) = (&inst.tensors, args.alignment);
    let mut rows = vec![
        measure("one after another".into(), t, align, || plan::one_after_another(t, align)),
        measure("greedy by size".into(), t, align, || plan::greedy_by_size(t, align)),
        measure("ExecuTorch greedy".into(), t, align, || plan::executorch_greedy(t, align)),
        measure("devalloc fast".into(), t, align, || plan::plan(t, align, Strategy::Fast)),
    ];
    if args.budget_ms > 0 {
        let budget_ms = args.budget_ms;
        let method = format!("devalloc search ({budget_ms} ms budget)");
        rows.push(measure(method, t, align, || plan::plan(t, align, Strategy::Search { budget_ms })));
    }
    let lb = plan::lower_bound(t).map_err(|e| format!("{name}: {e}"))?;
    println!("\n{name}: {} buffers, lower bound {lb} bytes, alignment {align}", t.len());
    println!("  {:<34} {:>12} {:>9} {:>10}  valid", "method", "size", "ratio", "ms");
    for r in &rows {
        match &r.plan {
            Ok(p) => println!(
                "  {:<34} {:>12} {:>8.4}x {:>10.1}  {}{}",
                r.method,
                p.size(),
                p.size() as f64 / lb.max(1) as f64,
                r.ms,
                if r.invalid.is_none() { "yes" } else { "NO" },
                if p.is_optimal() { " (optimal)" } else { "" }
            ),
            Err(e) => println!("  {:<34} error: {e}", r.method),
        }
        if let Some(why) = &r.invalid {
            eprintln!("plan: {name}: {}'s plan is invalid: {why}", r.method);
        }
    }
    // The chosen mode's result: the search where it ran, else the fast heuristic.
    let chosen = rows.last().expect("devalloc's planner ran");
    let p = chosen.plan.as_ref().map_err(|e| format!("{name}: {e}"))?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
        let out = std::path::Path::new(dir).join(&name);
        std::fs::write(&out, inst.to_csv(p.offsets())).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    let fits = capacity(&name).map(|c| p.size() <= c);
    println!(
        "plan: file={name} buffers={} lower_bound={lb} size={} ratio={:.4} ms={:.0} valid={} optimal={}{}",
        t.len(),
        p.size(),
        p.size() as f64 / lb.max(1) as f64,
        chosen.ms,
        yes(chosen.invalid.is_none()),
        yes(p.is_optimal()),
        fits.map_or(String::new(), |f| format!(" fits={}", yes(f)))
    );
    Ok(Outcome { optimal: p.is_optimal(), fits, all_valid: rows.iter().all(|r| r.invalid.is_none()) })
}

fn main() -> ExitCode {
    logging::init("warn");
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("plan: {e}");
            return ExitCode::from(2);
        }
    };
    let (mut ok, mut optimal) = (true, 0u64);
    for path in &args.files {
        match one(path, &args) {
            Ok(o) => {
                ok &= o.all_valid;
                optimal += u64::from(o.optimal);
                if args.expect_fit && o.fits != Some(true) {
                    eprintln!(
                        "plan: {path}: the plan does not fit the capacity its name gives (or it gives none)"
                    );
                    ok = false;
                }
            }
            Err(e) => {
                eprintln!("plan: {e}");
                ok = false;
            }
        }
    }
    println!("plan: {optimal} of {} plans optimal (at the lower bound, or proven so)", args.files.len());
    if let Some(want) = args.expect_optimal {
        if optimal != want {
            eprintln!("plan: {optimal} of {} plans optimal, expected {want}", args.files.len());
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
