//! Downmix of interleaved frames to mono: the mean of the channels, unless the channels cancel
//! out (one of them phase-inverted, a common mastering or cabling fault), where the mean is
//! silence and the first channel carries the speech. The same rule decides for ffmpeg's output
//! (`decode.rs`), which downmixes itself.

/// Below this fraction of the channels' mean energy the mean has cancelled out (−20 dB: two
/// uncorrelated channels keep half, two equal ones all of it).
const CANCELLED: f32 = 0.01;

/// Appends the mono version of `samples` (interleaved, `channels` per frame) to `out`.
pub(super) fn downmix(samples: &[f32], channels: usize, out: &mut Vec<f32>) {
    let start = out.len();
    out.extend(
        samples
            .chunks(channels)
            .map(|f| f.iter().sum::<f32>() / channels as f32),
    );
    if channels < 2 {
        return;
    }
    let mono: f32 = out[start..].iter().map(|x| x * x).sum();
    let each: f32 = samples.iter().map(|x| x * x).sum::<f32>() / channels as f32;
    let frames = samples.len() / channels;
    if cancelled(f64::from(mono), f64::from(each), frames as u64) {
        out.truncate(start);
        out.extend(samples.chunks(channels).map(|f| f[0]));
    }
}

/// Whether a downmix with energy `mono` (sum of squares, full scale 1.0) over `frames` has
/// cancelled out, against `each`, the energy of a channel (their mean where all are known).
pub(super) fn cancelled(mono: f64, each: f64, frames: u64) -> bool {
    // Tiny energies (digital silence, dither) decide nothing.
    each / frames.max(1) as f64 > 1e-8 && mono < f64::from(CANCELLED) * each
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(n: usize) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.05).sin() * 0.3).collect()
    }

    #[test]
    fn channels_that_cancel_give_the_first_channel_not_silence() {
        let left = tone(1000);
        let inverted: Vec<f32> = left.iter().flat_map(|&x| [x, -x]).collect();
        let mut out = Vec::new();
        downmix(&inverted, 2, &mut out);
        assert_eq!(out, left);
        // Equal channels, and unrelated ones, keep the mean.
        let equal: Vec<f32> = left.iter().flat_map(|&x| [x, x]).collect();
        let mut out = vec![9.0];
        downmix(&equal, 2, &mut out);
        assert_eq!(&out[1..], &left[..]);
        let one_side: Vec<f32> = left.iter().flat_map(|&x| [x, 0.0]).collect();
        let mut out = Vec::new();
        downmix(&one_side, 2, &mut out);
        assert_eq!(out, left.iter().map(|x| x / 2.0).collect::<Vec<_>>());
        // Silence stays silence.
        let mut out = Vec::new();
        downmix(&[0.0; 64], 2, &mut out);
        assert_eq!(out, vec![0.0; 32]);
    }
}
