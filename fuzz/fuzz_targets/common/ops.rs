//! The calls of the contract model (`contract.rs`): what the fuzzer's bytes decode to, and
//! how the model runs and judges each one (`Model::apply`).
use arbitrary::Arbitrary;
use devalloc::{DevicePtr, Error, PointerProblem};

use super::{pattern, problem, Kind, Model, Place, Refused};

/// A size: small mostly, any `usize` sometimes.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Size {
    Small(u16),
    Any(u64),
}

impl Size {
    fn get(self) -> usize {
        match self {
            Size::Small(v) => usize::from(v) % 4097,
            Size::Any(v) => v as usize,
        }
    }
}

/// Where a pointer points: at a live, freed or planned allocation (picked modulo their count),
/// near or far from one, or anywhere.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Target {
    Live(u8),
    Stale(u8),
    Planned(u8),
    Near { k: u8, delta: i16 },
    Far { k: u8, off: u64 },
    Raw(u64),
}

/// One contract call. Copy lengths of host buffers stay small (`u16`); the rest may be any.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    Alloc { size: Size, align: u8, raw_align: u64, how: u8, label: String },
    Free(Target),
    Write { at: Target, len: u16, seed: u8, asynch: bool },
    Read { at: Target, len: u16, asynch: bool },
    Copy { dst: Target, src: Target, len: Size, asynch: bool },
    CheckRange { at: Target, len: Size },
    InitBuffer { id: u8, size: Size },
    OffsetAddress { id: u8, off: Size, len: Size },
    ReleaseBuffers,
    EmptyCache,
    SetLimit(u32),
    WrongIndex { index: u8, what: u8 },
    Snapshot,
}

impl Model<'_> {
    pub(super) fn apply(&mut self, op: &Op) -> Refused {
        let a = self.a;
        match op {
            Op::Alloc { size, align, raw_align, how, label } => {
                let size = size.get();
                let align = match align {
                    0..128 => 1usize << (align % 13),
                    128..192 => 1usize << (align % 64),
                    _ => *raw_align as usize,
                };
                let valid = size > 0 && align.is_power_of_two();
                let r = match how % 3 {
                    0 => a.allocate(size, 0, align),
                    1 => a.allocate_labeled(size, 0, align, label),
                    _ => a.allocate_planned(u32::from(*how), size, 0, align),
                };
                self.alloc_result(r, size, align, valid, Kind::Live, 0)
            }
            Op::Free(t) => {
                let addr = self.addr(*t);
                let r = a.deallocate(DevicePtr::new(addr), 0);
                match (self.place(addr), r) {
                    (Place::In(Kind::Live, i, 0), Ok(())) => {
                        self.deallocations += 1;
                        let b = self.live.swap_remove(i);
                        self.freed_whole = !b.piece;
                        self.freed.push(b.base);
                        Refused::No
                    }
                    (Place::In(Kind::Planned, i, 0), Ok(())) => {
                        self.deallocations += 1;
                        let (id, b) = self.planned.swap_remove(i);
                        self.freed_whole = !b.piece;
                        self.orphans.push((id, b.base, b.bytes.len()));
                        self.freed.push(b.base);
                        Refused::No
                    }
                    (Place::In(_, _, off), Err(e))
                        if off > 0 && problem(&e) == Some(PointerProblem::NotAllocationStart) =>
                    {
                        Refused::Yes
                    }
                    (Place::Freed, Err(e)) if problem(&e) == Some(PointerProblem::Freed) => Refused::Yes,
                    (Place::Null, Err(e)) if problem(&e) == Some(PointerProblem::Null) => Refused::Yes,
                    (Place::Unknown, Err(e)) if problem(&e).is_some() => Refused::Yes,
                    (_, r) => panic!("deallocate({addr:#x}): unexpected {r:?}"),
                }
            }
            Op::Write { at, len, seed, asynch } => {
                let (addr, len) = (self.addr(*at), usize::from(*len) % 8193);
                let data = pattern(len, u64::from(*seed));
                let p = DevicePtr::new(addr);
                let r = if *asynch {
                    pollster::block_on(a.copy_host_to_device_async(p, &data, 0))
                } else {
                    a.copy_host_to_device(p, &data, 0)
                };
                self.copied(r, addr, len, |m, k, i, off| {
                    m.block_mut(k, i).bytes[off..off + len].copy_from_slice(&data)
                })
            }
            Op::Read { at, len, asynch } => {
                let (addr, len) = (self.addr(*at), usize::from(*len) % 8193);
                let mut back = vec![0xa5u8; len];
                let p = DevicePtr::new(addr);
                let r = if *asynch {
                    pollster::block_on(a.copy_device_to_host_async(&mut back, p, 0))
                } else {
                    a.copy_device_to_host(&mut back, p, 0)
                };
                let ok = r.is_ok();
                let refused = self.copied(r, addr, len, |m, k, i, off| {
                    assert!(
                        back == m.block(k, i).bytes[off..off + len],
                        "a read at {addr:#x} ({len} bytes) gave other bytes"
                    )
                });
                assert!(ok || back.iter().all(|&b| b == 0xa5), "a refused read wrote to its buffer");
                refused
            }
            Op::Copy { dst, src, len, asynch } => {
                let (d, s, len) = (self.addr(*dst), self.addr(*src), len.get());
                let (dp, sp) = (DevicePtr::new(d), DevicePtr::new(s));
                let r = if *asynch {
                    pollster::block_on(a.copy_device_to_device_async(dp, 0, sp, 0, len))
                } else {
                    a.copy_device_to_device(dp, 0, sp, 0, len)
                };
                let src_range = self.range(s, len);
                match src_range {
                    Ok((k, i, off)) if len > 0 => {
                        let bytes = self.block(k, i).bytes[off..off + len].to_vec();
                        self.copied(r, d, len, |m, k, i, off| {
                            m.block_mut(k, i).bytes[off..off + len].copy_from_slice(&bytes)
                        })
                    }
                    _ if len == 0 => self.copied(r, d, len, |_, _, _, _| {}),
                    Ok(_) => unreachable!(),
                    Err(_) => match r {
                        Err(e) if problem(&e).is_some() || matches!(e, Error::OutOfBounds { .. }) => {
                            if let Place::In(k, i, _) = self.place(d) {
                                self.verify(k, i);
                            }
                            Refused::Yes
                        }
                        r => panic!("copy from a bad range {s:#x} ({len} bytes) to {d:#x}: unexpected {r:?}"),
                    },
                }
            }
            Op::CheckRange { at, len } => {
                let (addr, len) = (self.addr(*at), len.get());
                let r = a.check_range(DevicePtr::new(addr), len, 0);
                self.copied(r, addr, len, |_, _, _, _| {});
                Refused::Yes // it never changes anything
            }
            Op::InitBuffer { id, size } => {
                let (id, size) = (u32::from(id % 4), size.get());
                let taken =
                    self.planned.iter().any(|(i, _)| *i == id) || self.orphans.iter().any(|o| o.0 == id);
                let r = a.init_buffer(id, size, 0);
                if taken {
                    assert!(
                        matches!(r, Err(Error::InvalidArgument { .. })),
                        "init_buffer of a taken id {id}: {r:?}"
                    );
                    return Refused::Yes;
                }
                self.alloc_result(r, size, devalloc::DEFAULT_ALIGNMENT, size > 0, Kind::Planned, id)
            }
            Op::OffsetAddress { id, off, len } => {
                let (id, off, len) = (u32::from(id % 4), off.get(), len.get());
                let r = a.get_offset_address(id, off, len, 0);
                let known = self
                    .planned
                    .iter()
                    .map(|(i, b)| (*i, b.base, b.bytes.len()))
                    .chain(self.orphans.iter().copied());
                match (known.clone().find(|o| o.0 == id), r) {
                    (None, Err(Error::NotFound { .. })) => {}
                    (Some((_, base, size)), Ok(p))
                        if (off as u64).checked_add(len as u64).is_some_and(|e| e <= size as u64) =>
                    {
                        assert_eq!(p.addr(), base + off as u64, "get_offset_address({id}, {off}, {len})");
                    }
                    (Some((.., size)), Err(Error::OutOfBounds { .. }))
                        if (off as u128) + (len as u128) > size as u128 => {}
                    (_, r) => panic!("get_offset_address({id}, {off}, {len}): unexpected {r:?}"),
                }
                Refused::Yes
            }
            Op::ReleaseBuffers => {
                let r = a.release_buffers(0);
                if self.orphans.is_empty() {
                    r.expect("release_buffers");
                } else {
                    let stale = r.expect_err("release_buffers with a planned buffer freed behind its back");
                    assert!(
                        matches!(problem(&stale), Some(PointerProblem::Freed)),
                        "release_buffers: {stale}"
                    );
                    self.orphans.clear();
                }
                self.freed_whole = self.planned.iter().all(|(_, b)| !b.piece);
                for (_, b) in self.planned.drain(..) {
                    self.deallocations += 1;
                    self.freed.push(b.base);
                }
                Refused::No
            }
            Op::EmptyCache => {
                let before = a.stats(0).expect("stats");
                let given = a.empty_cache();
                let after = a.stats(0).expect("stats");
                assert!(
                    given <= before.cached_bytes,
                    "empty_cache gave back {given}, more than was cached: {before:?}"
                );
                assert_eq!(
                    (after.cached_bytes, after.reserved_bytes),
                    (before.cached_bytes - given, before.reserved_bytes - given),
                    "{after:?}"
                );
                // Every cached byte goes back, but the free ranges of a split block (host memory,
                // CUDA) with a live piece: where nothing splits (wgpu), where no allocation the
                // model holds may be a piece, or where nothing is live, all of it.
                if !self.splits || !self.any_piece() || after.live_allocations == 0 {
                    assert_eq!(
                        (given, after.cached_bytes),
                        (before.cached_bytes, 0),
                        "empty_cache kept cached bytes with no split block to keep them \
                         (splits: {}, live: {})",
                        self.splits,
                        after.live_allocations
                    );
                }
                // And at least the whole blocks the model knows are cached.
                assert!(
                    given >= self.whole_cached,
                    "empty_cache gave back {given}, less than the {} bytes of whole blocks cached",
                    self.whole_cached
                );
                Refused::No
            }
            Op::SetLimit(v) => {
                self.limit = (64 << 10) + u64::from(*v) % (8 << 20);
                (self.set_limit)(self.limit);
                Refused::No
            }
            Op::WrongIndex { index, what } => {
                let index = u32::try_from(a.device_count())
                    .unwrap_or(u32::MAX)
                    .saturating_add(u32::from(*index)) as devalloc::DeviceIndex;
                let p = DevicePtr::new(self.live.first().map_or(0, |b| b.base));
                let r = match what % 8 {
                    0 => a.allocate(64, index, 64).map(drop),
                    1 => a.deallocate(p, index),
                    2 => a.copy_host_to_device(p, &[1], index),
                    3 => a.copy_device_to_host(&mut [0], p, index),
                    4 => a.copy_device_to_device(p, index, p, 0, 1),
                    5 => a.init_buffer(9, 64, index).map(drop),
                    6 => a.get_offset_address(0, 0, 1, index).map(drop),
                    _ => a.stats(index).map(drop),
                };
                assert!(
                    matches!(r, Err(Error::NoSuchDevice { .. })),
                    "device {index} (call {}): {r:?}",
                    what % 8
                );
                Refused::Yes
            }
            Op::Snapshot => {
                let snap = a.snapshot().expect("snapshot");
                let dev = &snap.devices[0];
                assert_eq!(
                    dev.live.len(),
                    self.live.len() + self.planned.len(),
                    "snapshot's live allocations"
                );
                assert_eq!(
                    dev.planned.len(),
                    self.planned.len() + self.orphans.len(),
                    "snapshot's planned buffers"
                );
                let back =
                    devalloc::snapshot::Snapshot::from_json(&snap.to_json()).expect("a snapshot reads back");
                assert!(back == snap, "a snapshot does not round-trip");
                Refused::Yes
            }
        }
    }

    /// Checks a copy's answer against the model for `len` bytes at `addr`, running `done` on
    /// success; verifies the block it touched.
    fn copied(
        &mut self,
        r: devalloc::Result<()>,
        addr: u64,
        len: usize,
        done: impl FnOnce(&mut Self, Kind, usize, usize),
    ) -> Refused {
        if len == 0 {
            assert!(r.is_ok(), "a copy of 0 bytes failed: {r:?}");
            return Refused::No;
        }
        match (self.range(addr, len), r) {
            (Ok((k, i, off)), Ok(())) => {
                done(self, k, i, off);
                self.verify(k, i);
                Refused::No
            }
            (Ok(_), Err(e)) => panic!("{len} bytes at {addr:#x} are in bounds, yet: {e}"),
            (Err(_), Ok(())) => panic!("{len} bytes at {addr:#x} are out of bounds, yet the copy succeeded"),
            (Err(fits), Err(e)) => {
                assert!(fits(&e), "{len} bytes at {addr:#x}: unexpected {e}");
                if let Place::In(k, i, _) = self.place(addr) {
                    self.verify(k, i);
                }
                Refused::Yes
            }
        }
    }
}
