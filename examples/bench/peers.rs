//! What a careful wgpu user writes without devalloc: the peers of the benchmark.
use std::sync::{Arc, Mutex};

pub fn wait(device: &wgpu::Device) {
    device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
}

pub fn buffer(device: &wgpu::Device, size: usize, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("peer"),
        size: size as u64,
        usage,
        mapped_at_creation: false,
    })
}

/// A storage buffer as an app has one: the target of uploads, the source of downloads.
pub fn storage(device: &wgpu::Device, size: usize) -> wgpu::Buffer {
    buffer(
        device,
        size,
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    )
}

/// `queue.write_buffer`, then submit and wait until it is on the device.
pub fn write_buffer(device: &wgpu::Device, queue: &wgpu::Queue, dst: &wgpu::Buffer, data: &[u8]) {
    queue.write_buffer(dst, 0, data);
    queue.submit([]);
    wait(device);
}

/// `wgpu::util::StagingBelt`, kept across calls, then submit, recall and wait. With `piece`
/// as large as the transfer it is one mapped slice and one copy (the belt's chunk is that
/// size); with smaller pieces, one `write_buffer` per piece into chunks of that size, all in
/// one submission (on GL a 256 MiB transfer in 4 MiB pieces measured 1.4-1.5x one whole
/// piece: a careful user's other choice).
pub struct Belt {
    belt: wgpu::util::StagingBelt,
    piece: usize,
}

impl Belt {
    pub fn new(device: &wgpu::Device, size: usize) -> Self {
        Belt::pieces(device, size, size)
    }

    /// A belt that writes a transfer in pieces of at most `piece` bytes.
    pub fn pieces(device: &wgpu::Device, size: usize, piece: usize) -> Self {
        let piece = piece.min(size).max(1);
        Belt { belt: wgpu::util::StagingBelt::new(device.clone(), piece.max(1 << 20) as u64), piece }
    }

    pub fn upload(&mut self, device: &wgpu::Device, queue: &wgpu::Queue, dst: &wgpu::Buffer, data: &[u8]) {
        let mut enc = device.create_command_encoder(&Default::default());
        for (k, part) in data.chunks(self.piece).enumerate() {
            let size = wgpu::BufferSize::new(part.len() as u64).expect("non-empty");
            let at = (k * self.piece) as u64;
            self.belt.write_buffer(&mut enc, dst, at, size).copy_from_slice(part);
        }
        self.belt.finish();
        queue.submit([enc.finish()]);
        self.belt.recall();
        wait(device);
    }
}

fn copy_out(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    src: &wgpu::Buffer,
    staging: &wgpu::Buffer,
    dst: &mut [u8],
) {
    let n = dst.len() as u64;
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, staging, 0, n);
    queue.submit([enc.finish()]);
    staging.map_async(wgpu::MapMode::Read, 0..n, |r| r.expect("map"));
    wait(device);
    dst.copy_from_slice(&staging.get_mapped_range(0..n).expect("mapped"));
    staging.unmap();
}

/// A fresh `MAP_READ` buffer per download.
pub fn fresh_download(device: &wgpu::Device, queue: &wgpu::Queue, src: &wgpu::Buffer, dst: &mut [u8]) {
    let staging = buffer(device, dst.len(), wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
    copy_out(device, queue, src, &staging, dst);
}

/// How the bench checks what an upload left, untimed: one `MAP_READ` buffer made before the
/// timed calls, compared in place. It allocates nothing while the bench runs (no device
/// buffer, no host vector: on a software GPU either would change what the next timed call
/// meets, through the driver's memory or the C allocator's) and goes through no one's staging.
pub struct Readback {
    staging: wgpu::Buffer,
}

impl Readback {
    /// A readback of up to `size` bytes.
    pub fn new(device: &wgpu::Device, size: usize) -> Self {
        Readback {
            staging: buffer(device, size, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
        }
    }

    /// Whether `want.len()` bytes of `src` from `offset` equal `want`.
    pub fn holds(
        &self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        src: &wgpu::Buffer,
        offset: u64,
        want: &[u8],
    ) -> bool {
        let n = want.len() as u64;
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, offset, &self.staging, 0, n);
        queue.submit([enc.finish()]);
        self.staging.map_async(wgpu::MapMode::Read, 0..n, |r| r.expect("map"));
        wait(device);
        let same = *self.staging.get_mapped_range(0..n).expect("mapped") == *want;
        self.staging.unmap();
        same
    }
}

/// One `MAP_READ` buffer, reused by every download.
pub struct Reused {
    staging: wgpu::Buffer,
}

impl Reused {
    pub fn new(device: &wgpu::Device, size: usize) -> Self {
        Reused { staging: buffer(device, size, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST) }
    }

    pub fn download(&self, device: &wgpu::Device, queue: &wgpu::Queue, src: &wgpu::Buffer, dst: &mut [u8]) {
        copy_out(device, queue, src, &self.staging, dst);
    }
}

/// `wgpu::util::DownloadBuffer::read_buffer`, then wait and copy out.
pub fn download_buffer(device: &wgpu::Device, queue: &wgpu::Queue, src: &wgpu::Buffer, dst: &mut [u8]) {
    let slot: Arc<Mutex<Option<wgpu::util::DownloadBuffer>>> = Arc::default();
    let s = Arc::clone(&slot);
    wgpu::util::DownloadBuffer::read_buffer(device, queue, &src.slice(0..dst.len() as u64), move |r| {
        *s.lock().unwrap() = Some(r.expect("download"));
    });
    wait(device);
    let got = slot.lock().unwrap().take().expect("the callback ran");
    dst.copy_from_slice(&got);
}

/// A hand-written map of a mappable primary buffer (needs `MAPPABLE_PRIMARY_BUFFERS`).
pub fn mappable(device: &wgpu::Device, size: usize) -> wgpu::Buffer {
    let usage = wgpu::BufferUsages::STORAGE
        | wgpu::BufferUsages::COPY_SRC
        | wgpu::BufferUsages::COPY_DST
        | wgpu::BufferUsages::MAP_READ
        | wgpu::BufferUsages::MAP_WRITE;
    buffer(device, size, usage)
}

pub fn map_write(device: &wgpu::Device, b: &wgpu::Buffer, data: &[u8]) {
    let n = data.len() as u64;
    b.map_async(wgpu::MapMode::Write, 0..n, |r| r.expect("map"));
    wait(device);
    b.get_mapped_range_mut(0..n).expect("mapped").copy_from_slice(data);
    b.unmap();
}

/// Whether a mappable buffer holds `want` at its start: mapped and compared in place, on the
/// host alone (no device copy, nothing allocated).
pub fn map_holds(device: &wgpu::Device, b: &wgpu::Buffer, want: &[u8]) -> bool {
    let n = want.len() as u64;
    b.map_async(wgpu::MapMode::Read, 0..n, |r| r.expect("map"));
    wait(device);
    let same = *b.get_mapped_range(0..n).expect("mapped") == *want;
    b.unmap();
    same
}

pub fn map_read(device: &wgpu::Device, b: &wgpu::Buffer, dst: &mut [u8]) {
    let n = dst.len() as u64;
    b.map_async(wgpu::MapMode::Read, 0..n, |r| r.expect("map"));
    wait(device);
    dst.copy_from_slice(&b.get_mapped_range(0..n).expect("mapped"));
    b.unmap();
}
