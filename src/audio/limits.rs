//! What intake accepts before it allocates anything: sane declared format fields (rate, channels,
//! bit depth), checked on the raw RIFF header before any decoder sees it and on what the decoder
//! reports, so a hostile header can cost neither memory, CPU nor disk.

use super::AudioError;

/// Lowest accepted sample rate: below it no speech survives, and a tiny file would decode into
/// hours of audio (a 28 KB WAV at 1 Hz is almost 4 hours).
pub(super) const MIN_RATE: u32 = 4_000;
/// Highest accepted sample rate (studio formats top out at 384 kHz).
pub(super) const MAX_RATE: u32 = 384_000;
/// Most channels accepted (they are mixed down to one): what symphonia reads (a WAV's channel
/// mask has bits for 26 positions at most), and past which ffmpeg knows no layout to mix down
/// from (27–32 channels were advertised and refused as undecodable).
pub(super) const MAX_CHANNELS: usize = 26;
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
/// divide by, or allocate by, these fields), wherever in the file it is. Other containers, and
/// a WAV without one (the decoder fails it), pass through.
pub(super) fn check_riff_header(
    mut file: impl std::io::Read + std::io::Seek,
) -> Result<(), AudioError> {
    match super::wav::find_chunk(&mut file, b"fmt ") {
        Ok(Some(_)) => {}
        Ok(None) | Err(None) => return Ok(()),
        Err(Some(max)) => {
            return Err(AudioError::BadFormat(format!(
                "the WAV file has more than {max} chunks before its format chunk"
            )))
        }
    }
    let mut fmt = [0u8; 16];
    if file.read_exact(&mut fmt).is_err() {
        return Err(AudioError::BadFormat(
            "the WAV format chunk is truncated".into(),
        ));
    }
    let u16_at = |i: usize| u16::from_le_bytes([fmt[i], fmt[i + 1]]);
    let rate = u32::from_le_bytes([fmt[4], fmt[5], fmt[6], fmt[7]]);
    let (tag, channels, align, bits) = (u16_at(0), u16_at(2), u16_at(12), u16_at(14));
    check_format(rate, usize::from(channels), Some(u32::from(bits)))?;
    if align == 0 {
        return Err(AudioError::BadFormat(
            "the WAV header declares a block alignment of 0".into(),
        ));
    }
    // Samples a frame at a time (PCM, float, A-law, µ-law, and the extensible form of them):
    // a frame is the channels' samples side by side. A decoder that trusts another alignment
    // reads the audio in wrong steps (half of it lost, without a word); compressed formats
    // (ADPCM) use the field for their block size.
    let framed = matches!(tag, 0x0001 | 0x0003 | 0x0006 | 0x0007 | 0xFFFE);
    let frame = u32::from(channels) * u32::from(bits).div_ceil(8);
    if framed && u32::from(align) != frame {
        return Err(AudioError::BadFormat(format!(
            "the WAV header is damaged: it declares a block alignment of {align} bytes where \
             {channels} channel(s) of {bits} bits take {frame}; export the file again"
        )));
    }
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

    fn check(bytes: &[u8]) -> Result<(), AudioError> {
        check_riff_header(std::io::Cursor::new(bytes))
    }

    #[test]
    fn hostile_headers_are_refused() {
        assert!(check(&wav_header(16_000, 1, 16, 2)).is_ok());
        assert!(check(&wav_header(44_100, 2, 24, 6)).is_ok());
        for (rate, ch, bits, align) in [
            (0, 1, 16, 2),
            (1, 1, 16, 2),
            (u32::MAX - 7, 1, 16, 2),
            (5_000_000, 1, 16, 2),
            (16_000, 0, 16, 2),
            (16_000, 65_535, 16, 2),
            (16_000, 1, 0, 2),
            (16_000, 1, 16, 0),
            // A block alignment that is not one frame: the decoder read half the audio.
            (16_000, 1, 16, 4),
            (16_000, 2, 16, 7),
            // More channels than there is a layout to mix down from.
            (8_000, 27, 16, 54),
        ] {
            let err = check(&wav_header(rate, ch, bits, align)).unwrap_err();
            assert!(
                matches!(err, AudioError::BadFormat(_)),
                "{rate} {ch} {bits}"
            );
        }
        assert!(check(b"fLaC\0\0\0\x22").is_ok());
        // 12 bits in 16, and 26 channels: fine. ADPCM's alignment is its block size.
        assert!(check(&wav_header(16_000, 2, 12, 4)).is_ok());
        assert!(check(&wav_header(8_000, 26, 16, 52)).is_ok());
        let mut adpcm = wav_header(8_000, 1, 4, 256);
        adpcm[20] = 0x11;
        assert!(check(&adpcm).is_ok());
    }

    #[test]
    fn a_format_chunk_far_into_the_file_is_checked_too() {
        // 70 KB of padding before a format chunk that declares 1 Hz.
        let mut file = b"RIFF\0\0\0\0WAVEJUNK".to_vec();
        file.extend_from_slice(&70_000u32.to_le_bytes());
        file.extend_from_slice(&[0; 70_000]);
        file.extend_from_slice(&wav_header(1, 1, 16, 2)[12..]);
        let err = check(&file).unwrap_err();
        assert!(err.to_string().contains("1 Hz"), "{err}");
        // Endless tiny chunks are not walked without end.
        let mut file = b"RIFF\0\0\0\0WAVE".to_vec();
        for _ in 0..=super::super::wav::MAX_CHUNKS {
            file.extend_from_slice(b"JUNK\0\0\0\0");
        }
        assert!(matches!(check(&file), Err(AudioError::BadFormat(_))));
    }
}
