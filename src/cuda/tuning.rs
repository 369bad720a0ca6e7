//! How large host<->device copies are staged ([`CopyTuning`], settable by environment so that
//! one short GPU run can sweep it), the checked form the storage runs with ([`Tuning`]: the
//! only way to it goes through the checks), and how a copy is cut into chunks ([`Tuning::plan`]).
//!
//! Chunks ramp: the first ones are small (256 KiB, then doubling up to [`CopyTuning::chunk`]),
//! so that the first DMA starts after a short fill, and so are the last ones (halving down), so
//! that the one step nothing overlaps (the last DMA of an upload, the last copy-out of a
//! download) is short.

use std::ops::Range;

/// The first and last chunk of a staged copy (see the module docs).
pub(crate) const RAMP: usize = 256 << 10;
/// The bounds [`CopyTuning::checked`] keeps to.
const MIN_CHUNK: usize = 64 << 10;
const MAX_CHUNK: usize = 64 << 20;
const MAX_BUFFERS: usize = 16;
const MAX_THREADS: usize = 64;

/// A positive number, or `default` for anything else (unset, junk, 0, negative, too large).
fn count(value: Option<&str>, default: usize) -> usize {
    value.and_then(|v| v.trim().parse().ok()).filter(|&v| v > 0).unwrap_or(default)
}

/// 0/1 (or false/true, off/on, no/yes), or `default` for anything else.
fn switch(value: Option<&str>, default: bool) -> bool {
    match value.map(str::trim) {
        Some("0" | "false" | "off" | "no") => false,
        Some("1" | "true" | "on" | "yes") => true,
        _ => default,
    }
}

fn env(name: &str, default: usize) -> usize {
    count(std::env::var(name).ok().as_deref(), default)
}

fn env_bool(name: &str, default: bool) -> bool {
    switch(std::env::var(name).ok().as_deref(), default)
}

/// How large copies are staged; every field can be set by environment variable, so that one
/// short GPU run can sweep them. Any values are accepted: [`CopyTuning::checked`] brings them
/// within what works, and the allocator only ever runs with the checked form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyTuning {
    /// Copies of at least this many bytes go through pinned staging (`DEVALLOC_CUDA_THRESHOLD`,
    /// default 4 MiB); smaller ones, and copies from or to memory that is already pinned, go
    /// straight through the driver.
    pub pinned_threshold: usize,
    /// Bytes of one pinned buffer, the largest chunk (`DEVALLOC_CUDA_CHUNK`, default 4 MiB).
    pub chunk: usize,
    /// Pinned buffers per direction (`DEVALLOC_CUDA_BUFFERS`, default 6): while the DMA engine
    /// moves one, the copy threads work on the others.
    pub buffers: usize,
    /// Threads that copy chunks on the host, each a whole chunk at a time
    /// (`DEVALLOC_CUDA_THREADS`, default 4; 1 copies on the caller's thread).
    pub threads: usize,
    /// Upload buffers are write-combined: fast for the host to write and the DMA to read, on
    /// some systems (`DEVALLOC_CUDA_WRITE_COMBINED`, 0 or 1, default 1). Download buffers never
    /// are (the host reads them).
    pub write_combined: bool,
}

impl CopyTuning {
    /// The defaults, overridden by the `DEVALLOC_CUDA_*` variables that are set (unparsable
    /// values are ignored), then checked.
    pub fn from_env() -> Self {
        CopyTuning {
            pinned_threshold: env("DEVALLOC_CUDA_THRESHOLD", 4 << 20),
            chunk: env("DEVALLOC_CUDA_CHUNK", 4 << 20),
            buffers: env("DEVALLOC_CUDA_BUFFERS", 6),
            threads: env("DEVALLOC_CUDA_THREADS", 4),
            write_combined: env_bool("DEVALLOC_CUDA_WRITE_COMBINED", true),
        }
        .checked()
    }

    /// The same, within what works: a threshold of 1 byte at least; chunks of 64 KiB to
    /// 64 MiB, in 4 KiB multiples; 2 to 16 buffers; 1 to 64 threads. Never panics.
    pub fn checked(self) -> Self {
        CopyTuning {
            pinned_threshold: self.pinned_threshold.max(1),
            // Clamped before rounding, so that rounding cannot overflow.
            chunk: self.chunk.clamp(MIN_CHUNK, MAX_CHUNK).next_multiple_of(4096),
            buffers: self.buffers.clamp(2, MAX_BUFFERS),
            threads: self.threads.clamp(1, MAX_THREADS),
            write_combined: self.write_combined,
        }
    }
}

impl Default for CopyTuning {
    fn default() -> Self {
        Self::from_env()
    }
}

/// A [`CopyTuning`] that went through [`CopyTuning::checked`]: what the storage runs with (it
/// cannot be made any other way).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tuning(CopyTuning);

impl Tuning {
    pub(crate) fn new(t: &CopyTuning) -> Self {
        Tuning(t.clone().checked())
    }

    pub(crate) fn get(&self) -> &CopyTuning {
        &self.0
    }

    /// The chunks of a copy of `len` bytes, in order: contiguous, covering `0..len`, none
    /// longer than a buffer; ramped at both ends (see the module docs).
    pub(crate) fn plan(&self, len: usize) -> Vec<Range<usize>> {
        let max = self.0.chunk;
        let (mut front, mut back) = (Vec::new(), Vec::new());
        let (mut f, mut b) = (RAMP.min(max), RAMP.min(max));
        let mut rest = len;
        while rest > 0 {
            let take = f.min(rest);
            front.push(take);
            rest -= take;
            f = (f * 2).min(max);
            if rest == 0 {
                break;
            }
            let take = b.min(rest);
            back.push(take);
            rest -= take;
            b = (b * 2).min(max);
        }
        let mut at = 0;
        front
            .into_iter()
            .chain(back.into_iter().rev())
            .map(|n| {
                at += n;
                at - n..at
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn check_plan(t: &Tuning, len: usize) -> Vec<Range<usize>> {
        let plan = t.plan(len);
        let mut at = 0;
        for r in &plan {
            assert_eq!(r.start, at, "{len}: chunks are contiguous");
            assert!(!r.is_empty() && r.len() <= t.get().chunk, "{len}: {r:?} fits a buffer");
            at = r.end;
        }
        assert_eq!(at, len, "{len}: the chunks cover the copy");
        plan
    }

    #[test]
    fn any_tuning_is_brought_within_what_works_without_panicking() {
        let wild = [
            CopyTuning { pinned_threshold: 0, chunk: 0, buffers: 0, threads: 0, write_combined: false },
            CopyTuning { pinned_threshold: 1, chunk: 1, buffers: 1, threads: 1, write_combined: true },
            CopyTuning {
                pinned_threshold: usize::MAX,
                chunk: usize::MAX,
                buffers: usize::MAX,
                threads: usize::MAX,
                write_combined: true,
            },
            CopyTuning { pinned_threshold: 5, chunk: 4097, buffers: 3, threads: 7, write_combined: false },
        ];
        for t in wild {
            let c = t.clone().checked();
            assert!(c.pinned_threshold >= 1, "{c:?}");
            assert!((MIN_CHUNK..=MAX_CHUNK).contains(&c.chunk) && c.chunk % 4096 == 0, "{c:?}");
            assert!((2..=MAX_BUFFERS).contains(&c.buffers), "{c:?}");
            assert!((1..=MAX_THREADS).contains(&c.threads), "{c:?}");
            assert_eq!(c.write_combined, t.write_combined);
            assert_eq!(c.clone().checked(), c, "checking twice changes nothing");
            // What the storage runs with is the checked form, whatever it was given.
            let run = Tuning::new(&t);
            assert_eq!(run.get(), &c);
            for len in [0, 1, 4095, 4096, 3 * MIB + 5, 64 * MIB + 1] {
                check_plan(&run, len);
            }
        }
        // Values in range are kept as given.
        let t =
            CopyTuning { pinned_threshold: 3, chunk: 8 * MIB, buffers: 5, threads: 3, write_combined: false };
        assert_eq!(t.clone().checked(), t);
    }

    #[test]
    fn chunks_ramp_up_at_the_start_and_down_at_the_end() {
        let t = Tuning::new(&CopyTuning {
            pinned_threshold: MIB,
            chunk: 8 * MIB,
            buffers: 4,
            threads: 4,
            write_combined: true,
        });
        let plan = check_plan(&t, 1024 * MIB);
        let lens: Vec<usize> = plan.iter().map(Range::len).collect();
        assert_eq!(&lens[..6], &[RAMP, 2 * RAMP, 4 * RAMP, 8 * RAMP, 16 * RAMP, 8 * MIB]);
        assert_eq!(&lens[lens.len() - 5..], &[16 * RAMP, 8 * RAMP, 4 * RAMP, 2 * RAMP, RAMP]);
        assert!(lens.len() < 140, "{} chunks for 1 GiB", lens.len());
        // A copy at the threshold overlaps too: several chunks, small ones first and last.
        let lens: Vec<usize> = check_plan(&t, 4 * MIB).iter().map(Range::len).collect();
        assert!(lens.len() >= 5 && lens[0] == RAMP && *lens.last().unwrap() == RAMP, "{lens:?}");
        // Small and empty copies.
        assert_eq!(t.plan(0), vec![]);
        assert_eq!(t.plan(1000), vec![0..1000]);
        assert_eq!(t.plan(RAMP + 1), vec![0..RAMP, RAMP..RAMP + 1]);
    }

    #[test]
    fn junk_in_the_environment_means_the_default() {
        for junk in
            [None, Some(""), Some("abc"), Some("-1"), Some("0"), Some("1e6"), Some("99999999999999999999999")]
        {
            assert_eq!(count(junk, 7), 7, "{junk:?}");
        }
        for junk in [None, Some(""), Some("2"), Some("maybe")] {
            assert!(switch(junk, true) && !switch(junk, false), "{junk:?}");
        }
        assert_eq!(count(Some(" 4096 "), 7), 4096);
        assert!(!switch(Some("0"), true) && !switch(Some(" off"), true) && switch(Some("yes"), false));
    }

    #[test]
    fn chunks_never_exceed_a_small_buffer() {
        let t = Tuning::new(&CopyTuning {
            pinned_threshold: 1,
            chunk: 64 << 10,
            buffers: 2,
            threads: 2,
            write_combined: true,
        });
        let plan = check_plan(&t, 10 * MIB + 3);
        assert!(plan.iter().all(|r| r.len() <= 64 << 10));
    }
}
