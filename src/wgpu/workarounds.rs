//! Every workaround for wgpu-core 30.0.2 in one place: on an upgrade of wgpu, revisit this file.
//!
//! Each item says what wgpu does, what devalloc does instead, and where (grep for
//! `workarounds::`). Once wgpu fixes a bug, its item can go and its callers take the plain call.
//!
//! 1. **Timed waits can panic on a healthy device** ([`wait_until`], [`POLL_PAUSE`]). In
//!    30.0.2, `Device::maintain` reads the fence after a timed-out wait and asserts that an
//!    empty queue means the fence reached the waited index. When another thread's poll (with a
//!    newer fence value) retires the last submission in between, the assertion panics ("If the
//!    queue is empty, the current submission index (N) should be at least the wait submission
//!    index (N+2)"; fixed upstream after 30.0.2, gfx-rs/wgpu#9958). So a blocking wait never
//!    has a timeout: it returns only once the fence has reached the index it read, and the
//!    assertion after it holds. The polling thread never waits inside wgpu. It polls without
//!    blocking and pauses on its own, so it also holds no lock of the device while it pauses
//!    (a waiting poll holds the device's snatch lock, and on GL the context lock, for the
//!    whole wait).
//! 2. **A panic inside a poll is not a loss by itself** ([`PANIC_ON_A_HEALTHY_DEVICE`]). A real
//!    driver-level loss makes `Device::poll` panic, but so does the race of item 1 when a poll
//!    of the app's (which devalloc does not control) has a timeout. `Loss::after_panic` counts
//!    a panic as a loss only once wgpu says the device is invalid, and otherwise logs it and
//!    carries on.
//! 3. **A map callback dropped uncalled means mapped** ([`DROPPED_CALLBACK_IS_MAPPED`]). wgpu
//!    maps every buffer of a poll's batch, then calls their callbacks in turn. When one of them
//!    (an app's) panics, the rest are dropped uncalled, and their buffers stay mapped. So
//!    `mapping::Map::outcome` counts a dropped callback as mapped. The mapped view that follows
//!    is what finds out (wgpu hands out a view of a mapped buffer only, else an error), rather
//!    than a healthy device's copy failing.
//! 4. **An unmap does not always cancel a pending map** ([`LET_A_MAP_FINISH_US`]). Unmapping
//!    cancels a pending map, but not one that a poll on another thread is carrying out at that
//!    moment: wgpu marks the buffer idle while it maps it (so an unmap does nothing), then marks
//!    it mapped and calls back with success. A cancelled map also stays on wgpu's list of
//!    buffers to map. A later poll finds it while a new mapping of the buffer is in place, and
//!    marks the buffer idle for a moment. An unmap in that moment (the app's own) does nothing,
//!    and the buffer stays mapped. So where waiting is allowed (natively), a `MapGuard` dropped
//!    with its map pending lets the map finish (polling, at most this long) and unmaps then. It
//!    cancels only a map that did not finish by then, or one that will never finish here.

use std::time::Duration;

#[cfg_attr(web, allow(dead_code))]
/// Item 1: the poll of a blocking wait, for `index` (or everything submitted): never with a
/// timeout.
pub(crate) fn wait_until(index: Option<wgpu::SubmissionIndex>) -> wgpu::PollType {
    wgpu::PollType::Wait { submission_index: index, timeout: None }
}

#[cfg_attr(web, allow(dead_code))]
/// Item 1: the polling thread's longest pause between two non-blocking polls (it never waits
/// inside wgpu).
pub(crate) const POLL_PAUSE: Duration = Duration::from_micros(500);

/// Item 2: what the log says when a poll panicked on a device that wgpu still calls valid.
pub(crate) const PANIC_ON_A_HEALTHY_DEVICE: &str =
    "wgpu-core 30.0.2 asserts in Device::maintain when polls race, gfx-rs/wgpu#9958";

/// Item 3: a map callback that wgpu drops without calling it counts as mapped.
pub(crate) const DROPPED_CALLBACK_IS_MAPPED: bool = true;

/// Item 4: how long a `MapGuard` dropped with its map pending lets the map finish, natively,
/// before it cancels it.
pub(crate) const LET_A_MAP_FINISH_US: u64 = 1_000_000;
