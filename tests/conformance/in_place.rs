//! `DeviceAllocator::fill_in_place`, the route streamed copies take where a backend has it
//! (wgpu's staged route), called directly as a hostile caller would: pieces never
//! past the piece size or the range, a fill that stops early or claims more than it was given,
//! bad ranges refused before `fill` runs, a fill that calls back into the allocator. Where a
//! backend has no such route (`None`) only the refusals are checked.

use devalloc::{DeviceAllocator, DeviceIndex, DevicePtr, DEFAULT_ALIGNMENT};

use super::*;

/// Fills `len` bytes at `dst` from `data` in pieces of `piece`, handing over `stop_after` bytes
/// at most (then fewer than a piece holds): the pieces' sizes and what the call returned.
fn fill(
    a: &dyn DeviceAllocator,
    dst: DevicePtr,
    len: usize,
    i: DeviceIndex,
    piece: usize,
    data: &[u8],
    stop_after: usize,
) -> Option<(Vec<usize>, u64, devalloc::Result<()>)> {
    let (mut pieces, mut given) = (Vec::new(), 0);
    let mut step = |buf: &mut [u8]| {
        pieces.push(buf.len());
        let n = buf.len().min(stop_after - given);
        buf[..n].copy_from_slice(&data[given..given + n]);
        given += n;
        n
    };
    let (landed, r) = a.fill_in_place(dst, len, i, piece, &mut step)?;
    Some((pieces, landed, r))
}

pub async fn fill_in_place(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let size = 8192;
    let ptr = a.allocate(size, i, DEFAULT_ALIGNMENT).unwrap();
    let other = a.allocate(64, i, DEFAULT_ALIGNMENT).unwrap();
    h2d(a, other, &[9u8; 64], i).await.unwrap();
    let before = pattern(size, 4);
    let data = pattern(size, 5);
    h2d(a, ptr, &before, i).await.unwrap();

    // Refused before `fill` runs: past the end, a freed or foreign pointer, a bad index.
    let freed = a.allocate(64, i, DEFAULT_ALIGNMENT).unwrap();
    a.deallocate(freed, i).unwrap();
    let mut called = false;
    let mut never = |_: &mut [u8]| {
        called = true;
        0
    };
    for (dst, len, index, what) in [
        (ptr.offset(8000).unwrap(), 193, i, "past the end"),
        (freed, 16, i, "a freed pointer"),
        (DevicePtr::new(ptr.addr() ^ (1 << 44)), 16, i, "a foreign pointer"),
        (ptr, 16, 99, "a bad index"),
    ] {
        if let Some((landed, r)) = a.fill_in_place(dst, len, index, 64, &mut never) {
            assert!(r.is_err() && landed == 0, "{what}: {landed} landed, {r:?}");
        }
    }
    assert!(!called, "fill ran for a bad range");

    let Some((pieces, landed, r)) = fill(a, ptr, 4100, i, 1000, &data, usize::MAX) else {
        // No in-place route here: the refusals above are all there is to check.
        assert!(read(a, ptr, size, i).await == before, "a refused fill changed the data");
        a.deallocate(ptr, i).unwrap();
        a.deallocate(other, i).unwrap();
        return;
    };
    // Whole: pieces of at most the piece size, their sum the range.
    r.unwrap();
    assert_eq!(landed, 4100);
    assert!(pieces.iter().all(|&p| p > 0 && p <= 1000) && pieces.iter().sum::<usize>() == 4100, "{pieces:?}");
    let mut want = before.clone();
    want[..4100].copy_from_slice(&data[..4100]);
    assert!(read(a, ptr, size, i).await == want, "a whole fill");

    // Stopping early, inside a word and a piece: what was handed over lands, nothing after it,
    // and no piece is asked for after the short one.
    h2d(a, ptr, &before, i).await.unwrap();
    let (pieces, landed, r) = fill(a, ptr, 4100, i, 1000, &data, 1502).unwrap();
    r.unwrap();
    assert_eq!((landed, pieces.len()), (1502, 2), "{pieces:?}");
    let got = read(a, ptr, size, i).await;
    assert!(got[..1502] == data[..1502] && got[1502..] == before[1502..], "a short fill");

    // A fill that claims more than its piece: counted as the piece, never past the range.
    h2d(a, ptr, &before, i).await.unwrap();
    let mut liar = |buf: &mut [u8]| {
        buf.fill(0xAB);
        usize::MAX
    };
    let (landed, r) = a.fill_in_place(ptr.offset(100).unwrap(), 300, i, 128, &mut liar).unwrap();
    r.unwrap();
    assert_eq!(landed, 300);
    let got = read(a, ptr, size, i).await;
    assert!(
        got[..100] == before[..100]
            && got[100..400].iter().all(|&b| b == 0xAB)
            && got[400..] == before[400..]
    );

    // A fill that calls back into the allocator (no lock of the allocator's is held while it
    // runs): the inner copy lands, after it the piece; another allocation is untouched.
    let mut inner = None;
    let mut reentrant = |buf: &mut [u8]| {
        inner = Some(a.copy_host_to_device(ptr.offset(5000).unwrap(), &[1, 2, 3, 4], i));
        buf.len()
    };
    let (landed, r) = a.fill_in_place(ptr, 64, i, 64, &mut reentrant).unwrap();
    r.unwrap();
    assert_eq!(landed, 64);
    assert!(matches!(inner, Some(Ok(()))), "a copy from inside a fill: {inner:?}");
    assert_eq!(read(a, ptr.offset(5000).unwrap(), 4, i).await, [1, 2, 3, 4], "the inner copy");
    assert_eq!(read(a, other, 64, i).await, [9u8; 64], "another allocation changed");
    a.deallocate(ptr, i).unwrap();
    a.deallocate(other, i).unwrap();
}
