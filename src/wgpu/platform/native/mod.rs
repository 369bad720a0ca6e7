//! The native side of the platform seam (see the parent module): polls, the table of lost
//! records, and (in `waits.rs`) the polling thread and the waits.

mod waits;

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use futures_channel::oneshot;

use super::{LossSignal, On, Platform, Record};
use crate::bounce::Mode;
use crate::device::{Device, DeviceType};
use crate::error::Result;
use crate::sync::{lock, Unpoisoned};

/// The platform of a native build.
pub(crate) struct Native;

/// Held (shared) by every short poll devalloc makes: the polling thread's and `poll_now`'s.
/// A poll fires the callbacks wgpu made ready only after it has already released the device's
/// buffers; [`Platform::finish_polls`] waits out such a poll, so that a failure it caused can be
/// told apart from a loss it is about to report.
static POLLS: RwLock<()> = RwLock::new(());

impl Platform for Native {
    const CAN_BLOCK: bool = true;
    const IN_BROWSER: bool = false;
    const SCOPE_CHECKED_WORK: bool = true;

    type Waiter = waits::Waiter;

    fn waiter(device: &wgpu::Device, lost: Arc<dyn LossSignal>) -> waits::Waiter {
        waits::Waiter::new(device, lost)
    }

    fn poll_now(device: &wgpu::Device) -> bool {
        let _polling = POLLS.read().unpoisoned();
        catch_unwind(AssertUnwindSafe(|| {
            let _ = device.poll(wgpu::PollType::Poll);
        }))
        .is_ok()
    }

    /// Non-blocking polls with short sleeps, never a wait with a timeout (see `waits.rs`).
    fn poll_until_idle(device: &wgpu::Device) -> bool {
        let _polling = POLLS.read().unpoisoned();
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut pause = waits::MIN_PAUSE;
        loop {
            match catch_unwind(AssertUnwindSafe(|| device.poll(wgpu::PollType::Poll))) {
                Err(_) => return false,
                Ok(Ok(wgpu::PollStatus::QueueEmpty) | Err(_)) => return true,
                Ok(Ok(_)) if Instant::now() >= deadline => return true,
                Ok(Ok(_)) => {}
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(waits::MAX_PAUSE);
        }
    }

    fn finish_polls() {
        drop(POLLS.write().unpoisoned());
    }

    /// On native (wgpu-core) the verdict is ready at once.
    fn settle(
        verdict: impl Future<Output = Option<wgpu::Error>> + 'static,
        _id: Device,
        _what: &str,
    ) -> Option<wgpu::Error> {
        crate::bounce::run_blocking(verdict)
    }

    fn settle_buffer(
        verdict: impl Future<Output = Option<wgpu::Error>> + 'static,
        id: Device,
        what: &str,
        _refused: Box<dyn FnOnce() + 'static>,
    ) -> Option<wgpu::Error> {
        Self::settle(verdict, id, what)
    }

    async fn adapters(instance: &wgpu::Instance, backend: wgpu::Backend) -> Vec<wgpu::Adapter> {
        instance.enumerate_adapters(backend.into()).await
    }

    fn record_of<R: Record>(device: &wgpu::Device, make: impl FnOnce(u64) -> Arc<R>) -> Arc<R> {
        let key = DeviceKey::of(device);
        let mut table = lock(&RECORDS);
        let found = table.iter().find(|(k, ..)| *k == key);
        if let Some(r) = found.and_then(|(_, _, w)| w.downcast_ref::<Weak<R>>()?.upgrade()) {
            return r;
        }
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let record = make(serial);
        table.retain(|(k, ..)| *k != key);
        table.push((key, serial, Box::new(Arc::downgrade(&record))));
        record
    }

    fn forget_record(serial: u64) {
        lock(&RECORDS).retain(|(_, s, _)| *s != serial);
    }

    /// Blocking waits poll inline; async ones return `Pending` and are woken through the
    /// polling thread.
    async fn wait<T>(
        on: On<'_, waits::Waiter>,
        rx: oneshot::Receiver<T>,
        index: Option<wgpu::SubmissionIndex>,
        mode: Mode,
        idle_gives_up: bool,
    ) -> Result<T> {
        waits::wait(on, rx, index, mode, idle_gives_up).await
    }

    fn wait_blocking<T>(
        on: On<'_, waits::Waiter>,
        take: impl FnMut() -> std::result::Result<Option<T>, ()>,
    ) -> Result<T> {
        waits::wait_blocking(on, take)
    }

    fn open_blocking<T>(
        _device_type: DeviceType,
        _backend: wgpu::Backend,
        open: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        pollster::block_on(open)
    }

    fn no_adapter(_backend: wgpu::Backend) -> String {
        "wgpu found none (is a driver installed?)".into()
    }

    /// Always on native.
    fn wgpu_core_inside(_info: &wgpu::AdapterInfo) -> bool {
        true
    }

    /// Natively wgpu hears of every loss itself (from a poll).
    fn taken_away(_serial: u64) -> Option<(wgpu::DeviceLostReason, &'static str)> {
        None
    }
}

/// Which device an entry is for. wgpu compares devices by an id that is unique only within
/// one `wgpu::Instance` (two instances both have a device 0), so the key adds the address of
/// wgpu-hal's device object, which is unique while the device lives (the table keeps it alive).
#[derive(PartialEq)]
struct DeviceKey {
    device: wgpu::Device,
    hal: Option<usize>,
}

impl DeviceKey {
    fn of(device: &wgpu::Device) -> Self {
        DeviceKey { device: device.clone(), hal: hal_address(device) }
    }
}

/// The address of wgpu-hal's device object behind `device`, for the backends this build has.
fn hal_address(device: &wgpu::Device) -> Option<usize> {
    #[cfg(hal_vulkan)]
    if let Some(a) = hal_address_as::<wgpu::hal::api::Vulkan>(device) {
        return Some(a);
    }
    #[cfg(hal_gles)]
    if let Some(a) = hal_address_as::<wgpu::hal::api::Gles>(device) {
        return Some(a);
    }
    #[cfg(hal_metal)]
    if let Some(a) = hal_address_as::<wgpu::hal::api::Metal>(device) {
        return Some(a);
    }
    #[cfg(hal_dx12)]
    if let Some(a) = hal_address_as::<wgpu::hal::api::Dx12>(device) {
        return Some(a);
    }
    let _ = device;
    None
}

/// The address of `device`'s hal device if it is of backend `A`.
#[allow(unsafe_code, dead_code)]
fn hal_address_as<A: wgpu::hal::Api>(device: &wgpu::Device) -> Option<usize> {
    // SAFETY: only the address of the hal device is taken; nothing is called on it and the
    // guard is dropped at once, so none of wgpu-hal's rules can be broken.
    let hal = unsafe { device.as_hal::<A>() }?;
    Some(std::ptr::from_ref::<A::Device>(&hal) as usize)
}

/// Each device's record: its key, serial, and a `Weak<R>` of the type `record_of` was asked for.
type RecordTable = Vec<(DeviceKey, u64, Box<dyn Any + Send + Sync>)>;
static RECORDS: Mutex<RecordTable> = Mutex::new(Vec::new());
static SERIAL: AtomicU64 = AtomicU64::new(1);
