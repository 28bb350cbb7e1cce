//! What intake accepts before it allocates anything: sane declared format fields (rate, channels,
//! bit depth), checked on the raw RIFF header before any decoder sees it and on what the decoder
//! reports, so a hostile header can cost neither memory, CPU nor disk.

use super::AudioError;

/// Lowest accepted sample rate: below it no speech survives, and a tiny file would decode into
/// hours of audio (a 28 KB WAV at 1 Hz is almost 4 hours).
pub(super) const MIN_RATE: u32 = 4_000;
/// Highest accepted sample rate (studio formats top out at 384 kHz).
pub(super) const MAX_RATE: u32 = 384_000;
/// Most channels accepted (they are mixed down to one).
pub(super) const MAX_CHANNELS: usize = 32;
/// Deepest accepted sample format.
pub(super) const MAX_BITS: u32 = 64;

/// Checks the fields a decoder will size its buffers by.
pub(crate) fn check_format(
    rate: u32,
    channels: usize,
    bits: Option<u32>,
) -> Result<(), AudioError> {
    if !(MIN_RATE..=MAX_RATE).contains(&rate) {
        return Err(AudioError::BadFormat(format!(
            "the audio declares a sample rate of {rate} Hz; accepted: {MIN_RATE}–{MAX_RATE} Hz"
        )));
    }
    if channels == 0 || channels > MAX_CHANNELS {
        return Err(AudioError::BadFormat(format!(
            "the audio declares {channels} channels; accepted: 1–{MAX_CHANNELS}"
        )));
    }
    if let Some(bits) = bits {
        if bits == 0 || bits > MAX_BITS {
            return Err(AudioError::BadFormat(format!(
                "the audio declares {bits} bits per sample; accepted: 1–{MAX_BITS}"
            )));
        }
    }
    Ok(())
}

/// For a RIFF/WAVE file: checks its `fmt ` chunk before any decoder parses it (some decoders
/// divide by, or allocate by, these fields). Other containers pass through.
pub(super) fn check_riff_header(head: &[u8]) -> Result<(), AudioError> {
    if head.len() < 12 || &head[0..4] != b"RIFF" || &head[8..12] != b"WAVE" {
        return Ok(());
    }
    let u16_at = |i: usize| head.get(i..i + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |i: usize| {
        head.get(i..i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut pos = 12usize;
    while let (Some(id), Some(size)) = (head.get(pos..pos + 4), u32_at(pos + 4)) {
        let body = pos + 8;
        if id == b"fmt " {
            let (Some(channels), Some(rate), Some(block_align), Some(bits)) = (
                u16_at(body + 2),
                u32_at(body + 4),
                u16_at(body + 12),
                u16_at(body + 14),
            ) else {
                return Err(AudioError::BadFormat(
                    "the WAV format chunk is truncated".into(),
                ));
            };
            check_format(rate, usize::from(channels), Some(u32::from(bits)))?;
            if block_align == 0 {
                return Err(AudioError::BadFormat(
                    "the WAV header declares a block alignment of 0".into(),
                ));
            }
            return Ok(());
        }
        let Some(next) = body.checked_add(size as usize + (size as usize & 1)) else {
            break;
        };
        pos = next;
    }
    // No format chunk within the first bytes: let the decoder judge (and fail) the file.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav_header(rate: u32, channels: u16, bits: u16, align: u16) -> Vec<u8> {
        let mut h = b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0".to_vec();
        h.extend_from_slice(&channels.to_le_bytes());
        h.extend_from_slice(&rate.to_le_bytes());
        h.extend_from_slice(&(rate.wrapping_mul(u32::from(align))).to_le_bytes());
        h.extend_from_slice(&align.to_le_bytes());
        h.extend_from_slice(&bits.to_le_bytes());
        h.extend_from_slice(b"data\0\0\0\0");
        h
    }

    #[test]
    fn hostile_headers_are_refused() {
        assert!(check_riff_header(&wav_header(16_000, 1, 16, 2)).is_ok());
        assert!(check_riff_header(&wav_header(44_100, 2, 24, 6)).is_ok());
        for (rate, ch, bits, align) in [
            (0, 1, 16, 2),
            (1, 1, 16, 2),
            (u32::MAX - 7, 1, 16, 2),
            (5_000_000, 1, 16, 2),
            (16_000, 0, 16, 2),
            (16_000, 65_535, 16, 2),
            (16_000, 1, 0, 2),
            (16_000, 1, 16, 0),
        ] {
            let err = check_riff_header(&wav_header(rate, ch, bits, align)).unwrap_err();
            assert!(
                matches!(err, AudioError::BadFormat(_)),
                "{rate} {ch} {bits}"
            );
        }
        assert!(check_riff_header(b"fLaC\0\0\0\x22").is_ok());
    }
}
