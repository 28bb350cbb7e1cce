//! The symphonia decoder (WAV, FLAC, MP3, OGG/Vorbis, M4A/AAC, MP4 audio), streamed through the
//! downmix and resampler into the WAV writer; `ffmpeg.rs` decodes the rest.

use std::path::Path;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use super::{limits, AudioError, AudioInfo, Resampler, Source, WavWriter, TARGET_RATE};

pub(super) fn decode_with_symphonia(
    input: &Source,
    output: &Path,
    max_seconds: f64,
    abandoned: &std::sync::atomic::AtomicBool,
) -> Result<AudioInfo, AudioError> {
    let undecodable = |what: &str, e: SymError| AudioError::Undecodable(format!("{what}: {e}"));
    let source = MediaSourceStream::new(input.open()?, Default::default());
    let probed = symphonia::default::get_probe()
        .format(
            &Hint::new(),
            source,
            // Not gapless: symphonia's gapless MP3 reading cuts a file to its first Xing frame
            // count, which loses all but the first part of joined MP3s (`cat a.mp3 b.mp3`). The
            // encoder's delay is dropped below instead.
            &FormatOptions::default(),
            &MetadataOptions::default(),
        )
        .map_err(|e| undecodable("unrecognized container format", e))?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL && t.codec_params.sample_rate.is_some())
        .ok_or_else(|| AudioError::Undecodable("the file has no audio track".into()))?;
    let track_id = track.id;
    let params = &track.codec_params;
    limits::check_format(
        params.sample_rate.unwrap_or(TARGET_RATE),
        params.channels.map_or(1, |c| c.count()),
        params.bits_per_sample.or(params.bits_per_coded_sample),
    )?;
    if let (Some(frames), Some(rate)) =
        (track.codec_params.n_frames, track.codec_params.sample_rate)
    {
        let seconds = frames as f64 / f64::from(rate);
        // A length no codec could fit in the file is a header that does not know it (a WAV
        // streamed through a pipe says 0xFFFFFFFF bytes) or lies: the check while decoding
        // judges those. 256 bytes a second is below every codec symphonia reads.
        let plausible = input.len()? as f64 >= seconds * 256.0;
        if plausible && seconds > max_seconds {
            return Err(AudioError::TooLong {
                seconds,
                max: max_seconds,
            });
        }
    }
    // Samples the encoder put before the audio (MP3's LAME tag: 1105 at 44.1 kHz with the
    // decoder's own), dropped as ffmpeg drops them: kept, every time in the transcript came late
    // by them. An MP4's AAC priming (1024–2112 samples) is in its edit list, which symphonia
    // does not read (`mp4.rs`). At most a second: no encoder delays more, and a header may lie.
    let rate = params.sample_rate.unwrap_or(TARGET_RATE);
    let delay = params.delay.or_else(|| {
        let seconds = super::mp4::priming_seconds(&mut input.reader().ok()?)?;
        Some((seconds * f64::from(rate)).round() as u32)
    });
    let mut skip = delay.map_or(0, |d| d.min(rate) as usize);
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| undecodable("unsupported codec", e))?;

    let mut writer = WavWriter::create(output, TARGET_RATE)?;
    let mut resampler: Option<(Resampler, u32, usize)> = None;
    let (mut mono, mut out) = (Vec::new(), Vec::new());
    let mut source_frames = 0u64;
    let mut decode_errors = 0usize;
    loop {
        if abandoned.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(AudioError::Io(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "the request was given up while its audio was decoded",
            )));
        }
        let packet = match format.next_packet() {
            Ok(packet) => packet,
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(SymError::ResetRequired) => break,
            Err(e) if source_frames == 0 => return Err(undecodable("cannot read audio data", e)),
            Err(_) => break, // a truncated tail: keep what was decoded
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(decoded) => decoded,
            Err(SymError::DecodeError(_)) => {
                decode_errors += 1;
                continue;
            }
            Err(e) => return Err(undecodable("decoding failed", e)),
        };
        let spec = *decoded.spec();
        let channels = spec.channels.count();
        limits::check_format(spec.rate, channels, None)?;
        let (resampler, _, _) = resampler
            .get_or_insert_with(|| (Resampler::new(spec.rate, TARGET_RATE), spec.rate, channels));
        let mut buf = SampleBuffer::<f32>::new(decoded.capacity() as u64, spec);
        buf.copy_interleaved_ref(decoded);
        mono.clear();
        super::downmix::downmix(buf.samples(), channels, &mut mono);
        if skip > 0 {
            let dropped = skip.min(mono.len());
            mono.drain(..dropped);
            skip -= dropped;
        }
        source_frames += mono.len() as u64;
        let seconds = source_frames as f64 / f64::from(spec.rate);
        if seconds > max_seconds {
            return Err(AudioError::TooLong {
                seconds,
                max: max_seconds,
            });
        }
        out.clear();
        resampler.push(&mono, &mut out);
        writer.write(&out)?;
    }
    let Some((mut resampler, rate, channels)) = resampler else {
        // A valid file of no samples (a 44-byte WAV) is no corrupt one.
        return Err(AudioError::Undecodable(if decode_errors == 0 {
            "the audio track is empty (no samples)".into()
        } else {
            format!("no audio could be decoded ({decode_errors} corrupt packets)")
        }));
    };
    out.clear();
    resampler.finish(&mut out);
    writer.write(&out)?;
    writer.finish()?;
    if source_frames == 0 {
        return Err(AudioError::Undecodable("the audio track is empty".into()));
    }
    Ok(AudioInfo {
        seconds: source_frames as f64 / f64::from(rate),
        source_rate: Some(rate),
        source_channels: Some(channels),
        decoder: "symphonia",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/audio")
            .join(name)
    }

    /// Decodes `source`; the normalized samples.
    fn decoded(source: Source) -> (AudioInfo, Vec<i16>) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("audio.wav");
        let never = std::sync::atomic::AtomicBool::new(false);
        let info = decode_with_symphonia(&source, &out, 3600.0, &never).unwrap();
        let samples = hound::WavReader::open(&out)
            .unwrap()
            .samples::<i16>()
            .map(Result::unwrap)
            .collect();
        (info, samples)
    }

    #[test]
    fn an_mp3s_encoder_delay_is_dropped_and_joined_mp3s_are_decoded_whole() {
        // The fixture's tone starts with its first sample (ffmpeg: loud from sample 3).
        let (_, samples) = decoded(Source::File(fixture("tone.mp3")));
        let first = samples.iter().position(|s| s.abs() > 1000).unwrap();
        // The LAME tag's 1105 samples at 44.1 kHz are 400 at 16 kHz: once every time came
        // that much late.
        assert!(first < 40, "the tone starts at sample {first}");
        // Two MP3s joined (`cat a.mp3 b.mp3`): both decoded, not cut at the first one's frame
        // count (which symphonia's gapless reading did).
        let one = std::fs::read(fixture("tone.mp3")).unwrap();
        let joined = [one.as_slice(), one.as_slice()].concat();
        let (info, _) = decoded(Source::Memory(joined.into()));
        assert!(info.seconds > 3.0, "{}", info.seconds);
    }

    #[test]
    fn an_aac_tracks_priming_is_dropped() {
        // ffmpeg's AAC encoder primes 1024 samples (48 kHz: 341 at 16 kHz), said only in the
        // MP4 edit list; they were kept, and every time came 21 ms late.
        for name in ["tone.m4a", "tone.mp4"] {
            let (_, samples) = decoded(Source::File(fixture(name)));
            let first = samples.iter().position(|s| s.abs() > 1000).unwrap();
            assert!(first < 40, "{name}: the tone starts at sample {first}");
        }
    }
}
