//! Loads a safetensors file's weights onto a device, streamed from the file through a bounded
//! host window: the file is never read whole.
//!
//! ```sh
//! cargo run --release --example load -- FILE --backend vulkan [--verify] [--planned|--separate] [--window-mib 8]
//! cargo run --release --example load -- --write-test-file FILE   # a small multi-tensor file
//! ```
//!
//! The header is read by hand (its 8-byte length, then the JSON) and parsed with the
//! `safetensors` crate's `Metadata`; each tensor gets an allocation of its own (or, with
//! `--planned`, a place in one planned buffer laid out by devalloc's planner) and is streamed
//! into it with `devalloc::stream::write_from_reader`. A progress bar runs on a terminal. With
//! `--verify` each tensor is read back, a window at a time, and printed as
//! `tensor NAME bytes=N fnv1a64=HEX` (FNV-1a 64 of the bytes read back), so that anyone can check
//! them against the file. The last line: `load: file=F bytes=N tensors=T seconds=S gbps=G
//! peak_host_bytes=H`, where `H` is the most host memory the load held beyond the device's
//! (the Rust heap's growth, less the device's own memory where that is host memory, plus the
//! backend's staging); the line before it gives the process's peak resident set.

#[path = "support/heap.rs"]
mod heap;
#[path = "support/logging.rs"]
mod logging;

use std::io::{Read, Seek, SeekFrom};
use std::time::Instant;

use devalloc::plan::{plan, Strategy, TensorLife};
use devalloc::stream::{write_from_reader, StreamOptions};
use devalloc::{DeviceAllocator, DevicePtr, PlannedMemory, DEFAULT_ALIGNMENT};
use safetensors::tensor::{Dtype, Metadata, TensorView};

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

type Failure = Box<dyn std::error::Error>;

struct Args {
    file: String,
    backend: String,
    verify: bool,
    planned: bool,
    window: usize,
}

fn args() -> Result<Option<Args>, Failure> {
    let mut it = std::env::args().skip(1);
    let mut a =
        Args { file: String::new(), backend: "host".into(), verify: false, planned: false, window: 8 << 20 };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--backend" => a.backend = it.next().ok_or("--backend needs a value: host, vulkan, gl, cuda")?,
            "--verify" => a.verify = true,
            "--planned" => a.planned = true,
            "--separate" => a.planned = false,
            "--window-mib" => {
                let mib: usize = it.next().ok_or("--window-mib needs a number")?.parse()?;
                a.window =
                    mib.checked_mul(1 << 20).filter(|&w| w > 0).ok_or("--window-mib must be 1 or more")?;
            }
            "--write-test-file" => {
                write_test_file(&it.next().ok_or("--write-test-file needs a path")?)?;
                return Ok(None);
            }
            f if !f.starts_with("--") && a.file.is_empty() => a.file = f.to_string(),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    if a.file.is_empty() {
        return Err(
            "usage: load FILE [--backend host|vulkan|gl|cuda] [--verify] [--planned|--separate] [--window-mib N]".into(),
        );
    }
    Ok(Some(a))
}

fn open(backend: &str) -> Result<Box<dyn DeviceAllocator>, Failure> {
    Ok(match backend {
        "host" => Box::new(devalloc::HostAllocator::new()),
        "vulkan" => Box::new(devalloc::wgpu::WgpuAllocator::new(wgpu::Backend::Vulkan)?),
        "gl" => Box::new(devalloc::wgpu::WgpuAllocator::new(wgpu::Backend::Gl)?),
        #[cfg(feature = "cuda")]
        "cuda" => Box::new(devalloc::cuda::CudaAllocator::new()?),
        #[cfg(not(feature = "cuda"))]
        "cuda" => return Err("this build has no CUDA: build with --features cuda".into()),
        other => return Err(format!("unknown backend {other:?}: host, vulkan, gl or cuda").into()),
    })
}

/// The file's header: its tensors in file order, as (name, start in the file, bytes).
fn header(file: &mut std::fs::File) -> Result<Vec<(String, u64, u64)>, Failure> {
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| format!("reading the header's length: {e}"))?;
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 {
        return Err(
            format!("a header of {n} bytes: not a safetensors file (the format allows 100 MB)").into()
        );
    }
    let mut json = vec![0u8; n as usize];
    file.read_exact(&mut json).map_err(|e| format!("reading the {n}-byte header: {e}"))?;
    let metadata: Metadata = serde_json::from_slice(&json).map_err(|e| format!("the header: {e}"))?;
    let data_start = 8 + n;
    let file_len = file.metadata()?.len();
    let data_len = metadata.data_len() as u64;
    if data_start + data_len != file_len {
        return Err(format!(
            "the header names {data_len} data bytes, the file holds {}",
            file_len - data_start
        )
        .into());
    }
    let infos = metadata.tensors();
    let mut out: Vec<(String, u64, u64)> = metadata
        .offset_keys()
        .into_iter()
        .map(|name| {
            let (s, e) = infos[&name].data_offsets;
            (name, data_start + s as u64, (e - s) as u64)
        })
        .collect();
    out.sort_by_key(|t| t.1);
    Ok(out)
}

fn main() -> Result<(), Failure> {
    logging::init("warn");
    let Some(args) = args()? else { return Ok(()) };
    let alloc = open(&args.backend)?;
    let alloc: &dyn DeviceAllocator = &*alloc;
    let mut file = std::fs::File::open(&args.file).map_err(|e| format!("{}: {e}", args.file))?;
    let tensors = header(&mut file)?;
    let total: u64 = tensors.iter().map(|t| t.2).sum();
    let host_memory_on_heap = args.backend == "host";

    // Where each tensor goes: an allocation each, or one planned buffer.
    let heap_before = heap::now();
    heap::reset_peak();
    let mut owned: Vec<DevicePtr> = Vec::new();
    let planned;
    let places: Vec<DevicePtr> = if args.planned {
        let lives: Vec<_> =
            tensors.iter().map(|t| TensorLife { size: t.2.max(1), first: 0, last: 0 }).collect();
        let layout = plan(&lives, DEFAULT_ALIGNMENT as u64, Strategy::Fast)?;
        let names: Vec<&str> = tensors.iter().map(|t| t.0.as_str()).collect();
        planned = PlannedMemory::from_plan_labeled(alloc, &layout, 0, Some(&args.file), &names)?;
        (0..tensors.len()).map(|i| planned.tensor(i).map(|t| t.ptr)).collect::<Result<_, _>>()?
    } else {
        for (name, _, len) in &tensors {
            // An empty tensor needs no memory: the null pointer serves 0-byte copies.
            let ptr = if *len == 0 {
                DevicePtr::NULL
            } else {
                alloc.allocate_labeled(*len as usize, 0, DEFAULT_ALIGNMENT, name)?
            };
            owned.push(ptr);
        }
        owned.clone()
    };

    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta}",
    )?);
    let mut held = 0i64;
    let start = Instant::now();
    let mut base = 0u64;
    let mut last = None;
    for ((name, at, len), &ptr) in tensors.iter().zip(&places) {
        file.seek(SeekFrom::Start(*at))?;
        let options = StreamOptions::new().window(args.window).total(*len).on_progress(|p| {
            bar.set_position(base + p.done);
            held = held.max(host_held(alloc, heap_before, host_memory_on_heap));
        });
        write_from_reader(alloc, ptr, *len as usize, 0, &mut (&file).take(*len), options)
            .map_err(|e| format!("tensor {name}: {e}"))?;
        base += len;
        if *len > 0 {
            last = Some(ptr);
        }
    }
    // The copies are queued: a read of one byte waits for all of them.
    if let Some(ptr) = last {
        alloc.copy_device_to_host(&mut [0u8; 1], ptr, 0)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();

    if args.verify {
        for ((name, _, len), &ptr) in tensors.iter().zip(&places) {
            println!(
                "tensor {name} bytes={len} fnv1a64={:016x}",
                fnv_on_device(alloc, ptr, *len, args.window)?
            );
        }
    }
    for ptr in owned.into_iter().filter(|p| !p.is_null()) {
        alloc.deallocate(ptr, 0)?;
    }
    if let Some(rss) = heap::peak_resident() {
        println!("resident: peak_bytes={rss}");
    }
    println!(
        "load: file={} bytes={total} tensors={} seconds={seconds:.3} gbps={:.3} peak_host_bytes={}",
        args.file,
        tensors.len(),
        total as f64 / seconds / 1e9,
        held.max(0)
    );
    Ok(())
}

/// Host memory the load holds now beyond what it held before: the heap's growth (less the
/// device's memory where the device is host memory), plus the backend's staging.
fn host_held(alloc: &dyn DeviceAllocator, heap_before: usize, device_on_heap: bool) -> i64 {
    let stats = alloc.stats(0).ok();
    let device = if device_on_heap { stats.map_or(0, |s| s.reserved_bytes) } else { 0 };
    let staging = stats.map_or(0, |s| s.staging_bytes);
    heap::now() as i64 - heap_before as i64 - device as i64 + staging as i64
}

/// FNV-1a 64 of `len` bytes at `ptr`, read back a window at a time.
fn fnv_on_device(
    alloc: &dyn DeviceAllocator,
    ptr: DevicePtr,
    len: u64,
    window: usize,
) -> Result<u64, Failure> {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut buf = vec![0u8; (len as usize).min(window)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        alloc.copy_device_to_host(&mut buf[..n], ptr.offset_u64(done)?, 0)?;
        hash = fnv1a64(hash, &buf[..n]);
        done += n as u64;
    }
    Ok(hash)
}

fn fnv1a64(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash = (hash ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Writes a small file with tensors of awkward sizes and types (one byte, ragged, empty,
/// several windows long) and prints each tensor's line as `--verify` prints it, from the bytes
/// written: a load that verifies prints the same lines.
fn write_test_file(path: &str) -> Result<(), Failure> {
    let specs: [(&str, Dtype, Vec<usize>); 7] = [
        ("embed.weight", Dtype::F32, vec![513, 1031]),
        ("embed.bias", Dtype::F32, vec![1031]),
        ("flag", Dtype::U8, vec![1]),
        ("ragged", Dtype::BF16, vec![3, 7]),
        ("empty", Dtype::F32, vec![0, 4]),
        ("ids", Dtype::I64, vec![17]),
        ("head.weight", Dtype::F16, vec![1031, 1025]),
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|(_, dtype, shape)| {
            let n = shape.iter().product::<usize>() * dtype.bitsize() / 8;
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 32) as u8
                })
                .collect()
        })
        .collect();
    let views = specs
        .iter()
        .zip(&data)
        .map(|((name, dtype, shape), d)| Ok((name.to_string(), TensorView::new(*dtype, shape.clone(), d)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, std::path::Path::new(path))?;
    // The order the file holds them in: the loader prints them so.
    let mut file = std::fs::File::open(path)?;
    for (name, _, len) in header(&mut file)? {
        let i = specs.iter().position(|s| s.0 == name).ok_or("a tensor the file should not hold")?;
        println!("tensor {name} bytes={len} fnv1a64={:016x}", fnv1a64(0xcbf2_9ce4_8422_2325, &data[i]));
    }
    Ok(())
}
