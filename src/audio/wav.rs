//! Writes 16-bit PCM mono WAV files incrementally (through `hound`) and copies uploads that
//! already are in that format.

use std::fs::File;
use std::io::{self, BufWriter, Cursor};
use std::path::Path;

/// The one format every worker reads: PCM, 16 bits, mono, at the target rate.
fn spec(rate: u32) -> hound::WavSpec {
    hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    }
}

fn io_error(e: hound::Error) -> io::Error {
    match e {
        hound::Error::IoError(e) => e,
        other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
    }
}

pub struct WavWriter {
    out: hound::WavWriter<BufWriter<File>>,
    samples: u64,
}

impl WavWriter {
    pub fn create(path: &Path, rate: u32) -> io::Result<WavWriter> {
        let out = hound::WavWriter::create(path, spec(rate)).map_err(io_error)?;
        Ok(WavWriter { out, samples: 0 })
    }

    /// Appends samples in -1..1 (clipped).
    pub fn write(&mut self, samples: &[f32]) -> io::Result<()> {
        let mut block = self.out.get_i16_writer(samples.len() as u32);
        for &s in samples {
            block.write_sample((s.clamp(-1.0, 1.0) * 32767.0).round() as i16);
        }
        block.flush().map_err(io_error)?;
        self.samples += samples.len() as u64;
        Ok(())
    }

    /// Fixes the header sizes; returns the number of samples written.
    pub fn finish(self) -> io::Result<u64> {
        self.out.finalize().map_err(io_error)?;
        Ok(self.samples)
    }
}

/// When `bytes` is a PCM16 mono WAV at `rate`, writes it to `path` with a clean header and
/// returns what it holds; `None` when it needs decoding.
pub(super) fn copy_if_normalized(
    bytes: &[u8],
    path: &Path,
    rate: u32,
) -> io::Result<Option<super::AudioInfo>> {
    let Some(data) = pcm16_mono_data(bytes, rate) else {
        return Ok(None);
    };
    let mut out = Cursor::new(Vec::with_capacity(44 + data.len()));
    {
        let mut writer = hound::WavWriter::new(&mut out, spec(rate)).map_err(io_error)?;
        let mut block = writer.get_i16_writer(data.len() as u32 / 2);
        for pair in data.chunks_exact(2) {
            block.write_sample(i16::from_le_bytes([pair[0], pair[1]]));
        }
        block.flush().map_err(io_error)?;
        writer.finalize().map_err(io_error)?;
    }
    std::fs::write(path, out.into_inner())?;
    Ok(Some(super::AudioInfo {
        seconds: (data.len() / 2) as f64 / f64::from(rate),
        source_rate: Some(rate),
        source_channels: Some(1),
        decoder: "copy",
    }))
}

/// Most chunks walked looking for one (real files have a handful before their data).
pub(super) const MAX_CHUNKS: usize = 10_000;

/// In a RIFF/WAVE file, finds the chunk `id` wherever it is and leaves `file` at its body;
/// returns its declared size. `Ok(None)`: not a RIFF/WAVE file, or no such chunk.
/// `Err(Some(n))`: more than [`MAX_CHUNKS`] chunks before it (`n`); `Err(None)`: unreadable.
pub(super) fn find_chunk(
    mut file: impl io::Read + io::Seek,
    id: &[u8; 4],
) -> Result<Option<u32>, Option<usize>> {
    let mut head = [0u8; 12];
    if file.read_exact(&mut head).is_err() || &head[0..4] != b"RIFF" || &head[8..12] != b"WAVE" {
        return Ok(None);
    }
    for _ in 0..MAX_CHUNKS {
        let mut chunk = [0u8; 8];
        if file.read_exact(&mut chunk).is_err() {
            return Ok(None);
        }
        let size = u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
        if &chunk[0..4] == id {
            return Ok(Some(size));
        }
        let skip = i64::from(size) + i64::from(size & 1);
        file.seek(io::SeekFrom::Current(skip)).map_err(|_| None)?;
    }
    Err(Some(MAX_CHUNKS))
}

/// How many bytes of samples the WAV file at `path` holds: its `data` chunk, as far as the file
/// goes (ffmpeg puts a `LIST` chunk before it, so the header is not always 44 bytes).
pub(super) fn data_bytes(path: &Path) -> io::Result<u64> {
    use io::Seek;
    let len = std::fs::metadata(path)?.len();
    let mut file = io::BufReader::new(File::open(path)?);
    let no_data = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the normalized WAV has no data chunk",
        )
    };
    let size = find_chunk(&mut file, b"data")
        .map_err(|_| no_data())?
        .ok_or_else(no_data)?;
    let body = file.stream_position()?;
    Ok(u64::from(size).min(len.saturating_sub(body)))
}

/// The energy of a 16-bit mono WAV file's samples (sum of squares, full scale 1.0) and how many
/// there are.
pub(super) fn energy(path: &Path) -> io::Result<(f64, u64)> {
    use io::{Read, Seek};
    let len = std::fs::metadata(path)?.len();
    let mut file = io::BufReader::new(File::open(path)?);
    let size = find_chunk(&mut file, b"data")
        .ok()
        .flatten()
        .ok_or_else(|| io::Error::other("no data chunk"))?;
    // The data chunk as far as the file goes (as `data_bytes` counts it), whole samples.
    let body = file.stream_position()?;
    let samples = u64::from(size).min(len.saturating_sub(body)) / 2;
    let (mut sum, mut left, mut buf) = (0f64, samples * 2, vec![0u8; 64 * 1024]);
    while left > 0 {
        let want = buf.len().min(left as usize);
        file.read_exact(&mut buf[..want])?;
        sum += buf[..want]
            .chunks_exact(2)
            .map(|s| (f64::from(i16::from_le_bytes([s[0], s[1]])) / 32768.0).powi(2))
            .sum::<f64>();
        left -= want as u64;
    }
    Ok((sum, samples))
}

/// Whether `bytes` is a RIFF/WAVE file of PCM, 1 channel, `rate` Hz, 16 bits.
pub(super) fn is_normalized(bytes: &[u8], rate: u32) -> bool {
    pcm16_mono_data(bytes, rate).is_some()
}

/// The sample bytes of a RIFF/WAVE file whose format is PCM, 1 channel, `rate` Hz, 16 bits:
/// `hound` reads the header and leaves the cursor at the first sample.
fn pcm16_mono_data(bytes: &[u8], rate: u32) -> Option<&[u8]> {
    let reader = hound::WavReader::new(Cursor::new(bytes)).ok()?;
    let want = spec(rate);
    let got = reader.spec();
    if (
        got.channels,
        got.sample_rate,
        got.bits_per_sample,
        got.sample_format,
    ) != (
        want.channels,
        want.sample_rate,
        want.bits_per_sample,
        want.sample_format,
    ) {
        return None;
    }
    let samples = reader.len() as usize; // as declared by the data chunk
    let start = reader.into_inner().position() as usize;
    let end = start
        .saturating_add(samples.saturating_mul(2))
        .min(bytes.len());
    let data = bytes.get(start..end)?;
    (data.len() >= 2).then(|| &data[..data.len() & !1])
}
