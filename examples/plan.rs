//! Plans memory for MiniMalloc-format problems with devalloc's planner, beside the peers a user
//! could pick instead, in one run on the same inputs: one after another (no reuse; what
//! `PlanLayout` does), greedy by size (TFLite's GreedyBySize) and ExecuTorch's greedy planner.
//!
//!     cargo run --release --example plan -- FILE.csv... [--out DIR] [--budget-ms N] [--alignment N]
//!
//! FILE.csv: `id,lower,upper,size` (a buffer live from step `lower` up to, not including,
//! `upper`). `--budget-ms N` bounds the search per file (default 10000); 0 runs the fast
//! heuristic alone. `--out DIR` writes each plan as `DIR/NAME` in MiniMalloc's output format
//! (`id,lower,upper,size,offset`). Each file's report ends with one line scripts can read:
//!
//!     plan: file=NAME buffers=N lower_bound=N size=N ratio=X ms=N valid=yes|no
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
}

fn parse() -> Result<Args, String> {
    let mut args = Args { files: Vec::new(), out: None, budget_ms: 10_000, alignment: 1 };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut number = |what: &str| -> Result<u64, String> {
            let v = it.next().ok_or(format!("{what} needs a number"))?;
            v.parse().map_err(|_| format!("{what}: not a whole number: {v}"))
        };
        match a.as_str() {
            "--budget-ms" => args.budget_ms = number("--budget-ms")?,
            "--alignment" => args.alignment = number("--alignment")?,
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

/// One method's plan and time; `valid` is the planner's own check of the placement.
struct Row {
    method: String,
    plan: devalloc::Result<MemoryPlan>,
    ms: f64,
    valid: bool,
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
    let valid = plan.as_ref().is_ok_and(|p| check(tensors, alignment, p.offsets(), p.size()).is_ok());
    Row { method, plan, ms, valid }
}

/// Plans one file; returns whether its plan was valid.
fn one(path: &str, args: &Args) -> Result<bool, String> {
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
                if r.valid { "yes" } else { "NO" },
                if p.is_optimal() { " (optimal)" } else { "" }
            ),
            Err(e) => println!("  {:<34} error: {e}", r.method),
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
    println!(
        "plan: file={name} buffers={} lower_bound={lb} size={} ratio={:.4} ms={:.0} valid={}",
        t.len(),
        p.size(),
        p.size() as f64 / lb.max(1) as f64,
        chosen.ms,
        if chosen.valid { "yes" } else { "no" }
    );
    Ok(chosen.valid)
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
    let mut ok = true;
    for path in &args.files {
        match one(path, &args) {
            Ok(valid) => ok &= valid,
            Err(e) => {
                eprintln!("plan: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
