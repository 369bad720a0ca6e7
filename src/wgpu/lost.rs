//! Is this failure a device loss? Every path of the wgpu backend asks here: one
//! [`LostRecord`] per `wgpu::Device`, shared by every allocator on that device.
//!
//! wgpu 30 keeps one lost callback per device (a second replaces the first, and there is no
//! getter), fires it only from a poll once the queue is idle, and keeps device-lost errors out
//! of error scopes. So the first allocator on a device sets the callback, which records the
//! loss here and then calls the app's [`super::WgpuOptions::on_device_lost`] once; every later
//! allocator on the same device shares the record. The decisions:
//!
//! - **Before a call** ([`Loss::check`]): poll without blocking (an idle device reports
//!   its loss at once), then read the record. Calls that poll anyway (waits) and uploads where
//!   wgpu-core runs the device skip it: wgpu refuses their work at once on a device that is no
//!   longer valid (`write_buffer_with` gives `None`, a staging re-map fails). A poll costs
//!   ~150 ns on Vulkan but ~1.5 us on GL (it takes the context lock).
//! - **After a failure** ([`Loss::or_lost`]): let a poll half-way on another thread run
//!   its lost callback, read the record, and where wgpu refused something without reporting a
//!   loss, ask wgpu whether the device is still valid ([`Loss::device_invalid`]: a 4-byte
//!   write into a probe buffer of devalloc's is refused exactly when it is not). A device
//!   destroyed with work still queued is invalid at once but reported only once that work is
//!   done: [`Loss::settle`] waits for the report (a second at most), then records the
//!   loss itself.
//! - **After a panic inside wgpu** ([`Loss::after_panic`]): a real driver-level loss makes
//!   `Device::poll` panic, but so does a race inside wgpu-core on a healthy device (item 2 of
//!   `workarounds.rs`). A panic is a loss only once the probe says the device is invalid;
//!   otherwise it is logged and the device keeps working.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::options::DeviceLostHandler;
use super::platform::{Current, LossSignal, Platform, Record};
use super::workarounds;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::sync::lock;

/// A 4-byte buffer of devalloc's own and the queue, for asking wgpu whether the device is valid.
struct Probe {
    queue: wgpu::Queue,
    buffer: wgpu::Buffer,
}

/// Whether (and why) one wgpu device is lost: shared by every allocator on the device, and
/// marked by the device's lost callback (which holds it weakly; it holds no wgpu object, so the
/// callback is `Send` wherever wgpu asks for it).
pub(crate) struct LostRecord {
    lost: AtomicBool,
    reason: Mutex<String>,
    on_lost: Mutex<Option<DeviceLostHandler>>,
    /// Its key in the platform's table of records.
    serial: u64,
}

/// One allocator's view of its device's loss: the shared record, and what it asks wgpu with.
/// Every decision "is this failure a device loss?" of the wgpu backend is made here.
pub(crate) struct Loss {
    record: Arc<LostRecord>,
    device: wgpu::Device,
    /// `None` where wgpu-core does not run the device (browser WebGPU), or wgpu refused it.
    probe: Option<Probe>,
    /// The device, as errors and log lines name it.
    id: Device,
}

impl Loss {
    /// The loss view of `device` for the allocator that calls it `id`, over the device's record:
    /// the one another allocator made, or a new one that takes the device's lost callback. An
    /// `on_lost` handler for a device that already has one is refused.
    // In the browser wgpu's types are not `Send`: the `Arc` is shared on one thread there, and
    // with the polling thread natively.
    #[allow(clippy::arc_with_non_send_sync)]
    pub fn of(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        id: Device,
        on_lost: Option<DeviceLostHandler>,
    ) -> Result<Arc<Loss>> {
        let record = LostRecord::of(device, on_lost)?;
        Ok(Arc::new(Loss { record, device: device.clone(), probe: Probe::new(device, queue, id), id }))
    }

    /// Records the loss (the first time) and calls the app's handler once.
    pub fn mark(&self, message: &str) {
        self.record.mark(None, message);
    }

    /// Whether the loss is recorded. In the browser, also whether the browser has taken the
    /// device away without wgpu knowing yet (`GPUDevice.destroy()`, a lost WebGL2 context: see
    /// `platform/web.rs`), which this then records.
    pub fn is_lost(&self) -> bool {
        if self.record.lost.load(Ordering::Acquire) {
            return true;
        }
        if let Some((reason, message)) = Current::taken_away(self.record.serial) {
            self.record.mark(Some(reason), message);
            return true;
        }
        false
    }

    /// The [`Error::DeviceLost`] of this device.
    pub fn error(&self) -> Error {
        Error::DeviceLost { device: self.id, reason: lock(&self.record.reason).clone() }
    }

    /// [`Error::DeviceLost`] if the device is lost, after a poll that does not block (which
    /// fires the lost callback on an idle device that was destroyed or lost).
    pub fn check(&self) -> Result<()> {
        if !self.is_lost() && !Current::poll_now(&self.device) {
            self.after_panic("polling the device");
        }
        if self.is_lost() {
            return Err(self.error());
        }
        Ok(())
    }

    /// `r`, or [`Error::DeviceLost`] when it failed because the device is lost (see the module
    /// docs).
    pub fn or_lost<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            // A poll on another thread may have failed this call (a destroyed device's buffers
            // go first) and be about to run the lost callback: let it finish.
            Current::finish_polls();
            self.check()?;
            // wgpu refused something, and has not reported a loss: a device destroyed with
            // work still queued is invalid at once but reported only once that work is done.
            if matches!(e, Error::Backend { .. }) && self.device_invalid() == Some(true) {
                return Err(self.settle());
            }
        }
        r
    }

    /// After wgpu refused work because the device is no longer valid (destroyed or lost): waits
    /// for wgpu to report the loss (it does once the queue is empty: up to a second here), and
    /// returns it. If wgpu still has not reported it, devalloc records the loss itself.
    pub fn settle(&self) -> Error {
        if !self.is_lost() {
            Current::finish_polls();
            if !Current::poll_until_idle(&self.device) {
                self.after_panic("polling the device");
            }
        }
        if !self.is_lost() {
            self.mark(
                "the device is no longer valid (destroyed or lost), and wgpu had not reported it after its queue was given a second to finish",
            );
        }
        self.error()
    }

    /// Whether wgpu-core (where it runs the device: native, WebGL2) says the device is no longer
    /// valid: a 4-byte write into the probe buffer is refused (`None`) exactly then (an
    /// out-of-memory refusal is caught by the scope, and counts as valid). `None` where it
    /// cannot tell.
    pub fn device_invalid(&self) -> Option<bool> {
        let probe = self.probe.as_ref()?;
        let size = wgpu::BufferSize::new(4).expect("non-zero");
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let refused = probe.queue.write_buffer_with(&probe.buffer, 0, size).is_none();
        let (oom, validation) = (oom.pop(), validation.pop());
        let caught = Current::settle(async { oom.await.or(validation.await) }, self.id, "probing the device");
        Some(refused && caught.is_none())
    }

    /// A panic came out of wgpu during `what`: a loss if the device is no longer valid (or that
    /// cannot be told), else logged, and the device keeps working.
    pub fn after_panic(&self, what: &str) {
        if self.is_lost() {
            return;
        }
        match self.device_invalid() {
            Some(false) => log::warn!(
                "devalloc: {what} panicked inside wgpu, but {} is still valid: carrying on ({})",
                self.id,
                workarounds::PANIC_ON_A_HEALTHY_DEVICE
            ),
            Some(true) => {
                self.mark(&format!("{what} panicked inside wgpu and the device is no longer valid"))
            }
            None => self.mark(&format!("{what} panicked inside wgpu (taken as a driver-level loss)")),
        }
    }
}

impl LossSignal for Loss {
    fn is_lost(&self) -> bool {
        Loss::is_lost(self)
    }

    fn mark(&self, message: &str) {
        Loss::mark(self, message)
    }

    fn after_panic(&self, what: &str) {
        Loss::after_panic(self, what)
    }

    fn error(&self) -> Error {
        Loss::error(self)
    }
}

impl Record for LostRecord {
    fn mark_lost(&self, reason: Option<wgpu::DeviceLostReason>, message: &str) {
        self.mark(reason, message)
    }
}

impl LostRecord {
    /// The record of `device`: the one another allocator made, or a new one that takes the
    /// device's lost callback. An `on_lost` handler for a device that already has one is refused.
    fn of(device: &wgpu::Device, on_lost: Option<DeviceLostHandler>) -> Result<Arc<LostRecord>> {
        let mut handler = on_lost;
        let record = Current::record_of(device, |serial| {
            let record = Arc::new(LostRecord {
                lost: AtomicBool::new(false),
                reason: Mutex::new(String::new()),
                on_lost: Mutex::new(handler.take()),
                serial,
            });
            let weak: Weak<LostRecord> = Arc::downgrade(&record);
            device.set_device_lost_callback(move |reason, message| {
                if let Some(record) = weak.upgrade() {
                    record.mark(Some(reason), &message);
                }
            });
            record
        });
        if let Some(h) = handler {
            let mut slot = lock(&record.on_lost);
            if slot.is_some() {
                return Err(Error::invalid_argument(
                    "this wgpu device already has an on_device_lost handler from an earlier allocator on it; give it once",
                ));
            }
            *slot = Some(h);
        }
        Ok(record)
    }

    /// Records the loss (the first time) and calls the app's handler once.
    pub(crate) fn mark(&self, reason: Option<wgpu::DeviceLostReason>, message: &str) {
        {
            let mut r = lock(&self.reason);
            if self.lost.load(Ordering::Acquire) {
                return;
            }
            *r = match reason {
                Some(reason) => format!("{reason:?}: {message}"),
                None => message.to_string(),
            };
            self.lost.store(true, Ordering::Release);
        }
        match reason {
            // The app destroyed it: nothing went wrong.
            Some(wgpu::DeviceLostReason::Destroyed) => log::info!("devalloc: a wgpu device was destroyed"),
            _ => log::error!("devalloc: a wgpu device was lost: {message}"),
        }
        let handler = lock(&self.on_lost).take();
        if let Some(h) = handler {
            h(reason.unwrap_or(wgpu::DeviceLostReason::Unknown), message);
        }
    }
}

impl Probe {
    /// The probe of `device`, where wgpu-core runs it (so that it refuses work on an invalid
    /// device at once); made inside error scopes, so a refusal never reaches the app's handler.
    fn new(device: &wgpu::Device, queue: &wgpu::Queue, id: Device) -> Option<Probe> {
        if !Current::wgpu_core_inside(&device.adapter_info()) {
            return None;
        }
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("devalloc device probe"),
            size: 4,
            usage: wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let (oom, validation) = (oom.pop(), validation.pop());
        let caught = Current::settle(async { oom.await.or(validation.await) }, id, "making the probe buffer");
        caught.is_none().then(|| Probe { queue: queue.clone(), buffer })
    }
}

impl Drop for LostRecord {
    fn drop(&mut self) {
        Current::forget_record(self.serial);
    }
}
