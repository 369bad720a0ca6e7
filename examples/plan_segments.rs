//! The price of planning for a buffer of several device buffers (a wgpu allocation past one
//! buffer's limit): each file's tensors planned by `plan::plan` and by `plan::plan_segmented`,
//! the buffer cut into K segments (segment = lower bound / K, rounded up to the alignment),
//! every plan checked by `plan::check` and `plan::check_segments`, and the ratio printed.
//!
//!     cargo run --release --example plan_segments -- FILE.csv... [--parts K] [--alignment N] [--expect MEDIAN WORST]
//!
//! FILE.csv: MiniMalloc's format (`id,lower,upper,size`), as `examples/plan` reads. K is 4 and
//! the alignment 256 by default. One line per file and a summary:
//!
//!     plan_segments: file=NAME segment=S size=N free=N lower_bound=N cost=X method=M
//!     plan_segments: N files, median X, worst Y the unconstrained plan
//!
//! Fails (exit 1) on any invalid plan, and with `--expect`, past either ratio.
#[path = "support/logging.rs"]
mod logging;

use std::process::ExitCode;

use devalloc::plan::{self, Instance, Strategy};

fn run() -> Result<bool, String> {
    let (mut files, mut parts, mut alignment, mut expect) = (Vec::new(), 4u64, 256u64, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |what: &str| it.next().ok_or(format!("{what} needs a value"));
        match a.as_str() {
            "--parts" => parts = value("--parts")?.parse().map_err(|e| format!("--parts: {e}"))?,
            "--alignment" => {
                alignment = value("--alignment")?.parse().map_err(|e| format!("--alignment: {e}"))?
            }
            "--expect" => {
                let median: f64 = value("--expect")?.parse().map_err(|e| format!("--expect: {e}"))?;
                let worst: f64 = value("--expect")?.parse().map_err(|e| format!("--expect: {e}"))?;
                expect = Some((median, worst));
            }
            f if !f.starts_with("--") => files.push(f.to_string()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if files.is_empty() || parts == 0 {
        return Err("name one or more MiniMalloc CSV files (and --parts of at least 1)".into());
    }
    let mut costs = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let name =
            std::path::Path::new(path).file_name().map_or(path.clone(), |n| n.to_string_lossy().into());
        let t = Instance::from_csv(&name, &text).map_err(|e| e.to_string())?.tensors;
        let free = plan::plan(&t, alignment, Strategy::Fast).map_err(|e| format!("{name}: {e}"))?;
        let segment = (free.lower_bound() / parts).max(1).next_multiple_of(alignment);
        let p = plan::plan_segmented(&t, alignment, segment, Strategy::Fast)
            .map_err(|e| format!("{name}: {e}"))?;
        plan::check(&t, alignment, p.offsets(), p.size()).map_err(|e| format!("{name}: {e}"))?;
        plan::check_segments(&t, p.offsets(), segment).map_err(|e| format!("{name}: {e}"))?;
        let cost = p.size() as f64 / free.size().max(1) as f64;
        println!(
            "plan_segments: file={name} segment={segment} size={} free={} lower_bound={} cost={cost:.3} method={:?}",
            p.size(),
            free.size(),
            p.lower_bound(),
            p.method()
        );
        costs.push(cost);
    }
    costs.sort_by(f64::total_cmp);
    let (median, worst) = (costs[costs.len() / 2], costs[costs.len() - 1]);
    println!(
        "plan_segments: {} files, median {median:.3}, worst {worst:.3} the unconstrained plan",
        costs.len()
    );
    Ok(match expect {
        Some((m, w)) if median > m || worst > w => {
            eprintln!("plan_segments: median {median:.3} (at most {m}), worst {worst:.3} (at most {w})");
            false
        }
        _ => true,
    })
}

fn main() -> ExitCode {
    logging::init("warn");
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("plan_segments: {e}");
            ExitCode::FAILURE
        }
    }
}
