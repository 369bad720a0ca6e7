//! Noticing a lost device: one [`LostRecord`] per `wgpu::Device`, shared by every allocator on
//! that device.
//!
//! wgpu 30 keeps one lost callback per device (a second replaces the first, and there is no
//! getter), fires it only from a poll once the queue is idle, and keeps device-lost errors out
//! of error scopes. So the first allocator on a device sets the callback, which records the
//! loss here and then calls the app's [`super::WgpuOptions::on_device_lost`] once; every later
//! allocator on the same device shares the record. Each devalloc call first polls the device
//! without blocking (so an idle device reports its loss at once) and then reads the record,
//! except calls that poll anyway (waits) and uploads where wgpu-core runs the device: wgpu
//! refuses their work at once on a device that is no longer valid (`write_buffer_with` gives
//! `None`, a staging re-map fails), and they then wait for the loss to be reported. A poll
//! costs ~150 ns on Vulkan but ~1.5 us on GL (it takes the context lock), more than a small
//! upload's own work there.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::options::DeviceLostHandler;
use super::platform;
use crate::device::Device;
use crate::error::{Error, Result};

/// Whether (and why) one wgpu device is lost.
pub(crate) struct LostRecord {
    lost: AtomicBool,
    reason: Mutex<String>,
    on_lost: Mutex<Option<DeviceLostHandler>>,
    /// Its key in the platform's table of records.
    serial: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LostRecord {
    /// The record of `device`: the one another allocator made, or a new one that takes the
    /// device's lost callback. An `on_lost` handler for a device that already has one is refused.
    pub fn of(device: &wgpu::Device, on_lost: Option<DeviceLostHandler>) -> Result<Arc<LostRecord>> {
        let mut handler = on_lost;
        let record = platform::record_of(device, |serial| {
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
    pub fn mark(&self, reason: Option<wgpu::DeviceLostReason>, message: &str) {
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
        log::error!("devalloc: a wgpu device was lost: {message}");
        let handler = lock(&self.on_lost).take();
        if let Some(h) = handler {
            h(reason.unwrap_or(wgpu::DeviceLostReason::Unknown), message);
        }
    }

    /// Whether the loss is recorded.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// [`Error::DeviceLost`] if the device is lost, after a poll that does not block (which
    /// fires the lost callback on an idle device that was destroyed or lost).
    pub fn check(&self, device: &wgpu::Device, id: Device) -> Result<()> {
        if !self.is_lost() && !platform::poll_now(device) {
            self.mark(None, "polling the device panicked (a driver-level loss)");
        }
        if self.is_lost() {
            return Err(self.error(id));
        }
        Ok(())
    }

    /// The [`Error::DeviceLost`] of device `id`.
    pub fn error(&self, id: Device) -> Error {
        Error::DeviceLost { device: id, reason: lock(&self.reason).clone() }
    }
}

impl Drop for LostRecord {
    fn drop(&mut self) {
        platform::forget_record(self.serial);
    }
}
