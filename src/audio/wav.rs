//! Writes 16-bit PCM mono WAV files incrementally and reads their length back.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

pub struct WavWriter {
    out: BufWriter<File>,
    rate: u32,
    samples: u64,
}

impl WavWriter {
    pub fn create(path: &Path, rate: u32) -> io::Result<WavWriter> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(&header(rate, 0))?;
        Ok(WavWriter {
            out,
            rate,
            samples: 0,
        })
    }

    /// Appends samples in -1..1 (clipped).
    pub fn write(&mut self, samples: &[f32]) -> io::Result<()> {
        for &s in samples {
            let v = (s.clamp(-1.0, 1.0) * 32767.0).round() as i16;
            self.out.write_all(&v.to_le_bytes())?;
        }
        self.samples += samples.len() as u64;
        Ok(())
    }

    /// Fixes the header sizes; returns the number of samples written.
    pub fn finish(mut self) -> io::Result<u64> {
        let data_bytes = u32::try_from(self.samples * 2).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "audio too long for a WAV file")
        })?;
        self.out.seek(SeekFrom::Start(0))?;
        self.out.write_all(&header(self.rate, data_bytes))?;
        self.out.flush()?;
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
    let mut out = Vec::with_capacity(44 + data.len());
    out.extend_from_slice(&header(rate, data.len() as u32));
    out.extend_from_slice(data);
    std::fs::write(path, out)?;
    Ok(Some(super::AudioInfo {
        seconds: (data.len() / 2) as f64 / f64::from(rate),
        source_rate: rate,
        source_channels: 1,
        decoder: "copy",
    }))
}

/// The sample bytes of a RIFF/WAVE file whose format is PCM, 1 channel, `rate` Hz, 16 bits.
fn pcm16_mono_data(bytes: &[u8], rate: u32) -> Option<&[u8]> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return None;
    }
    let u16_at = |i: usize| Some(u16::from_le_bytes(bytes.get(i..i + 2)?.try_into().ok()?));
    let u32_at = |i: usize| Some(u32::from_le_bytes(bytes.get(i..i + 4)?.try_into().ok()?));
    let mut pos = 12;
    let mut format_ok = false;
    while pos + 8 <= bytes.len() {
        let id = &bytes[pos..pos + 4];
        let size = u32_at(pos + 4)? as usize;
        let body = pos + 8;
        match id {
            b"fmt " => {
                format_ok = u16_at(body)? == 1
                    && u16_at(body + 2)? == 1
                    && u32_at(body + 4)? == rate
                    && u16_at(body + 14)? == 16;
                if !format_ok {
                    return None;
                }
            }
            b"data" if format_ok => {
                let end = body.checked_add(size)?;
                let data = bytes.get(body..end.min(bytes.len()))?;
                return (data.len() >= 2).then(|| &data[..data.len() & !1]);
            }
            _ => {}
        }
        pos = body.checked_add(size + (size & 1))?;
    }
    None
}

fn header(rate: u32, data_bytes: u32) -> [u8; 44] {
    let mut h = [0u8; 44];
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&(36 + data_bytes).to_le_bytes());
    h[8..12].copy_from_slice(b"WAVE");
    h[12..16].copy_from_slice(b"fmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes());
    h[20..22].copy_from_slice(&1u16.to_le_bytes()); // PCM
    h[22..24].copy_from_slice(&1u16.to_le_bytes()); // mono
    h[24..28].copy_from_slice(&rate.to_le_bytes());
    h[28..32].copy_from_slice(&(rate * 2).to_le_bytes());
    h[32..34].copy_from_slice(&2u16.to_le_bytes());
    h[34..36].copy_from_slice(&16u16.to_le_bytes());
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&data_bytes.to_le_bytes());
    h
}
