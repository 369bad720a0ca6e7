//! The search's data: its answers, limits, sub-problems and stack frames.

/// Answer of one search.
pub(crate) enum Outcome {
    /// A placement within the capacity (offsets in input order).
    Found(Vec<u64>),
    /// Proven: nothing fits within the capacity.
    Infeasible,
    /// Ran out of nodes, time or memory first.
    Unknown,
}

/// How a node or a group of sub-problems ended.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Everything below it is placed.
    Found,
    /// No placement below it fits.
    NotFound,
    /// A limit was hit.
    Abort,
}

/// A group of tensors solved as one sub-problem, over sections `lo..hi`.
pub(crate) struct Part {
    /// Its tensors, in preorder once the part is opened.
    pub pre: Vec<u32>,
    /// First section.
    pub lo: usize,
    /// One past the last section.
    pub hi: usize,
}

/// A node: choose which candidate of `part` to place next.
pub(crate) struct OrFrame {
    /// The part (index into the engine's parts).
    pub part: usize,
    /// Preorder indices of the unplaced tensors, sorted by (lowest offset, preorder index).
    pub order: Vec<u32>,
    /// Next candidate to try (index into `order`).
    pub next: usize,
    /// (offset, preorder index) of the part's latest placement.
    pub last: (u64, u32),
    /// Candidates at or above this offset are dominated (or cannot fit); the node stops there.
    pub min_top: u64,
    /// The state's trail mark when the node was opened.
    pub mark: usize,
}

/// Independent sub-problems `parts[first..end]`, all of which must be solved.
pub(crate) struct AndFrame {
    /// First part.
    pub first: usize,
    /// One past the last part.
    pub end: usize,
    /// Parts solved so far.
    pub next: usize,
}

/// One entry of the search's explicit stack.
pub(crate) enum Frame {
    /// A choice among candidates.
    Or(OrFrame),
    /// Independent sub-problems.
    And(AndFrame),
}

/// Limits of one search.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    /// Give up after this many nodes.
    pub nodes: u64,
    /// Give up once the state's work counter passes this.
    pub work: u64,
    /// Give up when the clock (`clock::now_us`) passes this; `u64::MAX`: never read it.
    pub deadline_us: u64,
    /// Give up when live frames hold more candidate entries than this.
    pub entries: usize,
    /// 0: break preorder ties by tensor index (MiniMalloc); otherwise by a hash of the index
    /// and this seed, for diverse restarts.
    pub seed: u64,
}

/// SplitMix64's finalizer: a cheap, well-spread hash.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
