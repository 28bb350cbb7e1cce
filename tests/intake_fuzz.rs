//! Property test of audio intake on hostile input: arbitrary bytes, and structurally valid WAV,
//! FLAC and MP3 headers with arbitrary field values. Intake must return an error or a bounded
//! WAV, never let a panic out (a decoder bug — symphonia's debug-build overflow checks do fire on
//! such input — must end as a clean 415 error without internals), and never ask for more memory
//! than a bound. The seed is fixed so CI runs are repeatable; `PROPTEST_RNG_SEED` explores others.
#![allow(clippy::unwrap_used, unreachable_pub)] // test and bench code: a panic is the failure report

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use gpuhost::audio::{normalize, Source};
use proptest::prelude::*;

/// No single allocation during intake may be larger than this.
const MAX_ALLOCATION: usize = 256 * 1024 * 1024;
const MAX_SECONDS: f64 = 60.0;

/// Records the largest allocation asked for, and refuses (instead of trying) any above the bound,
/// so a violation fails the test instead of exhausting the machine.
struct Watching;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > MAX_ALLOCATION {
            return std::ptr::null_mut();
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        if new_size > MAX_ALLOCATION {
            return std::ptr::null_mut();
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Watching = Watching;

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::Relaxed);
            default(info);
        }));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// Cases run one at a time, so the panic count belongs to the case that is running.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs intake on `bytes` and checks the properties.
fn check(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("audio.wav");
    let panics = PANICS.load(Ordering::Relaxed);
    // No ffmpeg: the fallback is a separate, time-bounded process.
    let result = runtime().block_on(normalize(
        Source::Memory(bytes.into()),
        &out,
        MAX_SECONDS,
        None, // the decoder itself, in this process (the server runs it in a child)
        "",
        &tokio::sync::Semaphore::new(1),
        0,
    ));
    let panicked = PANICS.load(Ordering::Relaxed) != panics;
    prop_assert!(LARGEST.load(Ordering::Relaxed) <= MAX_ALLOCATION);
    if panicked {
        // Caught inside intake: the caller sees an ordinary error that reveals nothing.
        match &result {
            Err(e) => prop_assert!(!e.to_string().contains("panick"), "{}", e),
            Ok(_) => prop_assert!(false, "a decoder panic produced audio"),
        }
    }
    if let Ok(info) = result {
        prop_assert!(info.seconds <= MAX_SECONDS);
        let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        prop_assert!(
            size <= 44 + (MAX_SECONDS as u64 + 1) * 16_000 * 2,
            "{} bytes",
            size
        );
    }
    Ok(())
}

fn wav(fields: (u16, u16, u32, u32, u16, u16), data_len: u32, data: Vec<u8>) -> Vec<u8> {
    let (format, channels, rate, byte_rate, align, bits) = fields;
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(36u32.wrapping_add(data_len)).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt \x10\0\0\0");
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&byte_rate.to_le_bytes());
    out.extend_from_slice(&align.to_le_bytes());
    out.extend_from_slice(&bits.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(&data);
    out
}

/// `fLaC` + a STREAMINFO block with arbitrary fields + arbitrary frame bytes.
fn flac(block: (u16, u16, u32, u32, u32, u8, u8, u64), frames: Vec<u8>) -> Vec<u8> {
    let (min_block, max_block, min_frame, max_frame, rate, channels, bits, total) = block;
    let mut out = b"fLaC".to_vec();
    out.extend_from_slice(&[0x80, 0, 0, 34]); // last metadata block, STREAMINFO, 34 bytes
    out.extend_from_slice(&min_block.to_be_bytes());
    out.extend_from_slice(&max_block.to_be_bytes());
    out.extend_from_slice(&min_frame.to_be_bytes()[1..]);
    out.extend_from_slice(&max_frame.to_be_bytes()[1..]);
    // 20 bits rate, 3 bits channels-1, 5 bits bits-1, 36 bits total samples.
    let packed: u64 = (u64::from(rate & 0xF_FFFF) << 44)
        | (u64::from(channels & 7) << 41)
        | (u64::from(bits & 31) << 36)
        | (total & 0xF_FFFF_FFFF);
    out.extend_from_slice(&packed.to_be_bytes());
    out.extend_from_slice(&[0u8; 16]); // MD5
    out.extend_from_slice(&frames);
    out
}

/// MPEG audio frames: a sync word with arbitrary header bits, repeated with arbitrary payloads.
fn mp3(headers: Vec<(u8, u8, u8)>, payload: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    for (a, b, c) in headers {
        out.extend_from_slice(&[0xFF, 0xE0 | (a & 0x1F), b, c]);
        out.extend_from_slice(&payload);
    }
    out
}

fn field_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(8000),
        Just(16000),
        Just(44100),
        Just(u32::MAX),
        any::<u32>()
    ]
}

fn field_u16() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(0u16),
        Just(1),
        Just(2),
        Just(16),
        Just(u16::MAX),
        any::<u16>()
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(
            std::env::var("PROPTEST_RNG_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x6770_7568),
        ),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        check(bytes)?;
    }

    #[test]
    fn wav_headers(
        fields in (field_u16(), field_u16(), field_u32(), field_u32(), field_u16(), field_u16()),
        data_len in field_u32(),
        data in proptest::collection::vec(any::<u8>(), 0..8192),
    ) {
        check(wav(fields, data_len, data))?;
    }

    #[test]
    fn flac_headers(
        block in (field_u16(), field_u16(), any::<u32>(), any::<u32>(), field_u32(), any::<u8>(), any::<u8>(), any::<u64>()),
        frames in proptest::collection::vec(any::<u8>(), 0..4096),
    ) {
        check(flac(block, frames))?;
    }

    #[test]
    fn mp3_frames(
        headers in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..16),
        payload in proptest::collection::vec(any::<u8>(), 0..1500),
    ) {
        check(mp3(headers, payload))?;
    }
}
