//! Static preorders: how the search breaks ties between candidates at the same offset.

use super::state::State;

/// A tensor property a static preorder sorts by (always descending).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    /// Lifetime length in steps.
    Width,
    /// Size times lifetime length.
    Area,
    /// The largest unplaced total among the sections the tensor spans.
    Total,
    /// Size in bytes.
    Size,
    /// Number of tensors it overlaps in time.
    Degree,
}

/// The static preorder used to break ties between candidates: keys compared in turn, all
/// descending, then the tensor index.
pub(crate) type Preorder = [Key; 3];

/// The preorders. The search uses the first three (MiniMalloc's `WAT`, `TAW`, `TWA`); the dives
/// use all six, for diversity.
pub(crate) const PREORDERS: [Preorder; 6] = [
    [Key::Width, Key::Area, Key::Total],
    [Key::Total, Key::Area, Key::Width],
    [Key::Total, Key::Width, Key::Area],
    [Key::Size, Key::Width, Key::Total],
    [Key::Area, Key::Total, Key::Width],
    [Key::Degree, Key::Area, Key::Total],
];

/// How many of [`PREORDERS`] the MiniMalloc-style round-robin uses.
pub(crate) const CLASSIC_PREORDERS: usize = 3;

/// The values tensor `b` is ranked by under `preorder` (compared in turn, larger first).
pub(crate) fn preorder_keys(st: &State<'_>, preorder: Preorder, b: usize) -> [u128; 3] {
    let p = st.p;
    preorder.map(|key| match key {
        Key::Width => u128::from(p.width[b]),
        Key::Area => u128::from(p.size[b]) * u128::from(p.width[b]),
        Key::Total => {
            let sections = p.sec_lo[b] as usize..p.sec_hi[b] as usize;
            u128::from(sections.map(|s| st.total(s)).max().unwrap_or(0))
        }
        Key::Size => u128::from(p.size[b]),
        Key::Degree => p.overlaps(b).len() as u128,
    })
}
